"""The child processes a tool starts: a command run to its end (run), a pool of worker
processes (WorkerPool, run_tasks), how each child begins, and free TCP ports for the
workers of a job on this host (free_ports).

A Ctrl-C or SIGTERM that comes as a tool forks is not lost (errors.stops_held); a child
takes the stops as by default and ends with the process that started it
(end_with_parent); a wait on a child ends at a stop another thread took (communicate).
"""

import concurrent.futures
import contextlib
import ctypes
import errno
import faulthandler
import fcntl
import functools
import multiprocessing
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time

from bert_pretrain import errors
from bert_pretrain.distributed import stacks

_PR_SET_PDEATHSIG = 1  # prctl's option: the signal a process gets when its parent ends


def _libc_function(name):
  """libc's function `name`, looked up here, before any fork: a dlopen in a child forked
  from a process with threads can wait forever on a loader lock one of them held."""
  try:
    return getattr(ctypes.CDLL(None), name)
  except (OSError, AttributeError):  # not Linux: a child outlives a killed parent, say
    return None


_PRCTL = _libc_function("prctl")
_SYSCALL = _libc_function("syscall")
# Linux's pidfd_open and pidfd_getfd (5.6), the same number on every architecture.
_PIDFD_OPEN, _PIDFD_GETFD = 434, 438


class WorkerDied(Exception):
  """A worker process ended without finishing its task (the OOM killer, kill -9)."""

  def __init__(self):
    super(WorkerDied, self).__init__(
        "a worker process ended abruptly (killed, or out of memory: see dmesg); the "
        "finished work is kept: run the same command again to go on, with fewer --jobs "
        "if memory ran out")


class WorkerPool(object):
  """`processes` worker processes, as a context manager: submit(function, *args) gives
  a concurrent.futures future. Tasks and results should be small (paths, counts).

  A worker that dies (the OOM killer, kill -9) ends the block with WorkerDied at once,
  where multiprocessing.Pool would wait for its task forever. Leaving the block by an
  exception (a failed task, Ctrl-C, SIGTERM) kills the workers rather than waiting for
  their tasks, and a worker dies with this process (PR_SET_PDEATHSIG), so none outlives
  a killed run.
  """

  def __init__(self, processes, context="fork"):
    if context != "fork":
      # The tracker process that a spawned pool's semaphores start, and that removes
      # those a stopped run leaves, would warn of them after the tool's last line.
      for tracker in ("semaphore_tracker", "resource_tracker"):  # Python 3.7, 3.8 on
        option = "ignore::UserWarning:multiprocessing." + tracker
        if option not in sys.warnoptions:
          sys.warnoptions.append(option)
    self._executor = concurrent.futures.ProcessPoolExecutor(
        processes, mp_context=multiprocessing.get_context(context),
        initializer=_start_worker, initargs=(os.getpid(),))
    if context == "fork":
      # The first task forks every worker: now, before this process starts any thread
      # whose locks a fork would copy held.
      try:
        result(self.submit(int))
      except BaseException:  # a stop: no block ends the workers yet
        self.__exit__(*sys.exc_info())
        raise

  def submit(self, function, *args):
    # The executor starts its workers here. A stop signal raised halfway through a start
    # would leave a spawned worker outside the pool, reading a pipe its parent never
    # finished (its EOFError after the tool's last line): the signal waits until after.
    with errors.stops_held():
      return self._executor.submit(function, *args)

  def __enter__(self):
    return self

  def __exit__(self, kind, value, unused_traceback):
    if kind is not None:
      # The executor has no public way to stop running tasks.
      for process in list((getattr(self._executor, "_processes", None) or {}).values()):
        process.kill()
    self._executor.shutdown(wait=True)
    # A worker's traceback as the cause: a task or result that does not pickle, a bug.
    if isinstance(value, concurrent.futures.BrokenExecutor) and value.__cause__ is None:
      raise WorkerDied() from None


def _start_worker(parent):
  """In each worker: die of SIGTERM as by default, whatever handler the run's process
  has (a Python handler would not run in a worker stuck in C); leave Ctrl-C to the run,
  which ends the workers; end with the run's process."""
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, errors.STOP_SIGNALS)  # held while it started
  end_with_parent(parent, signal.SIGKILL)
  arm_stacks()  # a spawned worker has not the parent's


