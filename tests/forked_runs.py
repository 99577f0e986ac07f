"""Runs `python3 -m MODULE FLAGS...` many times for the price of one import: this process
imports what MODULE imports at its top once (TensorFlow, for the commands that import it
there), then forks a child per request, which runs MODULE as `python3 -m` does (runpy, as
__main__). The tests' single-process runs of the commands go this way
(conftest.run_command), and so do the processes of their jobs on this host
(conftest.rank_command): each as its own process spent about half its CPU time importing
TensorFlow.

Server: python3 tests/forked_runs.py MODULE [SOCKET]. Protocol on stdin and stdout, one
JSON object a line: in, {"argv": [flags], "stdout": path, "stderr": path, "cwd": path,
"timeout": seconds} (the same path twice: stderr into stdout); out, {"pid": int} once the
child is forked (a test may signal it), then {"returncode": int} once it has exited
(-SIGALRM when it ran out of time, -N when signal N ended it). One such run at a time.

Ranks: with SOCKET, the server also takes runs from clients, any number at once:
`python3 tests/forked_runs.py --rank SOCKET python3 -m MODULE FLAGS...` is what a job's
launcher (horovodrun, mpirun, a test) starts. The client hands the server its stdin,
stdout, stderr, environment and folder, passes on the signals it gets to the child,
writes the child's pid to SOCKET-<its pid>.pid (for the tests that stop or kill a rank:
conftest.rank_pid) and exits as the child did; the server SIGKILLs the child when the
client has gone. Where the child could tell the difference (another Python or command,
--use_xla, or an environment that differs in what Python or TensorFlow read when they
start), the client runs the command itself. The commands of FORKABLE are taken too.

Any new `python3 -m` of them becomes such a client where the test gave it
conftest.forking_env (tests/fork_hook/sitecustomize.py): the runs of the scripts and tools
the tests start.
"""

import array
import ast
import atexit
import ctypes
import importlib
import importlib.util
import io
import json
import os
import random
import runpy
import select
import signal
import socket
import sys

# What Python and TensorFlow read from the environment as they start or import: a rank
# whose environment differs in these from the server's is not forked.
_READ_AT_START = ("PYTHON", "TF_", "CUDA", "OMP_", "KMP_", "MKL", "ONEDNN", "DNNL", "XLA",
                  "LD_")
_READ_LATER = ("TF_CONFIG", "PYTHONUNBUFFERED")  # read as the run goes: it may differ
_PR_SET_PDEATHSIG = 1  # prctl's option: the signal this process gets when its parent ends
# Looked up before any fork: a dlopen in a child of a process with TensorFlow's threads
# can wait forever on a loader lock one of them held.
_PRCTL = ctypes.CDLL(None).prctl
# The commands a server forks for a client besides its own MODULE: those that import
# TensorFlow at their top anyway, so that what the server imported changes nothing they do.
# Not prepare_wiki's: its main process and workers load TensorFlow only where they need it.
# (_imported_already refuses one the server has imported: runpy would warn.)
FORKABLE = ("bert_pretrain.run_pretraining", "bert_pretrain.run_classifier",
            "bert_pretrain.export", "bert_pretrain.inspect_records",
            "bert_pretrain.conformance")
# tests/fork_hook: on a client's PYTHONPATH (conftest.forking_env), not on the server's.
FORK_HOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_hook")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGUSR2)


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


def run_as_main(module, argv):
  """In a forked child: `python3 -m module *argv` in this folder; never returns."""
  import numpy as np  # pylint: disable=g-import-not-at-top  (imported by the module already)
  # A new process draws fresh seeds; a forked one would repeat its parent's.
  random.seed()
  np.random.seed()
  status = 1
  sys.path[0] = os.getcwd()  # as -m has it, where this script's folder was
  try:
    sys.argv = [module] + argv  # runpy puts the file's path first, as -m does
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


def child(module, request):
  """In the forked child of a request on stdin; never returns."""
  signal.alarm(request["timeout"])
  os.chdir(request["cwd"])
  with open(os.devnull) as f:
    os.dup2(f.fileno(), 0)
  for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
    if fd == 2 and path == request["stdout"]:
      os.dup2(1, 2)
      continue
    with open(path, "w") as f:
      os.dup2(f.fileno(), fd)
  run_as_main(module, request["argv"])


