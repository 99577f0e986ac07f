"""Loaded by each new Python interpreter whose PYTHONPATH holds this folder
(conftest.forking_env). Where FORKED_RUNS_SOCKET is set too and the interpreter was started
as `python3 -m MODULE ...` of a command in forked_runs.FORKABLE, this process becomes a
client of that worker's server (tests/forked_runs.py --rank): the server forks the command
from a process that imported TensorFlow once. Where it refuses, the command runs here as it
would have. Any other interpreter starts as usual (one of another bert_pretrain module
imports tests/forked_runs.py to look at FORKABLE)."""

import os
import sys


def _command_line():
  """This process's command line as it was started: python3, its options, -m, ..."""
  if hasattr(sys, "orig_argv"):  # Python 3.10+
    return list(sys.orig_argv)
  with open("/proc/self/cmdline", "rb") as f:
    return [os.fsdecode(word) for word in f.read().split(b"\0")[:-1]]


def _hand_over():
  socket_path = os.environ.get("FORKED_RUNS_SOCKET")
  if not socket_path:
    return
  words = _command_line()
  if len(words) < 3 or words[1] != "-m" or not words[2].startswith("bert_pretrain."):
    return
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    import forked_runs  # pylint: disable=g-import-not-at-top  (tests/, only when it is used)
  finally:
    del sys.path[0]
  if words[2] in forked_runs.FORKABLE:
    try:
      forked_runs.rank_client(socket_path, [sys.executable] + words[1:])
    except SystemExit as e:  # out of site's import it would be a fatal error
      os._exit(e.code)  # pylint: disable=protected-access
    except BaseException:  # pylint: disable=broad-except
      # site would print it and run the command here too, beside the forked one.
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
      os._exit(1)  # pylint: disable=protected-access


_hand_over()