def end_with_parent(parent, signum=signal.SIGTERM):
  """In a child process of `parent`: signal `signum` when the thread that started it
  ends (Linux's PR_SET_PDEATHSIG), and end at once if `parent` has ended already."""
  if _PRCTL is None:
    return
  _PRCTL(_PR_SET_PDEATHSIG, signum)
  if os.getppid() != parent:  # it ended between the fork and prctl
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # pylint: disable=protected-access  (blocked, ignored or handled)


def communicate(process, timeout=None):
  """process.communicate() (a subprocess.Popen), waited on a second at a time: Python acts
  on a signal only as its main thread runs, and one the kernel gave another thread
  (numpy's, TensorFlow's) ends no wait in C. Raises TimeoutExpired after `timeout` s."""
  deadline = None if timeout is None else time.monotonic() + timeout
  while True:
    left = 1.0 if deadline is None else max(min(1.0, deadline - time.monotonic()), 0.0)
    try:
      return process.communicate(timeout=left)
    except subprocess.TimeoutExpired as e:
      if deadline is not None and time.monotonic() >= deadline:
        raise subprocess.TimeoutExpired(process.args, timeout, e.output, e.stderr) from None


def result(future):
  """future.result() (a concurrent.futures future), waited on a second at a time, as
  communicate waits: a stop the kernel gave another thread ends the wait."""
  while not future.done():
    concurrent.futures.wait([future], timeout=1.0)
  return future.result()


def _read_lines(process, on_line):
  """process's stdout, passed to on_line a line at a time as it comes ("\\r\\n" read as
  "\\n"); returns it whole. Waits a second at a time, as communicate does."""
  fd, pending, lines = process.stdout.fileno(), b"", []
  with process.stdout:
    while True:
      if not select.select([fd], [], [], 1.0)[0]:
        continue
      chunk = os.read(fd, 65536)
      pending += chunk
      *whole, pending = pending.split(b"\n")
      for line in [l + b"\n" for l in whole] + ([pending] if pending and not chunk else []):
        lines.append(line.replace(b"\r\n", b"\n").decode("utf-8", "replace"))
        on_line(lines[-1])
      if not chunk:
        communicate(process)  # its exit, as any other wait here: a second at a time
        return "".join(lines)


def start(command, started, preexec_fn=None, **kwargs):
  """subprocess.Popen(command, **kwargs) from a tool's main thread, appended to the list
  `started` before a Ctrl-C or SIGTERM that comes as the child is forked is acted on
  (errors.stops_held): the caller can end it then. The child takes them as by default,
  then runs preexec_fn. Returns the Popen."""
  with errors.stops_held():
    started.append(subprocess.Popen(command, preexec_fn=functools.partial(
        _start_held_child, preexec_fn), **kwargs))
  return started[-1]


def run(command, timeout=None, preexec_fn=None, on_line=None, **kwargs):
  """Runs command to its end as subprocess.run does (kwargs are Popen's: stdout=PIPE
  captures) from a tool's main thread: a Ctrl-C or SIGTERM that comes as the child is
  forked is not lost (start), nor one another thread takes (communicate). On any
  exception (a stop, the timeout) the child is killed and reaped. on_line: with
  stdout=PIPE and universal_newlines (no timeout), called with each line of it as it
  comes; the CompletedProcess still holds the whole output."""
  if on_line is not None and timeout is not None:
    raise ValueError("processes.run: on_line takes no timeout")
  started = []
  try:
    process = start(command, started, preexec_fn, **kwargs)
    if on_line is None:
      stdout, stderr = communicate(process, timeout)
    else:
      stdout, stderr = _read_lines(process, on_line), None
  except BaseException:
    for process in started:
      process.kill()
      with process:  # closes its pipes and reaps it
        pass
    raise
  return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _start_held_child(preexec_fn):
  errors.stops_to_default()
  if preexec_fn is not None:
    preexec_fn()


def output_of(pid):
  """Where process `pid` writes its stdout and stderr: a set of their links in /proc
  ("pipe:[N]", "/dev/pts/N", a file's path), for unread_output; None when it is gone."""
  try:
    return {os.readlink("/proc/%d/fd/%d" % (pid, fd)) for fd in (1, 2)}
  except OSError:
    return None


