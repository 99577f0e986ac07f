"""The suite's own harness (conftest.py): a variable a test sets in-process, as importing
torch does, is gone by the next test, whose runs fork from the worker's server again."""

import os

import pytest

import conftest

VARIABLE = "BERT_PRETRAIN_TEST_SET_IN_PROCESS"
_SET_BY_THE_TEST_BEFORE = []


def test_what_a_block_sets_changes_or_removes_in_the_environment_is_put_back_after_it():
  name = min(n for n in os.environ if n != "PYTEST_CURRENT_TEST")
  value = os.environ[name]
  with conftest.environment_kept():
    os.environ[VARIABLE] = "1"
    os.environ[name] = value + "-changed"
    del os.environ["PATH"]
    assert conftest._command_env() != conftest._SESSION_ENV[0]  # pylint: disable=protected-access
  assert VARIABLE not in os.environ and os.environ[name] == value and "PATH" in os.environ
  assert conftest._command_env() == conftest._SESSION_ENV[0]  # pylint: disable=protected-access


def test_a_variable_set_in_process_stops_the_runs_forking_while_its_test_lasts():
  os.environ[VARIABLE] = "1"
  _SET_BY_THE_TEST_BEFORE.append(True)
  assert conftest._command_env() != conftest._SESSION_ENV[0]  # pylint: disable=protected-access


def test_the_next_test_finds_the_environment_as_the_session_started_so_its_runs_fork():
  if not _SET_BY_THE_TEST_BEFORE:
    pytest.skip("checks what the test before it left: run the file, not this test alone")
  assert VARIABLE not in os.environ
  assert conftest._command_env() == conftest._SESSION_ENV[0]  # pylint: disable=protected-access