def _differences(env, other):
  """The names in _READ_AT_START whose values differ between two environments (FORK_HOOK
  left out of PYTHONPATH)."""
  def without_hook(e):
    path = [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p != FORK_HOOK]
    return dict(e, PYTHONPATH=os.pathsep.join(path))
  env, other = without_hook(env), without_hook(other)
  return sorted(k for k in set(env) | set(other) if k.startswith(_READ_AT_START) and
                k not in _READ_LATER and env.get(k) != other.get(k))


def rank_child(module, request, fds):
  """In the forked child of a client's request; never returns."""
  os.environ.clear()
  os.environ.update(request["env"])
  os.chdir(request["cwd"])
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
    os.close(fd)
  # Flushed as a new interpreter's: where the environment asks for unbuffered output
  # (horovodrun --gloo does, and many containers), text written through to the file as
  # `python3 -u` writes it, each write a piece of its own.
  if "PYTHONUNBUFFERED" in os.environ:
    for name, fd in (("stdout", 1), ("stderr", 2)):
      stream = getattr(sys, name)
      setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, "w", closefd=False),
                                          encoding=stream.encoding, errors=stream.errors,
                                          write_through=True))
  else:
    sys.stdout.reconfigure(line_buffering=False)
    sys.stderr.reconfigure(line_buffering=True)
  run_as_main(module, request["argv"])


def _send(connection, message):
  try:
    connection.send(json.dumps(message).encode())
  except OSError:  # the client has gone
    pass


def _sockets(listener, runs):
  """The server's open sockets: its listener and its clients' connections."""
  return [s for s in [listener] + list(runs.values()) if s is not None and s.fileno() >= 0]


def _fork(in_child, sockets):
  """Forks a child that closes the server's `sockets` and calls in_child() (which never
  returns), and dies with the server; returns its pid."""
  sys.stdout.flush()  # or the child would write what is buffered again
  sys.stderr.flush()
  server = os.getpid()
  pid = os.fork()
  if pid == 0:
    try:
      _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
      if os.getppid() == server:  # else it ended before prctl
        for sock in sockets:
          sock.close()
        in_child()
    except BaseException:  # pylint: disable=broad-except  (a failed child must not serve)
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
    os._exit(1)  # pylint: disable=protected-access
  return pid


def _report_ended(runs):
  """Tells the exit status of each ended child where its request came from: stdout
  (None) or its client's connection, unless the client has gone (closed)."""
  while runs:
    pid, status = os.waitpid(-1, os.WNOHANG)
    if not pid:
      return
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    connection = runs.pop(pid)
    if connection is None:
      sys.stdout.write(json.dumps({"returncode": code}) + "\n")
      sys.stdout.flush()
    elif connection.fileno() >= 0:
      _send(connection, {"returncode": code})
      connection.close()


def _end_orphans(ready, runs):
  """SIGKILLs the children whose clients have gone (a killed rank): a stopped child too,
  whose end of its launcher's pipes would keep the launcher waiting."""
  for pid, connection in runs.items():
    if connection in ready:
      try:
        gone = not connection.recv(16)
      except OSError:
        gone = True
      if gone:
        os.kill(pid, signal.SIGKILL)
        connection.close()


def _imported_already(module):
  """Whether this process imported the code `python3 -m module` runs: run as __main__ too,
  runpy would warn of it, which a new process does not."""
  spec = importlib.util.find_spec(module)
  return (module + ".__main__" if spec.submodule_search_locations else module) in sys.modules


