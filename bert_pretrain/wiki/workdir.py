"""The output folder: its paths, atomic writes, done-markers, progress lines and lock.

Every file is written under a temporary name and renamed when complete (atomic_output),
and every finished unit of work (a chunk, the shards, a TFRecord shard) leaves a
done-marker in work/done/ with its settings, inputs and outputs. A run started again
after a kill skips every unit whose marker matches and whose outputs are there
(marker_is_valid), and redoes the rest. Each long step prints a progress line with its
rate and ETA to stderr every 15 s (Progress). One run at a time holds the folder (locked).
"""

import concurrent.futures
import contextlib
import ctypes
import errno
import faulthandler
import fcntl
import functools
import hashlib
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

from bert_pretrain import errors
from bert_pretrain.distributed import stacks

# Bumped when a step's output for the same input changes, so old folders are refused.
FORMAT_VERSION = 1
# The settings each step's outputs depend on (besides its inputs), kept in its markers.
STEP_SETTINGS = {
    "extract": ("format_version", "dump_name", "dump_bytes", "pages_per_chunk"),
    "clean": ("format_version", "min_article_chars"),
    "segment": ("format_version",),
    "shard": ("format_version", "num_shards", "num_eval_articles"),
    "tfrecords": ("format_version", "vocab_sha256", "do_lower_case", "max_seq_length",
                  "max_predictions_per_seq", "masked_lm_prob", "short_seq_prob",
                  "dupe_factor", "random_seed", "do_whole_word_mask"),
    "eval": ("format_version", "num_eval_samples"),
    "pack": ("format_version", "max_sequences_per_pack", "random_seed"),
    # The steps of python3 -m bert_pretrain.pack_records, in its own output folder.
    "pack_lengths": ("pack_version",),
    "pack_plan": ("pack_version", "max_sequences_per_pack", "seed", "num_output_files"),
    "pack_write": ("pack_version", "max_sequences_per_pack", "seed", "num_output_files"),
}
_HASH_BLOCK = 4 << 20
_PR_SET_PDEATHSIG = 1  # prctl's option: the signal a process gets when its parent ends
# The errors of a write that found no room: only a write raises them, so it is the file's.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class PrepareError(Exception):
  """A problem with the input or the output folder; the message says how to fix it."""


def remove_quietly(path):
  """Deletes path if it is there."""
  try:
    os.remove(path)
  except OSError:
    pass


@contextlib.contextmanager
def atomic_output(path, binary=False):
  """Opens `path` for writing under a temporary name, renamed into place on success.

  A reader (or a resumed run) never sees a half-written file under the final name; on
  any error the temporary file is removed.

  Args:
    path: the final path.
    binary: open in binary mode, else UTF-8 text with "\\n" newlines.

  Yields:
    the open file object.
  """
  temporary = "%s.tmp-%d" % (path, os.getpid())
  if binary:
    handle = open(temporary, "wb")
  else:
    handle = open(temporary, "w", encoding="utf-8", newline="\n")
  try:
    yield handle
    handle.close()
    os.replace(temporary, path)
  except BaseException as e:
    try:
      handle.close()
    except OSError:
      pass
    remove_quietly(temporary)
    if isinstance(e, OSError) and e.errno in _DISK_FULL and not e.filename:
      # write() and close() name no file; a full disk's line should say which one.
      raise OSError(e.errno, e.strerror, path) from e
    raise


@contextlib.contextmanager
def atomic_records(path):
  """A TFRecordWriter for `path`, as atomic_output: under a temporary name renamed into
  place on success, removed on any error; TensorFlow's write error becomes an OSError
  (records.os_error_from_tf), so a full disk reads as elsewhere.

  Yields:
    the tf.io.TFRecordWriter.
  """
  from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  temporary = "%s.tmp-%d" % (path, os.getpid())
  writer = None
  try:
    writer = tf.io.TFRecordWriter(temporary)
    yield writer
    writer.close()
    os.replace(temporary, path)
  except BaseException as e:
    try:
      if writer is not None:
        writer.close()
    except tf.errors.OpError:
      pass
    remove_quietly(temporary)
    if isinstance(e, tf.errors.OpError):
      raise records.os_error_from_tf(e, path) from e
    raise


def write_json(path, value):
  """Writes `value` as sorted, indented JSON, atomically."""
  with atomic_output(path) as writer:
    json.dump(value, writer, indent=1, sort_keys=True, ensure_ascii=False)
    writer.write("\n")


