"""Ctrl-C and SIGTERM reach the tools: a stop that comes as a tool forks a child, or that
the kernel gives another thread, ends the tool (errors.stops_held, processes.run and a
worker pool; the children's side is test_processes.py)."""

import os
import signal
import subprocess
import sys

import pytest

from bert_pretrain import errors
from bert_pretrain import processes
from conftest import ROOT

# A script whose stop comes as it forks: sent from an at-fork callback (logging's runs in
# every fork), whose exception Python drops. With "another thread", a thread of its own is
# there to take the stop while the main thread holds it, as one of TensorFlow's can.
FORK_STOP = """
import multiprocessing, os, signal, subprocess, sys, threading, time
from bert_pretrain import errors
from bert_pretrain import processes
stop, taker, fork = sys.argv[1:]
errors.take_stop_signals()
if taker == "another thread":
  threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
def shared_pending(signum):
  with open("/proc/self/status") as f:
    return int([l for l in f if l.startswith("ShdPnd:")][0].split()[1], 16) >> signum - 1 & 1
landed = []
def land():
  if not landed:
    landed.append(stop)
    signum = getattr(signal, stop)
    os.kill(os.getpid(), signum)
    if taker == "another thread":  # until it has taken it: Python's handler runs here then
      deadline = time.time() + 60
      while shared_pending(signum) and time.time() < deadline:
        time.sleep(0.01)
      time.sleep(0.1)
os.register_at_fork(after_in_parent=land)
try:
  if fork == "Popen":
    subprocess.run(["true"], preexec_fn=lambda: None)
  elif fork == "processes.run":
    processes.run(["true"])
  else:
    processes.run_tasks(abs, [-1, -2], 2, print)
  print("went on after " + ", ".join(landed))
except KeyboardInterrupt as e:
  print("stopped by %s, %d children left" % (type(e).__name__,
                                             len(multiprocessing.active_children())))
"""


def _fork_stop(stop, taker, fork):
  return subprocess.run([sys.executable, "-c", FORK_STOP, stop, taker, fork],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                        timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))


def test_a_tool_started_with_ctrl_c_ignored_takes_a_kill_int():
  # A script's `&` starts its job with SIGINT ignored; a kill -INT to the job is meant.
  waiting = ("import sys, time\n"
             "from bert_pretrain import errors\n"
             "errors.take_stop_signals()\n"
             "try:\n"
             "  print('waiting', flush=True)\n"
             "  time.sleep(60)\n"
             "except KeyboardInterrupt:\n"
             "  sys.exit(errors.stopped_by_signal('tool', KeyboardInterrupt(), 'rerun', "
             "sys.stdout))\n")
  proc = subprocess.Popen([sys.executable, "-c", waiting], stdout=subprocess.PIPE,
                          universal_newlines=True, env=dict(os.environ, PYTHONPATH=ROOT),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
  try:
    assert proc.stdout.readline() == "waiting\n"
    proc.send_signal(signal.SIGINT)
    assert proc.communicate(timeout=30)[0] == "tool: interrupted; rerun\n"
    assert proc.returncode == 130
  finally:
    proc.kill()
    proc.wait()


def test_a_ctrl_c_raised_in_code_run_from_a_string_still_exits_130_as_a_module(tmp_path):
  # Python 3.8+ marks such a KeyboardInterrupt unhandled, caught or not, and a `-m` run
  # then dies of SIGINT at exit (-2): the launcher's flag check imports config.py, whose
  # dataclasses are built so (and namedtuples are).
  (tmp_path / "from_a_string.py").write_text(
      "import sys\n"
      "from bert_pretrain import errors\n"
      "try:\n"
      "  exec('raise KeyboardInterrupt')\n"
      "except KeyboardInterrupt as e:\n"
      "  sys.exit(errors.stopped_by_signal('tool', e, 'rerun', sys.stdout))\n")
  result = subprocess.run([sys.executable, "-m", "from_a_string"], stdout=subprocess.PIPE,
                          universal_newlines=True, timeout=60, cwd=str(tmp_path),
                          env=dict(os.environ, PYTHONPATH=ROOT))
  assert (result.returncode, result.stdout) == (130, "tool: interrupted; rerun\n")


def test_a_tool_started_with_its_stderr_closed_runs_without_its_stacks_armed(
    pretraining_data):
  """`2>&-` (cron, a daemon): faulthandler has nowhere to write SIGUSR2's stacks, and the
  tool runs all the same (errors.run_main arms them)."""
  result = subprocess.run(
      [sys.executable, "-m", "bert_pretrain.inspect_records",
       "--input=" + pretraining_data["train"]], stdout=subprocess.PIPE,
      universal_newlines=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT),
      preexec_fn=lambda: os.close(2))
  assert result.returncode == 0, result.stdout[-3000:]
  assert "[MASK]{" in result.stdout  # its examples as text


