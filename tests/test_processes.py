"""The child processes a tool starts (bert_pretrain.processes): a command run to its end,
a pool of workers, a child that ends with the process that started it, and a wait on a
child that a stop ends."""

import functools
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from bert_pretrain import errors
from bert_pretrain import processes
from conftest import ROOT, can_look_into_descriptors, gone, workers_of
import pool_tasks


CHILD_STOPS = ("import signal; print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), "
               "signal.getsignal(signal.SIGINT) == signal.SIG_IGN)")


def test_a_child_forked_holding_the_stops_takes_them_and_keeps_an_ignored_one_ignored():
  mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
  handlers = [signal.getsignal(signum) for signum in errors.STOP_SIGNALS]
  for ignored in (False, True):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else
                             signal.default_int_handler)
    try:
      child = processes.run([sys.executable, "-c", CHILD_STOPS], stdout=subprocess.PIPE,
                            universal_newlines=True)
    finally:
      signal.signal(signal.SIGINT, previous)
    blocked = sorted(set(mask) - set(errors.STOP_SIGNALS))
    assert (child.returncode, child.stdout) == (0, "%s %s\n" % (blocked, ignored))
  # This process has its own back.
  assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
  assert [signal.getsignal(signum) for signum in errors.STOP_SIGNALS] == handlers


def test_a_child_whose_parent_ended_before_it_asked_to_end_with_it_ends_itself():
  # A child asks Linux for SIGTERM when its parent ends (processes.end_with_parent); one
  # whose parent was gone before (another pid than the one given) would run on, also where this
  # process has a Python SIGTERM handler (run_pretraining's), which a fork keeps.
  child = [sys.executable, "-c", "print('ran')"]
  ours = processes.run(child, stdout=subprocess.PIPE, universal_newlines=True,
                       preexec_fn=functools.partial(processes.end_with_parent, os.getpid()))
  assert (ours.returncode, ours.stdout) == (0, "ran\n")
  for handler in (signal.SIG_DFL, lambda *_: None):
    previous = signal.signal(signal.SIGTERM, handler)
    try:
      orphan = processes.run(child, stdout=subprocess.PIPE, universal_newlines=True,
                             preexec_fn=functools.partial(processes.end_with_parent,
                                                          os.getpid() + 1))
    finally:
      signal.signal(signal.SIGTERM, previous)
    assert (orphan.returncode, orphan.stdout) == (-signal.SIGTERM, "")


class _Recorded(subprocess.Popen):
  """subprocess.Popen, each one kept in STARTED: what processes.run did with its child."""
  STARTED = []

  def __init__(self, *args, **kwargs):
    super(_Recorded, self).__init__(*args, **kwargs)
    self.STARTED.append(self)


def test_a_childs_lines_reach_on_line_as_they_come_and_whole_at_the_end(tmp_path):
  """The child waits for the file its first line's callback makes: lines passed on only
  at its end would leave it waiting (then it says so and fails)."""
  flag = tmp_path / "seen"
  child = ("import os, sys, time\nprint('first', flush=True)\n"
           "deadline = time.time() + 60\n"
           "while not os.path.exists(%r):\n"
           "  if time.time() > deadline:\n    print('not streamed'); sys.exit(1)\n"
           "  time.sleep(0.05)\n"
           "sys.stdout.write('second\\nlast, unterminated')\n" % str(flag))
  seen = []

  def on_line(line):
    seen.append(line)
    flag.touch()
  finished = processes.run([sys.executable, "-c", child], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True, on_line=on_line)
  assert finished.returncode == 0, finished.stdout
  assert seen == ["first\n", "second\n", "last, unterminated"]
  assert finished.stdout == "first\nsecond\nlast, unterminated"


def test_a_child_run_past_its_timeout_is_killed_and_reaped(monkeypatch):
  monkeypatch.setattr(subprocess, "Popen", _Recorded)
  monkeypatch.setattr(_Recorded, "STARTED", [])
  with pytest.raises(subprocess.TimeoutExpired) as raised:
    processes.run(["sleep", "60"], timeout=2)
  assert raised.value.timeout == 2
  assert [child.returncode for child in _Recorded.STARTED] == [-signal.SIGKILL]


# A script stopped by SIGTERM while processes.run waits on its child: what became of it.
STOPPED_RUN = """
import os, signal, subprocess, threading, time
from bert_pretrain import errors
from bert_pretrain import processes
errors.take_stop_signals()
started = []
class Recorded(subprocess.Popen):
  def __init__(self, *args, **kwargs):
    super(Recorded, self).__init__(*args, **kwargs)
    started.append(self)
subprocess.Popen = Recorded
def stop_once_started():
  while not started:
    time.sleep(0.01)
  os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=stop_once_started, daemon=True).start()
try:
  processes.run(["sleep", "60"])
except errors.Terminated:
  print("stopped; its child's status: %s" % started[0].returncode)
"""


