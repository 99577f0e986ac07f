"""SIGTERM and SIGINT: stop after the current update, save, and exit with 128 + signal.

A preemption, a scheduler's time limit or Ctrl-C sends SIGTERM or SIGINT. Once training
has started (arm()), the first such signal only records a stop request: the training loop
finishes the update it is in, rank 0 saves a checkpoint and the logs (MLPerf run_stop
with status aborted), and the process exits with 128 + the signal number (143 for
SIGTERM, 130 for SIGINT). Running the same command again resumes from that checkpoint.
A second signal, one second or more after the first, exits at once with the same status
(a signal that follows within the second is taken as the same request: launchers and
schedulers often deliver one stop twice, e.g. to the job's processes and through
horovodrun). Before training starts (or in an evaluation-only run) there is nothing to
save, and a signal exits at once. Exiting at once, rank 0 still ends its MLPerf log with
run_stop, status aborted (logs.end_open_runs).

With several ranks they may get the signal at different moments, or only some of them.
They agree through the update itself: every update's session run feeds this rank's
signal number (0: none) into one all-reduce (agreed_signal: the sum of one-hot vectors,
whose highest non-zero place is the largest number), and every rank stops after the
update whose result is above 0. So all ranks stop at the same step and exit with the
same status. The vector depends on nothing, so Horovod's background thread reduces it
while the step computes (a Horovod timeline shows it done before the gradients are
ready): it adds no wait to the update.

Python runs signal handlers only between bytecodes, so not inside a long session run;
the signals are therefore watched by a thread reading signal.set_wakeup_fd's socket,
which sees each one at once.
"""

import os
import signal
import socket
import threading
import time

import tensorflow.compat.v1 as tf

from bert_pretrain import errors
from bert_pretrain.training import logs

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# A repeat within this many seconds of the first signal is the same stop request.
REPEAT_WINDOW_S = 1.0
_MAX_SIGNAL = 64  # Linux signal numbers are 1..64.


def exit_status(signum):
  """The process exit status of a run stopped by signal `signum`: 128 + signum."""
  return 128 + int(signum)


class StopRequest(object):
  """The stop request of this process, set by SIGTERM or SIGINT.

  Usage: install() at the start of the program (main thread), arm() when training
  starts; `signum` is then the first signal received (0: none).
  """

  def __init__(self):
    self.signum = 0
    self._armed = False
    self._unarmed_when = "before training started"
    self._first_time = None
    self._thread = None

  def install(self):
    """Installs the handlers and the watching thread. Call from the main thread."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    self._sockets = (reader, writer)
    for signum in SIGNALS:
      # The Python-level handler does nothing: the thread acts on the wakeup bytes.
      signal.signal(signum, lambda *_: None)
    signal.set_wakeup_fd(writer.fileno())
    self._thread = threading.Thread(target=self._watch, name="stop_request", daemon=True)
    self._thread.start()

  def arm(self):
    """From now on a first signal requests a stop instead of exiting at once."""
    self._armed = True

  def disarm(self, when):
    """From now on a signal exits at once, saying it came `when` (e.g. "after training")."""
    self._armed = False
    self._unarmed_when = when

  @property
  def requested(self):
    return self.signum != 0

  def _watch(self):
    reader = self._sockets[0]
    while True:
      data = reader.recv(64)
      if not data:
        return
      for signum in bytearray(data):
        # The wakeup socket gets every signal that has a Python handler.
        if signum in SIGNALS:
          self._on_signal(signum)

  def _on_signal(self, signum):
    signame = errors.signal_name(signum)
    if not self._armed:
      _exit_now("%s %s: exiting (nothing to save)"
                % (signame, self._unarmed_when), signum)
    if self._first_time is None:
      self._first_time = time.time()
      self.signum = signum
      # The stop's next line says how to resume (the demo's command makes a new folder).
      _write_stderr("run_pretraining: %s received: finishing the current update, then saving "
                    "a checkpoint (send %s again, %g s or more later, to exit at once)"
                    % (signame, signame, REPEAT_WINDOW_S))
    elif time.time() - self._first_time >= REPEAT_WINDOW_S:
      _exit_now("second %s: exiting at once; the run resumes from its last "
                "checkpoint" % signame, signum)


def agreed_signal(feed, ranks=None):
  """The graph side of the stop request: one scalar per update, agreed on by all ranks.

  Args:
    feed: float32 scalar placeholder (default 0) that takes this rank's signal number.
    ranks: (optional) ranks.Ranks of several replicas; call in a replica's graph.

  Returns:
    float32 scalar Tensor, the largest signal number of all ranks (0: no rank was
    signalled). Fetch it in the same session run as the update, on every rank.
  """
  if ranks is None:
    return tf.identity(feed)
  # How many replicas got each signal number, summed over the replicas: the largest
  # number some replica got.
  counts = ranks.all_reduce([tf.one_hot(tf.cast(feed, tf.int32), _MAX_SIGNAL + 1)],
                            average=False, name="stop_signal")[0]
  return tf.reduce_max(tf.where(counts > 0, tf.range(_MAX_SIGNAL + 1, dtype=tf.float32),
                                tf.zeros_like(counts)))


def _write_stderr(message):
  # os.write: safe from a thread while the main thread may hold sys.stderr's lock.
  os.write(2, (message + "\n").encode())


def _exit_now(how, signum):
  """Says `how` the run ends (also to its logs, logs.end_open_runs) and exits at once."""
  _write_stderr("run_pretraining: " + how)
  logs.end_open_runs(how)
  os._exit(exit_status(signum))  # pylint: disable=protected-access