def read_json(path):
  """Returns the JSON value in `path`, or None if it is missing or unreadable."""
  try:
    with open(path, encoding="utf-8") as reader:
      return json.load(reader)
  except (OSError, ValueError):
    return None


def file_digest(path):
  """Returns {"bytes": size, "sha256": hex digest} of a file."""
  digest = hashlib.sha256()
  size = 0
  with open(path, "rb") as reader:
    while True:
      block = reader.read(_HASH_BLOCK)
      if not block:
        break
      size += len(block)
      digest.update(block)
  return {"bytes": size, "sha256": digest.hexdigest()}


def remove_stale_temporaries(folder):
  """Deletes the temporary files a killed run left in `folder` (one level)."""
  if not os.path.isdir(folder):
    return
  for name in os.listdir(folder):
    if ".tmp-" in name or name.endswith(".tmp"):
      remove_quietly(os.path.join(folder, name))


def remove_dead_temporaries(paths):
  """Deletes the temporary files (<path>.tmp-<pid>) that killed processes left beside
  `paths`, where the folder is not the run's own; those of a process still running on
  this host stay (a run on another host writing the same paths on a shared disk would
  lose its own)."""
  for path in paths:
    folder, name = os.path.split(os.path.abspath(path))
    if "://" in path or not os.path.isdir(folder):
      continue
    for other in os.listdir(folder):
      match = re.match(r"^%s\.tmp-(\d+)$" % re.escape(name), other)
      if match and not _process_exists(int(match.group(1))):
        remove_quietly(os.path.join(folder, other))