def test_a_stop_while_a_child_runs_kills_and_reaps_the_child():
  result = subprocess.run([sys.executable, "-c", STOPPED_RUN],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.stdout == "stopped; its child's status: %d\n" % -signal.SIGKILL


# The kernel gives a process's signal to any of its threads not blocking it, and Python
# acts on it only as the main thread runs: here the main thread blocks SIGINT, so that a
# thread of the script's own takes it, as one of numpy's or TensorFlow's can.
INTERRUPTED_WAIT = """
import os, signal, subprocess, threading, time
import psutil
from bert_pretrain import processes
waiting = threading.Event()
def interrupt():
  waiting.wait()
  time.sleep(0.5)
  os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=interrupt, daemon=True).start()
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
start = time.time()
try:
  %s
except KeyboardInterrupt:
  print("interrupted after %%d s" %% (time.time() - start))
for child in psutil.Process().children():
  child.kill()
"""
WAITS = {
    "communicate": "waiting.set(); processes.communicate(subprocess.Popen(['sleep', '60'], "
                   "stdout=subprocess.PIPE))",
    # Its output read to the end (a line, then none), processes.run waits for its exit.
    "lines-then-exit": "processes.run(['sh', '-c', 'echo started; exec sleep 60 >&-'], "
                       "stdout=subprocess.PIPE, universal_newlines=True, "
                       "on_line=lambda line: waiting.set())",
    # Two workers' tasks: a result waited for.
    "tasks": "waiting.set(); processes.run_tasks(time.sleep, [60, 60], 2, print)",
}


@pytest.mark.parametrize("wait", sorted(WAITS))
def test_a_signal_another_thread_took_ends_a_wait_on_a_child_before_the_child_ends(wait):
  result = subprocess.run([sys.executable, "-c", INTERRUPTED_WAIT % WAITS[wait]],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
  seconds = re.fullmatch(r"interrupted after (\d+) s\n", result.stdout)
  assert seconds and int(seconds.group(1)) < 30, result.stdout  # not after the child's 60 s


def test_a_wait_on_a_child_past_its_timeout_raises_as_communicate_does():
  child = subprocess.Popen(["sleep", "60"])
  try:
    with pytest.raises(subprocess.TimeoutExpired) as raised:
      processes.communicate(child, timeout=1.5)
    assert raised.value.timeout == 1.5
  finally:
    child.kill()
    child.wait()


# A process that leaves a spawned pool's semaphore behind, as a run stopped while its
# workers start may: the semaphore tracker removes it and, unless told not to, warns.
LEAK = """
import multiprocessing, os, sys
from bert_pretrain import processes
if sys.argv[1] == "pool":
  processes.WorkerPool(1, "spawn")
lock = multiprocessing.get_context("spawn").Lock()
sys.stderr.write("last line\\n")
sys.stderr.flush()
os._exit(0)
"""


def test_a_spawned_pools_left_semaphores_add_no_warning_after_the_last_line():
  def stderr_of(mode):
    return subprocess.run([sys.executable, "-c", LEAK, mode], stderr=subprocess.PIPE,
                          universal_newlines=True, cwd=ROOT, timeout=120).stderr
  assert "leaked semaphore" in stderr_of("bare")  # what the pool keeps from the output
  assert stderr_of("pool").splitlines()[-1] == "last line"


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_worker_that_dies_ends_run_tasks_with_the_worker_line(context):
  results = []
  with pytest.raises(processes.WorkerDied) as raised:
    processes.run_tasks(pool_tasks.square_unless_three, list(range(8)), 2, results.append, context)
  assert str(raised.value) == str(processes.WorkerDied())
  assert set(results) <= {0, 1, 4, 16, 25, 36, 49}
  results = []
  processes.run_tasks(pool_tasks.square_unless_three, [0, 1, 2, 4], 2, results.append, context)
  assert sorted(results) == [0, 1, 4, 16]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_start_with_the_stop_signals_held_and_run_without(context, monkeypatch):
  """A SIGTERM or Ctrl-C that arrives while the pool starts a worker waits until the
  worker is the pool's (which then ends it), rather than leaving it half started; the
  caller and the workers then take them again."""
  process_class = type(multiprocessing.get_context(context).Process())
  start = process_class.start
  held = []
  monkeypatch.setattr(process_class, "start", lambda self: (
      held.append(signal.pthread_sigmask(signal.SIG_BLOCK, [])), start(self))[1])
  results = []
  processes.run_tasks(pool_tasks.blocked_signals, [0, 1, 2, 3], 2, results.append, context)
  assert len(held) == 2
  assert all({signal.SIGTERM, signal.SIGINT} <= mask for mask in held), held
  assert not {signal.SIGTERM, signal.SIGINT} & signal.pthread_sigmask(signal.SIG_BLOCK, [])
  assert len(results) == 4
  assert not any({signal.SIGTERM, signal.SIGINT} & set(result) for result in results)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_failed_task_ends_run_tasks_without_waiting_for_the_others(context):
  started = time.time()
  with pytest.raises(ValueError, match="the task failed"):
    processes.run_tasks(pool_tasks.fail_or_sleep, ["sleep", "fail", "sleep"], 2, print, context)
  assert time.time() - started < 60  # the sleeping task was killed, not waited for


def test_a_child_whose_parent_ended_before_it_asked_ends_at_once_even_with_the_signal_blocked():
  def orphan(block):
    signal.pthread_sigmask(signal.SIG_BLOCK if block else signal.SIG_UNBLOCK,
                           [signal.SIGTERM])
    processes.end_with_parent(os.getpid() + 1)  # as if the parent had ended

  child = [sys.executable, "-c", "print('ran')"]
  for block, status in ((False, -signal.SIGTERM), (True, 128 + signal.SIGTERM)):
    ended = subprocess.run(child, stdout=subprocess.PIPE, universal_newlines=True,
                           preexec_fn=functools.partial(orphan, block))
    assert (ended.returncode, ended.stdout) == (status, "")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_end_with_their_run_when_it_is_killed(context):
  # Forked workers hold the pipes' write ends open, so only the kernel can end them.
  program = ("import time\nfrom bert_pretrain import processes\n"
             "processes.run_tasks(time.sleep, [600] * 4, 2, print, %r)" % context)
  process = subprocess.Popen([sys.executable, "-c", program], cwd=ROOT,
                             start_new_session=True)
  try:
    workers = workers_of(process.pid)
    process.kill()
    process.wait(timeout=60)
    assert [pid for pid in workers if not gone(pid)] == []
  finally:
    try:
      os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group has ended
      pass


# A reader of its children's output (mpirun, say) that reads nothing while the test runs.
_IDLE_READER = "import time; time.sleep(30)"


def _container_terminal():
  """A terminal made through /dev/pts/ptmx, as a container's /dev/ptmx (a link to it)
  makes one: (master, slave) descriptors."""
  import ctypes  # pylint: disable=g-import-not-at-top
  libc = ctypes.CDLL(None)
  libc.ptsname.restype = ctypes.c_char_p
  master = os.open("/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY)
  assert libc.grantpt(master) == 0 and libc.unlockpt(master) == 0
  return master, os.open(libc.ptsname(master).decode(), os.O_RDWR | os.O_NOCTTY)


@pytest.mark.parametrize("through", ["pipe", "terminal", "container terminal"])
def test_unread_output_counts_what_a_writer_wrote_that_its_reader_has_not_read(through):
  if not can_look_into_descriptors():
    pytest.skip("no pidfd_getfd or no wait channel here (a kernel before 5.6, a container)")
  if through == "pipe":
    read_end, write_end = os.pipe()
  elif through == "terminal":
    import pty  # pylint: disable=g-import-not-at-top
    read_end, write_end = pty.openpty()  # the terminal's master is what its reader reads
  elif not os.access("/dev/pts/ptmx", os.R_OK | os.W_OK):
    pytest.skip("/dev/pts/ptmx is not open to this user (ptmxmode=000 outside a container)")
  else:
    read_end, write_end = _container_terminal()
  writer = subprocess.Popen(["sh", "-c", "printf abc; exec sleep 30"], stdout=write_end)
  reader = subprocess.Popen([sys.executable, "-c", _IDLE_READER], pass_fds=(read_end,))
  try:
    outputs = processes.output_of(writer.pid)
    assert outputs and os.readlink("/proc/self/fd/%d" % write_end) in outputs
    deadline = time.time() + 30
    while processes.unread_output(reader.pid, outputs) != 3 and time.time() < deadline:
      time.sleep(0.1)
    assert processes.unread_output(reader.pid, outputs) == 3
    # Only what the outputs named: another writer's pipe or terminal holds nothing.
    assert processes.unread_output(reader.pid, {"pipe:[0]", "/dev/pts/999999"}) == 0
    os.read(read_end, 3)  # as if the reader had read it: the same pipe or terminal
    assert processes.unread_output(reader.pid, outputs) == 0
  finally:
    for process in (writer, reader):
      process.kill()
      process.wait()
    for fd in (read_end, write_end):
      os.close(fd)
  assert processes.unread_output(reader.pid, outputs) is None  # gone
  assert processes.output_of(reader.pid) is None


def test_a_process_in_a_sleep_is_told_from_one_that_computes_or_is_gone():
  if not can_look_into_descriptors():
    pytest.skip("no wait channel here (a kernel that hides it)")
  asleep = subprocess.Popen(["sleep", "30"])
  busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
  try:
    time.sleep(0.5)
    # One long sleep: the same count of context switches twice.
    counts = [processes.sleeping(asleep.pid) for _ in range(2)]
    assert counts[0] is not None and counts[0] == counts[1]
    assert processes.sleeping(busy.pid) is None
  finally:
    for process in (asleep, busy):
      process.kill()
      process.wait()
  assert processes.sleeping(asleep.pid) is None
