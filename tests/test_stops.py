"""Ctrl-C and SIGTERM reach the tools: a stop that comes as a tool forks a child, or that
the kernel gives another thread, ends the tool (errors.stops_held, workdir.run and
workdir.communicate)."""

import os
import re
import signal
import subprocess
import sys

import pytest

from bert_pretrain import errors
from bert_pretrain.wiki import workdir
from conftest import ROOT

# A script whose stop comes as it forks: sent from an at-fork callback (logging's runs in
# every fork), whose exception Python drops. With "another thread", a thread of its own is
# there to take the stop while the main thread holds it, as one of TensorFlow's can.
FORK_STOP = """
import os, signal, subprocess, sys, threading, time
from bert_pretrain import errors
from bert_pretrain.wiki import workdir
stop, taker, fork = sys.argv[1:]
errors.stop_on_sigterm()
if taker == "another thread":
  threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
landed = []
def land():
  if not landed:
    landed.append(stop)
    os.kill(os.getpid(), getattr(signal, stop))
    time.sleep(0.5)  # the thread that takes it runs its C handler; Python's runs here
os.register_at_fork(after_in_parent=land)
try:
  if fork == "Popen":
    subprocess.run(["true"], preexec_fn=lambda: None)
  elif fork == "workdir.run":
    workdir.run(["true"], preexec_fn=errors.stops_to_default)
  else:
    workdir.run_tasks(abs, [-1, -2], 2, print)
  print("went on after " + ", ".join(landed))
except KeyboardInterrupt as e:
  print("stopped by " + type(e).__name__)
"""


def _fork_stop(stop, taker, fork):
  return subprocess.run([sys.executable, "-c", FORK_STOP, stop, taker, fork],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                        timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))


def test_python_drops_a_stop_whose_handler_runs_in_a_fork_callback():
  # Why the tools hold their stops as they fork: a plain Popen with a preexec_fn goes on.
  for stop in ("SIGINT", "SIGTERM"):
    result = _fork_stop(stop, "this thread", "Popen")
    assert result.stdout == "went on after %s\n" % stop, result.stderr
    assert "Exception ignored in" in result.stderr


@pytest.mark.parametrize("fork", ["workdir.run", "a fork pool"])
@pytest.mark.parametrize("taker", ["this thread", "another thread"])
@pytest.mark.parametrize("stop,raised", [("SIGINT", "KeyboardInterrupt"),
                                         ("SIGTERM", "Terminated")])
def test_a_stop_that_comes_as_a_tool_forks_ends_the_tool(stop, raised, taker, fork):
  result = _fork_stop(stop, taker, fork)
  assert (result.returncode, result.stdout) == (0, "stopped by %s\n" % raised), result.stderr
  assert "Exception ignored" not in result.stderr, result.stderr


CHILD_STOPS = ("import signal; print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), "
               "signal.getsignal(signal.SIGINT) == signal.SIG_IGN)")


def test_a_child_forked_holding_the_stops_takes_them_and_keeps_an_ignored_one_ignored():
  mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
  handlers = [signal.getsignal(signum) for signum in errors.STOP_SIGNALS]
  for ignored in (False, True):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else
                             signal.default_int_handler)
    try:
      child = workdir.run([sys.executable, "-c", CHILD_STOPS], stdout=subprocess.PIPE,
                          universal_newlines=True, preexec_fn=errors.stops_to_default)
    finally:
      signal.signal(signal.SIGINT, previous)
    blocked = sorted(set(mask) - set(errors.STOP_SIGNALS))
    assert (child.returncode, child.stdout) == (0, "%s %s\n" % (blocked, ignored))
  # This process has its own back.
  assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
  assert [signal.getsignal(signum) for signum in errors.STOP_SIGNALS] == handlers


def test_a_child_run_past_its_timeout_is_killed_and_reaped(tmp_path):
  pid_file = tmp_path / "pid"
  with pytest.raises(subprocess.TimeoutExpired):
    workdir.run(["sh", "-c", 'echo "$$" > "$1"; exec sleep 60', "sh", str(pid_file)],
                timeout=1.5, stdout=subprocess.PIPE)
  pid = int(pid_file.read_text())
  with pytest.raises(ProcessLookupError):  # not even a zombie: reaped
    os.kill(pid, 0)


# The kernel gives a process's signal to any of its threads not blocking it, and Python
# acts on it only as the main thread runs: here the main thread blocks SIGINT, so that a
# thread of the script's own takes it, as one of numpy's or TensorFlow's can.
INTERRUPTED_WAIT = """
import os, signal, subprocess, threading, time
from bert_pretrain.wiki import workdir
waiting = threading.Event()
def interrupt():
  waiting.wait()
  time.sleep(0.5)
  os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=interrupt, daemon=True).start()
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
child = subprocess.Popen(["sleep", "60"], stdout=subprocess.PIPE)
start = time.time()
try:
  waiting.set()
  workdir.communicate(child)
except KeyboardInterrupt:
  child.kill()
  print("interrupted after %d s" % (time.time() - start))
"""


def test_a_signal_another_thread_took_ends_a_wait_on_a_child_before_the_child_ends():
  result = subprocess.run([sys.executable, "-c", INTERRUPTED_WAIT], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
  seconds = re.fullmatch(r"interrupted after (\d+) s\n", result.stdout)
  assert seconds and int(seconds.group(1)) < 30, result.stdout  # not after the child's 60 s


def test_a_wait_on_a_child_past_its_timeout_raises_as_communicate_does():
  child = subprocess.Popen(["sleep", "60"])
  try:
    with pytest.raises(subprocess.TimeoutExpired) as raised:
      workdir.communicate(child, timeout=1.5)
    assert raised.value.timeout == 1.5
  finally:
    child.kill()
    child.wait()
