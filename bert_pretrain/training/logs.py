"""Run logs of BERT pretraining: console lines, MLPerf mllog, JSON lines, TensorBoard.

One RunLogger per rank. Rank 0 writes everything; other ranks write nothing, so N
ranks give one log. A JSON-lines log that a killed run left with half a record is cut
back to its last complete line before a resumed run appends to it. The console lines are the ones users grep:

  Step 100, total_loss: 7.1, mlm_loss: 6.4, nsp_loss: 0.69, learning_rate: 1e-4,
    sentences_per_second: 812.3
  ***** Eval results *****
    masked_lm_accuracy = 0.41
"""

import contextlib
import json
import os
import sys
import threading
import time

import tensorflow.compat.v1 as tf

from mlperf_logging import mllog

# RunLogger.mlperf's kinds -> mllog's event types.
_MLLOG_EVENT_TYPES = {"event": mllog.constants.POINT_IN_TIME,
                      "start": mllog.constants.INTERVAL_START,
                      "end": mllog.constants.INTERVAL_END}


def whole_lines():
  """Makes stdout and stderr write each line in one piece. Unbuffered (PYTHONUNBUFFERED=1,
  common in containers), print writes a line's text and its newline apart, and mpirun
  --tag-output, reading them as two pieces, tags the newline too: a stray
  "[1,0]<stdout>:" at the end of a line that log parsers then miss. (A line longer than
  the text layer's 8 KB chunk still goes in pieces.)"""
  for stream in (sys.stdout, sys.stderr):
    if hasattr(stream, "reconfigure"):  # a stream replaced by another object may lack it
      stream.reconfigure(write_through=False, line_buffering=True)


# The chief's RunLoggers of this process that are open (end_open_runs ends their runs).
_OPEN_LOGGERS = []


class RunLogger(object):
  """Writes the run's events to the console and the machine-readable logs.

  Args:
    output_dir: folder of the TensorBoard events (None: no TensorBoard).
    is_chief: only the chief (rank 0) writes.
    dllog_path: (optional) path of the JSON-lines log.
    mllog_path: (optional) path of the MLPerf log (the :::MLLOG lines).
  """

  def __init__(self, output_dir=None, is_chief=True, dllog_path=None, mllog_path=None):
    self.is_chief = is_chief
    self._dllog = None
    self._summary_writer = None
    self._mllog = None
    self._run_open = False  # MLPerf's run_start logged, its run_stop not yet
    self._mllog_lock = threading.Lock()  # a line at a time: end_open_runs is another thread
    self._dllog_lock = threading.Lock()  # likewise
    if not is_chief:
      return
    if dllog_path:
      _makedirs_for(dllog_path)
      cut = drop_partial_line(dllog_path)
      if cut:
        print("%s: dropped the last %d bytes, a record cut short (the run writing it was "
              "killed)" % (dllog_path, cut))
      self._dllog = open(dllog_path, "a")
    if output_dir:
      self._summary_writer = tf.summary.FileWriter(output_dir)
    # The :::MLLOG lines go to their own file only, so that the console stays readable;
    # MLCommons' compliance checker reads that file.
    if mllog_path:
      _makedirs_for(mllog_path)
      self._mllog = open(mllog_path, "a")
    _OPEN_LOGGERS.append(self)

  def print(self, message):
    """A console line (chief only), flushed at once so pipes and tee show progress."""
    if self.is_chief:
      print(message)
      sys.stdout.flush()

  def mlperf(self, key, value=None, metadata=None, kind="event", wait_s=-1):
    """An MLPerf :::MLLOG line as mlperf_logging's mllog writes it (its fields in its
    order, the caller's file and line in the metadata); kind is "event", "start" or
    "end". Written here: mllog finds the caller with inspect, which scans every loaded
    module on its first call, 0.3 to 1 s of each run's start with TensorFlow loaded.
    wait_s: how long to wait for another thread's line (-1: as long as it takes)."""
    if self._mllog is None:
      return
    caller = sys._getframe(1)  # pylint: disable=protected-access
    fields = {"file": caller.f_code.co_filename, "lineno": caller.f_lineno}
    fields.update(metadata or {})
    record = {"namespace": "worker0", "time_ms": int(time.time() * 1e3),
              "event_type": _MLLOG_EVENT_TYPES[kind], "key": key, "value": value,
              "metadata": fields}
    # numpy numbers and arrays as mllog's encoder writes them.
    line = ":::MLLOG %s\n" % json.dumps(record, default=lambda v: v.tolist())
    if not self._mllog_lock.acquire(timeout=wait_s):
      return
    try:
      if key == mllog.constants.RUN_STOP and not self._run_open:
        return  # ended already (end_open_runs, another thread)
      self._mllog.write(line)
      self._mllog.flush()
      if key in (mllog.constants.RUN_START, mllog.constants.RUN_STOP):
        self._run_open = key == mllog.constants.RUN_START
    finally:
      self._mllog_lock.release()

  @property
  def writes_mlperf(self):
    """Whether this logger writes an MLPerf log (the chief of a run that trains)."""
    return self._mllog is not None

  @contextlib.contextmanager
  def run_stop_on_error(self):
    """Logs MLPerf's run_stop with status aborted when the block raises between run_start
    and run_stop (a bad record read on the clock, out of memory, a rank lost): the MLPerf
    log then ends as a failed run does, not cut short."""
    try:
      yield
    except BaseException:
      if self._run_open:
        self.mlperf(mllog.constants.RUN_STOP, kind="end", metadata={"status": "aborted"})
      raise

  def metrics(self, step, values, prefix="train"):
    """Logs a dict of scalars at `step` to the JSON-lines log and TensorBoard."""
    if not self.is_chief:
      return
    if self._dllog is not None:
      record = {"timestamp": time.time(), "type": prefix, "step": int(step)}
      record.update({k: float(v) for k, v in values.items()})
      self._write_dllog(record)
    if self._summary_writer is not None:
      summary = tf.Summary(value=[tf.Summary.Value(tag="%s/%s" % (prefix, k),
                                                   simple_value=float(v))
                                  for k, v in values.items()])
      self._summary_writer.add_summary(summary, int(step))

  def record(self, kind, values, wait_s=-1):
    """Logs a dict of JSON values (strings too) as one record of type `kind` to the
    JSON-lines log, e.g. the run's device. wait_s: as mlperf's."""
    if self.is_chief and self._dllog is not None:
      record = {"timestamp": time.time(), "type": kind}
      record.update(values)
      self._write_dllog(record, wait_s)

  def _write_dllog(self, record, wait_s=-1):
    if not self._dllog_lock.acquire(timeout=wait_s):
      return
    try:
      self._dllog.write(json.dumps(record) + "\n")
      self._dllog.flush()
    finally:
      self._dllog_lock.release()

  def warning(self, step, message):
    """A run-health warning: a console line and a dllog.json record of type "warning"."""
    self.print("warning: " + message)
    self.record("warning", {"step": int(step), "message": message})

  def eval_results(self, step, results, output_dir, samples=None):
    """Prints Google BERT's eval block and writes output_dir/eval_results.txt; `samples`
    (training samples so far) goes to the JSON-lines log beside the results."""
    if not self.is_chief:
      return
    lines = ["  %s = %s" % (key, results[key]) for key in sorted(results)]
    self.print("***** Eval results *****")
    for line in lines:
      self.print(line)
    if output_dir:
      with tf.gfile.GFile(os.path.join(output_dir, "eval_results.txt"), "w") as writer:
        writer.write("global_step = %d\n" % step)
        writer.write("\n".join(line.strip() for line in lines) + "\n")
    self.metrics(step, dict(results, samples=samples) if samples is not None else results,
                 prefix="eval")

  def close(self):
    if self in _OPEN_LOGGERS:
      _OPEN_LOGGERS.remove(self)
    if self._dllog is not None:
      with self._dllog_lock:
        self._dllog.close()
    if self._summary_writer is not None:
      self._summary_writer.close()
    if self._mllog is not None:
      with self._mllog_lock:
        self._mllog.close()


