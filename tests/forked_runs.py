"""Runs `python3 -m MODULE FLAGS...` many times for the price of one import: this process
imports what MODULE imports at its top once (TensorFlow, for the commands that import it
there), then forks a child per request, which runs MODULE as `python3 -m` does (runpy, as
__main__), its stdout and stderr going to the files the request names. The tests'
single-process runs of the commands go this way (conftest.run_command): each run as its
own process spent about half its CPU time importing TensorFlow.

Usage: python3 tests/forked_runs.py MODULE. Protocol, one JSON object a line: on stdin
{"argv": [flags], "stdout": path, "stderr": path, "cwd": path, "timeout": seconds} (the
same path twice: stderr into stdout); on stdout {"pid": int} once the child is forked (a
test may signal it), then {"returncode": int} once it has exited (-SIGALRM when it ran out
of time, -N when signal N ended it).
"""

import ast
import atexit
import importlib
import importlib.util
import json
import os
import random
import runpy
import signal
import sys

import numpy as np


def import_what_it_imports(module):
  """Imports the modules `module`'s top level imports, not `module` itself: run as
  __main__ it defines its flags again, which absl refuses for flags defined already."""
  spec = importlib.util.find_spec(module)
  path = spec.origin
  if spec.submodule_search_locations:  # a package: `python3 -m` runs its __main__
    path = importlib.util.find_spec(module + ".__main__").origin
  with open(path) as f:
    tree = ast.parse(f.read())
  for node in tree.body:
    if isinstance(node, ast.Import):
      for alias in node.names:
        importlib.import_module(alias.name)
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      parent = importlib.import_module(node.module)
      for alias in node.names:
        if not hasattr(parent, alias.name):  # a submodule not imported by its package
          importlib.import_module(node.module + "." + alias.name)


def child(module, request):
  """In the forked child: `python3 -m module *request["argv"]`; never returns."""
  signal.alarm(request["timeout"])
  os.chdir(request["cwd"])
  # A new process draws fresh seeds; a forked one would repeat its parent's.
  random.seed()
  np.random.seed()
  with open(os.devnull) as f:
    os.dup2(f.fileno(), 0)
  for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
    if fd == 2 and path == request["stdout"]:
      os.dup2(1, 2)
      continue
    with open(path, "w") as f:
      os.dup2(f.fileno(), fd)
  status = 1
  sys.path[0] = os.getcwd()  # as -m has it, where this script's folder was
  try:
    sys.argv = [module] + request["argv"]  # runpy puts the file's path first, as -m does
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    status = 0
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


def serve(module):
  import_what_it_imports(module)
  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()  # or the children would write what is buffered again
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      child(module, request)
    sys.stdout.write(json.dumps({"pid": pid}) + "\n")
    sys.stdout.flush()
    _, status = os.waitpid(pid, 0)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    sys.stdout.write(json.dumps({"returncode": code}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
  serve(sys.argv[1])
