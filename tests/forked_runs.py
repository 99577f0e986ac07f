"""Runs `python3 -m bert_pretrain.run_pretraining FLAGS...` many times for the price of
one import: this process imports the command once, then forks a child per request, which
runs it as the command line would (absl's app.run), its stdout and stderr going to the
files the request names. The tests' single-process runs go this way
(conftest.run_pretraining): each run as its own process spent about half its CPU time
importing TensorFlow.

Protocol, one JSON object a line: on stdin {"argv": [flags], "stdout": path, "stderr":
path, "cwd": path, "timeout": seconds}; on stdout {"returncode": int} once the child has
exited (-SIGALRM when it ran out of time).
"""

import atexit
import json
import os
import random
import signal
import sys

from absl import app
import numpy as np

from bert_pretrain import run_pretraining


def child(request):
  """In the forked child: the command as `python3 -m` runs it (absl's app.run on
  request["argv"]); never returns."""
  signal.alarm(request["timeout"])
  os.chdir(request["cwd"])
  # A new process draws fresh seeds; a forked one would repeat its parent's.
  random.seed()
  np.random.seed()
  with open(os.devnull) as f:
    os.dup2(f.fileno(), 0)
  for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
    with open(path, "w") as f:
      os.dup2(f.fileno(), fd)
  status = 1
  try:
    argv = ["run_pretraining"] + request["argv"]
    run_pretraining.enable_cpu_xla(argv)
    app.run(lambda argv: sys.exit(run_pretraining.main(argv)), argv=argv)
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      status = e.code or 0
    else:
      sys.stderr.write("%s\n" % e.code)  # as Python prints sys.exit's message
  except BaseException:  # pylint: disable=broad-except
    import traceback  # pylint: disable=g-import-not-at-top
    traceback.print_exc()
  finally:
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # pylint: disable=protected-access


def serve():
  for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
      child(request)
    _, status = os.waitpid(pid, 0)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    sys.stdout.write(json.dumps({"returncode": code}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
  serve()
