"""The suite's own harness (conftest.py): a variable a test sets in-process, as importing
torch does, is gone by the next test, whose runs fork from the worker's server again.
The two tests run in this order on one worker (--dist loadfile)."""

import os

import conftest

VARIABLE = "BERT_PRETRAIN_TEST_SET_IN_PROCESS"


def test_a_variable_set_in_process_stops_the_runs_forking_while_its_test_lasts():
  os.environ[VARIABLE] = "1"
  assert conftest._command_env() != conftest._SESSION_ENV[0]  # pylint: disable=protected-access


def test_the_next_test_finds_the_environment_as_the_session_started_so_its_runs_fork():
  assert VARIABLE not in os.environ
  assert conftest._command_env() == conftest._SESSION_ENV[0]  # pylint: disable=protected-access