def unread_output(pid, outputs):
  """Bytes written to `outputs` (output_of's) that process `pid`, which reads their pipes
  and terminals, has not read yet: None when that cannot be told (no pidfd_getfd, not
  allowed, the process gone). Each is looked at through a copy of its descriptor:
  opening /dev/ptmx again would make a new terminal."""
  if _SYSCALL is None:
    return None
  pidfd = _SYSCALL(_PIDFD_OPEN, pid, 0)
  if pidfd < 0:
    return None
  unread = 0
  try:
    for fd in os.listdir("/proc/%d/fd" % pid):
      try:
        target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        with open("/proc/%d/fdinfo/%s" % (pid, fd)) as f:
          info = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
      except OSError:  # closed meanwhile
        continue
      reads = target in outputs and int(info["flags"], 8) & os.O_ACCMODE == os.O_RDONLY
      if "tty-index" in info:  # a terminal's master (/dev/ptmx, /dev/pts/ptmx in a container)
        reads = "/dev/pts/%s" % info["tty-index"].strip() in outputs
      if not reads:
        continue
      copy = _SYSCALL(_PIDFD_GETFD, pidfd, int(fd), 0)
      if copy < 0:
        return None
      try:
        unread += struct.unpack("i", fcntl.ioctl(copy, termios.FIONREAD, b"\0" * 4))[0]
      finally:
        os.close(copy)
  except OSError:  # it has ended
    return None
  finally:
    os.close(pidfd)
  return unread


def sleeping(pid):
  """How often process `pid` has given up the CPU (its voluntary context switches) when it
  waits in a sleep (nanosleep), as mpirun does through its odls_base_sigkill_timeout;
  None when it does not, or that cannot be told (a kernel that hides it). A count that
  stays the same is one long sleep, not a loop of short ones."""
  try:
    with open("/proc/%d/wchan" % pid) as f:
      if "nanosleep" not in f.read():
        return None
    with open("/proc/%d/status" % pid) as f:
      return int(f.read().split("voluntary_ctxt_switches:", 1)[1].split()[0])
  except (OSError, IndexError, ValueError):
    return None


def arm_stacks():
  """SIGUSR2 (stacks.STACK_SIGNAL) writes this process's Python stacks to stderr: what
  a run that seems stuck is doing. Forked workers keep it. Not armed when stderr is no
  file (closed: `2>&-`, or replaced), where faulthandler has nowhere to write."""
  try:
    faulthandler.register(stacks.STACK_SIGNAL, all_threads=True)
  except (RuntimeError, ValueError, OSError, AttributeError):
    pass


def run_tasks(function, tasks, jobs, on_result, context="fork"):
  """Runs function(task) for every task, `jobs` at once; on_result(result) in the caller.

  With one job the tasks run in this process (no pickling, plain tracebacks). A failing
  task stops the others; the tasks already finished have left their markers.

  Args:
    function: a module-level function of one argument.
    tasks: list of arguments.
    jobs: processes to use.
    on_result: called in this process with each result, roughly in completion order.
    context: multiprocessing start method for the workers.

  Raises:
    WorkerDied: a worker process ended without finishing its task.
  """
  if jobs <= 1 or len(tasks) <= 1:
    for task in tasks:
      on_result(function(task))
    return
  with WorkerPool(min(jobs, len(tasks)), context) as pool:
    pending = [pool.submit(function, task) for task in tasks]
    while pending:  # a second at a time, as result() waits
      done, pending = concurrent.futures.wait(
          pending, timeout=1.0, return_when=concurrent.futures.FIRST_COMPLETED)
      for future in done:
        on_result(future.result())


def free_ports(count, ephemeral_range="/proc/sys/net/ipv4/ip_local_port_range"):
  """`count` TCP ports free on this host now (for the workers of a local job), drawn from
  10000 (above most services' ports) to the ephemeral range: no outgoing connection takes
  one of those before its worker binds it. With less than 1000 ports there, 10000-19999.

  Raises:
    OSError: a port cannot be bound for another reason than being in use, or 100 draws
      per port found too few free.
  """
  try:
    with open(ephemeral_range) as f:
      lowest_ephemeral = int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    lowest_ephemeral = 32768  # Linux's default
  low, high = 10000, lowest_ephemeral
  if high - low < 1000:
    high = 20000
  draw = random.Random()  # unseeded: processes that seeded `random` would draw alike
  ports = []
  for _ in range(100 * count):
    if len(ports) == count:
      break
    port = draw.randrange(low, high)
    with contextlib.closing(socket.socket()) as s:
      try:
        s.bind(("", port))  # every address, as the worker's server binds
      except OSError as e:
        if e.errno != errno.EADDRINUSE:
          raise
        continue
    if port not in ports:
      ports.append(port)
  if len(ports) < count:
    raise OSError(errno.EADDRINUSE, "%d free TCP ports of %d found in %d draws from %d-%d"
                  % (len(ports), count, 100 * count, low, high - 1))
  return ports