def _take_rank(module, listener, runs):
  """Forks the run a client asks for, or tells it why not."""
  connection = listener.accept()[0]
  connection.settimeout(10)  # a client sends its request as it connects
  fds = array.array("i")
  try:
    message, ancillary, _, _ = connection.recvmsg(1 << 20,
                                                  socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, data in ancillary:
      if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
        fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    request = json.loads(message.decode())
  except (OSError, ValueError):  # the client has gone
    for fd in fds:
      os.close(fd)
    connection.close()
    return
  connection.settimeout(None)
  refusal = None
  differences = _differences(request["env"], os.environ)
  command = request["command"]
  if len(fds) != 3:
    refusal = "no stdin, stdout and stderr"
  elif (len(command) < 3 or command[:2] != [sys.executable, "-m"] or
        command[2] not in (module,) + FORKABLE):
    refusal = "not %s -m %s or one of FORKABLE" % (sys.executable, module)
  elif _imported_already(command[2]):
    refusal = "%s: imported here already" % command[2]
  elif any(f.startswith("--use_xla") for f in command):
    refusal = "--use_xla: TensorFlow reads its XLA flags once"
  elif differences:
    refusal = "environment: " + ", ".join(differences)
  if refusal:
    _send(connection, {"refused": refusal})
    connection.close()
  else:
    pid = _fork(lambda: rank_child(command[2], dict(request, argv=command[3:]), list(fds)),
                _sockets(listener, runs) + [connection])
    _send(connection, {"pid": pid})
    runs[pid] = connection
  for fd in fds:
    os.close(fd)


def serve(module, socket_path=None):
  """Imports what `module` imports, then forks the runs asked for on stdin and, with
  socket_path, by clients there; at the end of stdin, SIGKILLs the runs still going and
  returns."""
  import_what_it_imports(module)
  listener = None
  if socket_path:
    if os.path.exists(socket_path):  # an ended server's
      os.remove(socket_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path)
    listener.listen(16)
  runs = {}  # pid -> its client's connection, or None for the run asked for on stdin
  buffer = b""
  while True:
    ready = select.select([0] + _sockets(listener, runs), [], [], 0.05 if runs else None)[0]
    _end_orphans(ready, runs)
    _report_ended(runs)
    if 0 in ready:
      chunk = os.read(0, 65536)
      if not chunk:  # the worker has ended
        for pid in runs:
          os.kill(pid, signal.SIGKILL)
        return
      buffer += chunk
      while b"\n" in buffer:
        line, buffer = buffer.split(b"\n", 1)
        request = json.loads(line.decode())
        pid = _fork(lambda: child(module, request), _sockets(listener, runs))
        runs[pid] = None
        sys.stdout.write(json.dumps({"pid": pid}) + "\n")
        sys.stdout.flush()
    if listener in ready:
      _take_rank(module, listener, runs)


def rank_client(socket_path, command):
  """Runs `command` (/path/to/python3 -m MODULE FLAGS...) as a child of the server at
  socket_path, or itself where the server refuses or is not there; exits as it did."""
  pending = []  # signals that came before the child's pid
  child = []

  def pass_on(sig, _):
    if not child:
      pending.append(sig)
      return
    try:
      os.kill(child[0], sig)
    except OSError:  # it has ended
      pass
  for sig in _FORWARDED:
    signal.signal(sig, pass_on)
  connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  try:
    connection.connect(socket_path)
    request = {"command": command, "env": dict(os.environ), "cwd": os.getcwd()}
    connection.sendmsg([json.dumps(request).encode()], [(
        socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    reply = json.loads(connection.recv(1 << 16).decode())
  except (OSError, ValueError):  # no server, or it ended before it answered
    reply = {"refused": "no server"}
  if os.environ.get("FORKED_RUNS_LOG"):  # where a test (test_fork_hook.py) reads the replies
    with open(os.environ["FORKED_RUNS_LOG"], "a") as f:
      f.write(json.dumps({"command": command, "reply": reply}) + "\n")
  if "pid" not in reply:
    connection.close()
    for sig in _FORWARDED:
      signal.signal(sig, signal.SIG_DFL)
    for sig in pending:
      os.kill(os.getpid(), sig)
    os.environ.pop("FORKED_RUNS_SOCKET", None)  # or tests/fork_hook would ask again
    os.execv(command[0], command)
  child.append(reply["pid"])
  for sig in pending:
    pass_on(sig, None)
  pid_file = "%s-%d.pid" % (socket_path, os.getpid())
  with open(pid_file + ".tmp", "w") as f:
    f.write("%d\n" % child[0])
  os.rename(pid_file + ".tmp", pid_file)
  message = connection.recv(1 << 16)
  os.remove(pid_file)
  # Without an answer the server has gone, and the child with it (SIGKILL).
  code = json.loads(message.decode())["returncode"] if message else -signal.SIGKILL
  if code < 0:  # ended by a signal: so is this process
    if -code != signal.SIGKILL:
      signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
  sys.exit(code)


if __name__ == "__main__":
  if sys.argv[1] == "--rank":
    rank_client(sys.argv[2], sys.argv[3:])
  else:
    serve(*sys.argv[1:])