def test_python_drops_a_stop_whose_handler_runs_in_a_fork_callback():
  # Why the tools hold their stops as they fork: a plain Popen with a preexec_fn goes on.
  for stop in ("SIGINT", "SIGTERM"):
    result = _fork_stop(stop, "this thread", "Popen")
    assert result.stdout == "went on after %s\n" % stop, result.stderr
    assert "Exception ignored in" in result.stderr


@pytest.mark.parametrize("fork", ["processes.run", "a fork pool"])
@pytest.mark.parametrize("taker", ["this thread", "another thread"])
@pytest.mark.parametrize("stop,raised", [("SIGINT", "KeyboardInterrupt"),
                                         ("SIGTERM", "Terminated")])
def test_a_stop_that_comes_as_a_tool_forks_ends_the_tool(stop, raised, taker, fork):
  result = _fork_stop(stop, taker, fork)
  assert (result.returncode, result.stdout) == (0, "stopped by %s, 0 children left\n" % raised), \
      result.stderr
  assert "Exception ignored" not in result.stderr, result.stderr


# Stops every millisecond or so from another thread while the script holds and releases
# them in a loop. Their handler raises in stops_held's own lines (and when called without a
# frame, as below): after each block, none may be left blocked or recorded.
STOPS_KEEP_COMING = """
import os, random, signal, sys, threading, time
from bert_pretrain import errors
class Stop(Exception):
  pass
def stop(signum, frame):
  if frame is None or frame.f_code.co_filename == errors.__file__:
    raise Stop()
for signum in errors.STOP_SIGNALS:
  signal.signal(signum, stop)
blocks, left = 0, set()
deadline = time.time() + float(sys.argv[1])
def send():
  while time.time() < deadline:
    time.sleep(random.random() * 0.002)
    os.kill(os.getpid(), random.choice(errors.STOP_SIGNALS))  # any thread may take it
sender = threading.Thread(target=send)
sender.start()
while sender.is_alive():
  try:
    with errors.stops_held():
      blocks += 1
  except Stop:
    pass
  if set(errors.STOP_SIGNALS) & set(signal.pthread_sigmask(signal.SIG_BLOCK, [])):
    left.add("blocked")
    signal.pthread_sigmask(signal.SIG_UNBLOCK, errors.STOP_SIGNALS)
  for signum in errors.STOP_SIGNALS:
    try:
      signal.getsignal(signum)(signum, None)
      left.add("recorded")
      signal.signal(signum, stop)
    except Stop:
      pass
print(blocks > 1000, sorted(left))
"""


def test_stops_that_keep_coming_are_never_left_blocked_or_recorded_after_the_block():
  result = subprocess.run([sys.executable, "-c", STOPS_KEEP_COMING, "10"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.stdout == "True []\n"


# A SIGTERM that comes as stops_held swaps its handler: the handler it had runs first (set
# to SIG_IGN by it, as take_stop_signals's does, it must stay so).
STOP_IN_THE_SWAP = """
import os, signal, types
from bert_pretrain import errors
errors.take_stop_signals()
def signal_as_a_stop_comes(signum, handler):
  if signum == signal.SIGTERM and getattr(handler, "__name__", "") == "hold":
    os.kill(os.getpid(), signal.SIGTERM)
  return signal.signal(signum, handler)
errors.signal = types.SimpleNamespace(**dict(vars(signal), signal=signal_as_a_stop_comes))
try:
  with errors.stops_held():
    print("the block ran")
except errors.Terminated:
  print("terminated; SIGTERM then ignored: %s" % (signal.getsignal(signal.SIGTERM) ==
                                                 signal.SIG_IGN))
"""

# Another signal's handler raising as stops_held puts the block's mask back.
OTHER_RAISES_AT_THE_END = """
import os, signal, time
from bert_pretrain import errors
class Alarm(Exception):
  pass
def alarm(signum, frame):
  raise Alarm()
signal.signal(signal.SIGALRM, alarm)
try:
  with errors.stops_held():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    os.kill(os.getpid(), signal.SIGALRM)
except Alarm:
  pass
blocked = sorted(set(errors.STOP_SIGNALS) & set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
try:
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(1)
  print("Ctrl-C lost; blocked: %s" % blocked)
except KeyboardInterrupt:
  print("Ctrl-C taken; blocked: %s" % blocked)
"""


@pytest.mark.parametrize("script,said", [
    (STOP_IN_THE_SWAP, "terminated; SIGTERM then ignored: True"),
    (OTHER_RAISES_AT_THE_END, "Ctrl-C taken; blocked: []")])
def test_a_handler_that_runs_as_the_stops_are_held_or_let_go_leaves_them_working(script, said):
  result = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.stdout == said + "\n"
