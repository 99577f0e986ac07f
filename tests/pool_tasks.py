"""Tasks for the worker-pool tests of test_processes.py, in a module of their own: a
spawned worker imports the module of its task, and this one imports nothing heavy."""

import os
import signal
import time


def square_unless_three(task):
  """Task 3's worker is killed, as the OOM killer would."""
  if task == 3:
    os.kill(os.getpid(), signal.SIGKILL)
  return task * task


def fail_or_sleep(task):
  if task == "fail":
    raise ValueError("the task failed")
  time.sleep(120)


def blocked_signals(unused_task):
  """The signals this worker holds."""
  return sorted(int(signum) for signum in signal.pthread_sigmask(signal.SIG_BLOCK, []))
