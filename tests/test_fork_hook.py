"""tests/fork_hook: a new `python3 -m` of a command in forked_runs.FORKABLE started with
conftest.forking_env forks from the worker's server; one that could tell the difference
runs itself, and ends the same way."""

import json
import os
import subprocess
import sys

from conftest import ROOT, forking_env


def _run(module, tmp_path, **env):
  """python3 -m `module` --input=<a path that is not there>, with forking_env and `env`."""
  values = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
                FORKED_RUNS_LOG=str(tmp_path / "log"))
  values.update(env)
  return subprocess.run(
      [sys.executable, "-m", module, "--input=%s" % (tmp_path / "none")],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300,
      env=forking_env(values))


def test_a_forkable_command_forks_and_one_in_another_environment_runs_itself(tmp_path):
  forked = _run("bert_pretrain.inspect_records", tmp_path)
  itself = _run("bert_pretrain.inspect_records", tmp_path, TF_CPP_MIN_LOG_LEVEL="3")
  line = ("inspect_tfrecords: error: --input=%s does not exist; pass the folder that holds "
          "the TFRecord files\n" % (tmp_path / "none"))
  replies = [json.loads(line)["reply"]
             for line in (tmp_path / "log").read_text().splitlines()]
  assert [sorted(r) for r in replies] == [["pid"], ["refused"]], replies
  assert replies[1]["refused"] == "environment: TF_CPP_MIN_LOG_LEVEL"
  for result in (forked, itself):
    assert (result.returncode, result.stdout, result.stderr) == (2, "", line)
