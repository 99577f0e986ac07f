"""Runs `python3 -m bert_pretrain.run_pretraining FLAGS...` many times for the price of
one import: this process imports the command once, then forks a child per request, which
parses its flags and runs main() as the command line would, its stdout and stderr going
to the files the request names. The tests of bad inputs run this way (each run of the
command spends most of its time importing TensorFlow before it finds the flag wrong).

Protocol, one JSON object a line: on stdin {"argv": [flags], "stdout": path, "stderr":
path}; on stdout {"returncode": int} once the child has exited.
"""

import json
import os
import sys

from absl import flags

from bert_pretrain import run_pretraining


def child(argv, stdout_path, stderr_path):
  """In the forked child: the command's main on `argv`, as `python3 -m` runs it; never
  returns."""
  for fd, path in ((1, stdout_path), (2, stderr_path)):
    with open(path, "w") as f:
      os.dup2(f.fileno(), fd)
  status = 1
  try:
    argv = ["run_pretraining"] + argv
    run_pretraining.enable_cpu_xla(argv)
    try:
      argv = flags.FLAGS(argv)
    except flags.Error as e:
      # What absl's app.run prints for a flag it cannot parse.
      sys.stderr.write("FATAL Flags parsing error: %s\n" % e)
    else:
      status = run_pretraining.main(argv)
  except SystemExit as e:
    status = e.code if isinstance(e.code, int) else 1
  except BaseException:  # pylint: disable=broad-except
    import traceback  # pylint: disable=g-import-not-at-top
    traceback.print_exc()
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status or 0)  # pylint: disable=protected-access


def serve():
  for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
      child(request["argv"], request["stdout"], request["stderr"])
    _, status = os.waitpid(pid, 0)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    sys.stdout.write(json.dumps({"returncode": code}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
  serve()
