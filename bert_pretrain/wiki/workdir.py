"""The output folder: its paths, atomic writes, done-markers, progress lines and lock.

Every file is written under a temporary name and renamed when complete (atomic_output),
and every finished unit of work (a chunk, the shards, a TFRecord shard) leaves a
done-marker in work/done/ with its settings, inputs and outputs. A run started again
after a kill skips every unit whose marker matches and whose outputs are there
(marker_is_valid), and redoes the rest. Each long step prints a progress line with its
rate and ETA to stderr every 15 s (Progress). One run at a time holds the folder (locked).
"""

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import sys
import time

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


@contextlib.contextmanager
def locked(layout, tool="prepare_wiki"):
  """Holds an exclusive lock on output_dir (made if missing), so two runs never write the
  same files. A run refused within (PrepareError) leaves neither the lock file nor the
  folders it made."""
  made = []  # the folders made, the innermost first
  folder = os.path.abspath(layout.root)
  while not os.path.isdir(folder) and folder not in made:
    made.append(folder)
    folder = os.path.dirname(folder)
  for _ in range(10):
    os.makedirs(layout.root, exist_ok=True)  # again: a refused run may have removed it
    try:
      handle, made_lock = os.fdopen(os.open(layout.lock, os.O_RDWR | os.O_CREAT | os.O_EXCL),
                                    "a+"), True
    except FileExistsError:
      handle, made_lock = open(layout.lock, "a+"), False
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      handle.close()
      raise PrepareError("another %s run is using %s; wait for it to finish or "
                         "pass another --output_dir" % (tool, layout.root))
    # The file may have been removed by a refused run between the open and the lock:
    # a lock on it excludes nobody. Held is the one still at the path.
    try:
      if os.path.samestat(os.fstat(handle.fileno()), os.stat(layout.lock)):
        break
    except OSError:
      pass
    handle.close()
  else:
    raise PrepareError("the lock file %s keeps being removed; is another %s run starting "
                       "there? run again" % (layout.lock, tool))
  try:
    yield
  except PrepareError:
    for remove, path in ([(os.remove, layout.lock)] if made_lock else []) + [
        (os.rmdir, folder) for folder in made]:  # rmdir: only if empty
      try:
        remove(path)
      except OSError:
        break
    raise
  finally:
    handle.close()