def _process_exists(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass
  return True


class Layout(object):
  """The paths of one output folder."""

  def __init__(self, output_dir):
    self.root = output_dir
    self.settings = os.path.join(output_dir, "settings.json")
    self.manifest = os.path.join(output_dir, "manifest.json")
    self.lock = os.path.join(output_dir, ".lock")
    self.work = os.path.join(output_dir, "work")
    self.extracted = os.path.join(self.work, "extracted")
    self.cleaned = os.path.join(self.work, "cleaned")
    self.sentences = os.path.join(self.work, "sentences")
    self.done = os.path.join(self.work, "done")
    self.text_train = os.path.join(output_dir, "text", "train")
    self.text_eval = os.path.join(output_dir, "text", "eval")
    self.eval_text = os.path.join(self.text_eval, "eval.txt")
    self.train_data = os.path.join(output_dir, "train_data")
    self.eval_intermediate = os.path.join(output_dir, "eval_intermediate")
    self.eval_all = os.path.join(self.eval_intermediate, "eval_all")
    self.eval_data = os.path.join(output_dir, "eval_data")
    self.packed_train_data = os.path.join(output_dir, "packed_train_data")

  def chunk(self, folder, index):
    return os.path.join(folder, "chunk-%05d.jsonl" % index)

  def shard_name(self, index, num_shards):
    return "part-%05d-of-%05d" % (index, num_shards)

  def marker(self, step, name=None):
    if name is None:
      return os.path.join(self.done, step + ".json")
    return os.path.join(self.done, step, name + ".json")

  def relative(self, path):
    return os.path.relpath(path, self.root)

  def absolute(self, relative_path):
    return os.path.join(self.root, relative_path)


def step_settings(settings, step):
  """The subset of `settings` that the outputs of `step` depend on."""
  return {key: settings.get(key) for key in STEP_SETTINGS[step]}


def marker_is_valid(layout, marker, settings, step, inputs=None):
  """Whether a done-marker says its unit is complete for these settings and inputs.

  Args:
    layout: Layout.
    marker: dict read from the marker file, or None.
    settings: dict of the run's settings.
    step: the step name.
    inputs: (optional) dict path -> sha256 the unit was made from.

  Returns:
    bool: the marker matches the settings and inputs, and each output it lists exists
    with the recorded size (a truncated or replaced file is redone).
  """
  if not marker or marker.get("settings") != step_settings(settings, step):
    return False
  if inputs is not None and marker.get("inputs") != inputs:
    return False
  for relative_path, digest in marker.get("outputs", {}).items():
    path = layout.absolute(relative_path)
    if not os.path.isfile(path) or os.path.getsize(path) != digest["bytes"]:
      return False
  return True


class Progress(object):
  """Prints one progress line with rate and ETA to stderr every `interval` seconds."""

  def __init__(self, step, total, unit="MB", scale=1e6, interval=15.0, tool="prepare_wiki"):
    """Creates the progress line.

    Args:
      step: the step name shown first.
      total: the total amount of work, in the units of update().
      unit: the unit shown.
      scale: the amount per shown unit (1e6 for MB of bytes).
      interval: seconds between lines.
      tool: the name the line starts with.
    """
    self.tool = tool
    self.step = step
    self.total = max(total, 1)
    self.unit = unit
    self.scale = scale
    self.interval = interval
    self.start = time.time()
    self.last_print = self.start
    self.done = 0

  def update(self, done, force=False):
    """Sets the amount done; prints when `interval` has passed (or force)."""
    self.done = done
    now = time.time()
    if not force and now - self.last_print < self.interval:
      return
    self.last_print = now
    elapsed = now - self.start
    fraction = min(self.done / self.total, 1.0)
    rate = self.done / self.scale / elapsed if elapsed > 0 else 0.0
    if 0 < fraction < 1:
      eta = _format_seconds(elapsed / fraction - elapsed)
    else:
      eta = "-"
    sys.stderr.write("%s: %-9s %5.1f%%  %.1f/%.1f %s  %.2f %s/s  elapsed %s  "
                     "ETA %s\n" % (self.tool, self.step, 100 * fraction, self.done / self.scale,
                                   self.total / self.scale, self.unit, rate, self.unit,
                                   _format_seconds(elapsed), eta))
    sys.stderr.flush()


def _format_seconds(seconds):
  seconds = int(seconds)
  return "%d:%02d:%02d" % (seconds // 3600, seconds // 60 % 60, seconds % 60)


def say(message, tool="prepare_wiki"):
  sys.stderr.write("%s: %s\n" % (tool, message))
  sys.stderr.flush()


class WorkerDied(PrepareError):
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
        self.submit(int).result()
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
  try:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signum)
  except (OSError, AttributeError):  # not Linux: the child outlives a killed parent
    return
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


def run(command, timeout=None, preexec_fn=None, **kwargs):
  """Runs command to its end as subprocess.run does (kwargs are Popen's: stdout=PIPE
  captures) from a tool's main thread: a Ctrl-C or SIGTERM that comes as the child is
  forked is not lost (errors.stops_held), nor one another thread takes (communicate). The
  child takes them as by default, then runs preexec_fn. On any exception (a stop, the
  timeout) the child is killed and reaped."""
  process = None
  try:
    with errors.stops_held():
      process = subprocess.Popen(command, preexec_fn=functools.partial(
          _start_held_child, preexec_fn), **kwargs)
    stdout, stderr = communicate(process, timeout)
  except BaseException:
    if process is not None:
      process.kill()
      with process:  # closes its pipes and reaps it
        pass
    raise
  return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _start_held_child(preexec_fn):
  errors.stops_to_default()
  if preexec_fn is not None:
    preexec_fn()


def arm_stacks():
  """SIGUSR2 (stacks.STACK_SIGNAL) writes this process's Python stacks to stderr: what
  a run that seems stuck is doing. Forked workers keep it."""
  faulthandler.register(stacks.STACK_SIGNAL, all_threads=True)


def run_tasks(function, tasks, jobs, on_result, context="fork"):
  """Runs function(task) for every task, `jobs` at once; on_result(result) in the caller.

  With one job the tasks run in this process (no pickling, plain tracebacks). A failing
  task stops the others; the tasks already finished have left their markers.

  Args:
    function: a module-level function of one argument.
    tasks: list of arguments.
    jobs: processes to use.
    on_result: called in this process with each result, in completion order.
    context: multiprocessing start method for the workers.

  Raises:
    WorkerDied: a worker process ended without finishing its task.
  """
  if jobs <= 1 or len(tasks) <= 1:
    for task in tasks:
      on_result(function(task))
    return
  with WorkerPool(min(jobs, len(tasks)), context) as pool:
    futures = [pool.submit(function, task) for task in tasks]
    for future in concurrent.futures.as_completed(futures):
      on_result(future.result())


@contextlib.contextmanager
def locked(layout, tool="prepare_wiki"):
  """Holds an exclusive lock on output_dir, so two runs never write the same files."""
  handle = open(layout.lock, "a+")
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    handle.close()
    raise PrepareError("another %s run is using %s; wait for it to finish or "
                       "pass another --output_dir" % (tool, layout.root))
  try:
    yield
  finally:
    handle.close()