def end_open_runs(how):
  """For a process about to end at once (os._exit from another thread: a signal, the
  stall watchdog): logs MLPerf's run_stop with status aborted in every MLPerf log of this
  process whose run is open, so that it ends as a failed run's does, not cut short, and
  a record of type "ended" saying `how` in every JSON-lines log, which the report names
  (a part without a summary is otherwise taken for one killed or failed). A logger busy
  for 2 s (a hung disk) is left as it is."""
  for logger in list(_OPEN_LOGGERS):
    try:
      logger.mlperf(mllog.constants.RUN_STOP, kind="end", metadata={"status": "aborted"},
                    wait_s=2.0)
      logger.record("ended", {"how": how}, wait_s=2.0)
    except (OSError, ValueError):  # a full disk, or closed meanwhile: the exit goes on
      pass


def new_log_path(folder, stem, suffix):
  """folder/stem+suffix, or stem.2+suffix, stem.3+suffix... when earlier runs (a resumed
  output_dir) left one: each run's MLPerf log must hold one run only."""
  path = os.path.join(folder, stem + suffix)
  number = 2
  while tf.gfile.Exists(path):
    path = os.path.join(folder, "%s.%d%s" % (stem, number, suffix))
    number += 1
  return path


def drop_partial_line(path):
  """Cuts a JSON-lines file back to its last complete line: a run killed while writing a
  record leaves part of one, to which the next run would append its first record.

  Returns:
    the number of bytes dropped (0: none, or no file).
  """
  try:
    with open(path, "rb+") as f:
      size = end = f.seek(0, os.SEEK_END)
      while end > 0:  # Back from the end, 64 KB at a time, to the last newline.
        start = max(0, end - 65536)
        f.seek(start)
        newline = f.read(end - start).rfind(b"\n")
        if newline >= 0:
          end = start + newline + 1
          break
        end = start
      f.truncate(end)
      return size - end
  except FileNotFoundError:
    return 0


def _makedirs_for(path):
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    os.makedirs(folder)
