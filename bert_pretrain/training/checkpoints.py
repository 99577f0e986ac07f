"""Finding, loading and saving checkpoints: --init_checkpoint (weights only) and resume.

--init_checkpoint takes a prefix (model.ckpt-28252), the path of one of its files
(model.ckpt-28252.index, model.ckpt-28252.data-00000-of-00001) or a folder (its latest
checkpoint). Only model weights are taken from it: optimizer slots and global_step of a
foreign checkpoint are ignored. A checkpoint of this recipe in --output_dir is resumed
from instead: weights, optimizer state and global_step.

A run reads, rotates and deletes checkpoints only inside its own output_dir: the
`checkpoint` index file is not trusted (older versions wrote absolute paths into it, so
a copied folder resumed from, and rotated away, the original's files); the newest
checkpoint is the complete model.ckpt-<step> with the highest step, and one holding NaN
or Inf is refused. Saving writes relative paths; a save that fails on a full disk
removes its partial files. One run at a time holds output_dir (OutputDirLock), and
run_classifier's output_dir follows the same rules (its run marker names the tool).
check_config tells whether a checkpoint holds the model a bert_config.json describes.
"""

import errno
import fcntl
import json
import os
import re
import shlex
import socket
import time

import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain import config
from bert_pretrain.errors import is_disk_full
from bert_pretrain.model import heads

_CHECKPOINT_FILE_SUFFIX = re.compile(r"\.(index|meta|data-\d{5}-of-\d{5})$")
# A checkpoint without the run marker is someone else's unless it holds DATA_POSITION.
RUN_MARKER = config.RUN_MARKER
# The int64 variable of pretraining.build_train_graph that counts the records of the
# data order the updates consumed: in every checkpoint of this recipe (and no other's),
# so that a resumed run continues the data order there.
DATA_POSITION = "data_position"
# The int64 [2] variable (loop.start_session) of the samples read before and after the
# update a checkpoint was saved after (-1: not known): whether that update reached a
# point of the evaluation schedule, which a resumed run evaluates first and which alone
# goes to MLPerf's log, and where the schedule goes on. Counting back one batch cannot
# tell after updates loss scaling skipped.
UPDATE_SAMPLES = "update_samples"
# This recipe's checkpoints: output_dir/model.ckpt-<global step>.
CHECKPOINT_NAME = "model.ckpt"
_CHECKPOINT_FILE = re.compile(r"^(model\.ckpt-(\d+))\.(index|data-(\d{5})-of-(\d{5}))$")
# What an interrupted save leaves: TensorFlow's temporary files (<name>.tempstate<digits>)
# and the temporary folders of sharded saves (model.ckpt-N_temp...).
_PARTIAL = re.compile(r"^(model\.ckpt-\d+_temp.*|.*\.tempstate\d*)$")
LOCK_FILE = ".bert_pretrain.lock"


# By listing, not tf.gfile.Glob: a folder's name may hold glob characters ([, ?, *).
def index_files(folder):
  """The checkpoint indexes (*.index) in folder, [] if it is none."""
  if not tf.gfile.IsDirectory(folder):
    return []
  return [os.path.join(folder, n) for n in tf.gfile.ListDirectory(folder)
          if n.endswith(".index")]


def check_no_pattern(path, flag):
  """Raises ValueError if path holds a bracket pair: TensorFlow finds a checkpoint's
  files by glob pattern, where [...] is a class that does not match itself (a * or ?
  matches itself, so those paths read back)."""
  pair = re.search(r"\[[^\]/]*\]", path)
  if pair:
    raise ValueError("%s=%s: TensorFlow reads checkpoints by pattern, and the %s in this "
                     "path would not match their files; pass a path without brackets"
                     % (flag, path, pair.group(0)))


def checkpoint_files(prefix):
  """The files of the checkpoint `prefix`: its .index, .data-* shards and .meta, not a
  file a user put beside them (model.ckpt-5.notes)."""
  folder, stem = os.path.split(prefix)
  folder = folder or "."
  own = re.compile(r"^%s\.(index|meta|data-\d{5}-of-\d{5})$" % re.escape(stem))
  if not tf.gfile.IsDirectory(folder):
    return []
  return [os.path.join(folder, n) for n in tf.gfile.ListDirectory(folder) if own.match(n)]


def find_resume_checkpoint(output_dir, settings=None, check_values=True):
  """Returns the prefix of this recipe's newest checkpoint in output_dir, or None.

  The newest is the complete model.ckpt-<step> inside output_dir with the highest step
  (not the `checkpoint` file's pick, which may name another folder, nor the newest file
  time).

  Args:
    output_dir: the run's --output_dir.
    settings: (optional) dict of the settings a resumed run must share with the
      earlier one (write_run_marker stored them).
    check_values: read the checkpoint and refuse it if it is damaged or holds NaN or Inf.

  Raises:
    ValueError: output_dir holds a checkpoint that this recipe did not write (MLPerf's
      model.ckpt-28252 copied there, say): resuming from it would take a foreign
      global_step and optimizer state. Or its newest checkpoint is damaged or holds NaN
      or Inf: the message names the last good one and how to resume from it. Or its RUN_MARKER is
      damaged (read_run_marker).
  """
  check_no_pattern(output_dir, "--output_dir")
  lost = lost_files(output_dir)
  if lost:
    name, missing = lost[0]
    raise ValueError("--output_dir=%s: %s is missing, but the `checkpoint` file there lists "
                     "%s as saved (a save cut short never is): put it back, or to resume "
                     "from an earlier checkpoint move %s.* away; nothing was deleted"
                     % (output_dir, missing, name, name))
  if not index_files(output_dir):
    return None
  earlier = read_run_marker(output_dir)
  found = list_checkpoints(output_dir)
  if earlier is None and not (found and DATA_POSITION in dict(
      tf.train.list_variables(found[-1][1]))):
    raise ValueError("--output_dir=%s holds a checkpoint that is not a checkpoint of this "
                     "run's recipe; to start from its weights pass it as --init_checkpoint with "
                     "a new --output_dir" % output_dir)
  if settings is not None and earlier is not None:
    # run_classifier's settings name it (pretraining's do not): neither resumes the other's.
    if earlier.get("tool") != settings.get("tool"):
      raise ValueError("--output_dir=%s holds the checkpoints of %s, not of %s; pass another "
                       "--output_dir (and one of them as --init_checkpoint to start from it)"
                       % (output_dir, earlier.get("tool") or "run_pretraining",
                          settings.get("tool") or "run_pretraining"))
    changed = sorted(k for k in settings if k in earlier and earlier[k] != settings[k])
    if changed:
      raise ValueError("--output_dir=%s holds a run with other %s (%s); resume with the same "
                       "settings or use a new --output_dir"
                       % (output_dir, ", ".join(changed),
                          "; ".join(_setting_change(k, earlier[k], settings[k])
                                    for k in changed)))
  if not found:
    return None
  if check_values:
    _check_resumable_values(output_dir, found)
  return found[-1][1]


def _setting_change(name, was, now):
  """'max_seq_length was 128, now 512', or for the model config each value that differs."""
  if name != "bert_config":
    return "%s was %s, now %s" % (name, was, now)
  return "; ".join("bert_config.json's %s was %s, now %s" % (k, was.get(k), now.get(k))
                   for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k))


def rerun_advice(output_dir):
  """What running the same command again does after a job stopped early: resume from
  output_dir's newest checkpoint, or start over when none was saved yet."""
  found = list_checkpoints(output_dir) if tf.gfile.IsDirectory(output_dir) else []
  if found:
    return ("checkpoints in %s are kept: rerun the same command to resume from %s"
            % (output_dir, os.path.basename(found[-1][1])))
  return ("no checkpoint was saved in %s yet: the same command run again starts over"
          % output_dir)


def list_checkpoints(output_dir):
  """The complete checkpoints of this recipe in output_dir, by step.

  Only the files in output_dir count, whatever its `checkpoint` file says. A checkpoint
  is complete when its .index and all its .data shards are there (TensorFlow renames
  the index into place last).

  Args:
    output_dir: the run's --output_dir.

  Returns:
    list of (step, prefix), the lowest step first.
  """
  if not tf.gfile.IsDirectory(output_dir):
    return []
  indexes, shards = set(), {}
  for name in tf.gfile.ListDirectory(output_dir):
    match = _CHECKPOINT_FILE.match(name)
    if not match:
      continue
    if match.group(3) == "index":
      indexes.add(match.group(1))
    else:
      shards.setdefault((match.group(1), int(match.group(5))), set()).add(match.group(4))
  found = []
  for (stem, total), present in shards.items():
    if stem in indexes and len(present) == total:
      found.append((int(stem.rsplit("-", 1)[1]), os.path.join(output_dir, stem)))
  return sorted(found)


def write_run_marker(output_dir, record):
  """Marks output_dir as this recipe's: writes RUN_MARKER, the dict `record` (the
  settings its checkpoints need, the layout, seed and data of the run that wrote them),
  under a temporary name first and renamed into place, so a kill never leaves it cut."""
  path = os.path.join(output_dir, RUN_MARKER)
  with tf.gfile.GFile(path + ".tmp", "w") as f:
    f.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
  tf.gfile.Rename(path + ".tmp", path, overwrite=True)


def read_run_marker(output_dir):
  """The dict RUN_MARKER of output_dir holds, or None when there is none.

  Raises:
    ValueError: the file is not a JSON object (cut short by a full disk or an older
      version killed while writing it, or edited); the message names it and the fix.
  """
  path = os.path.join(output_dir, RUN_MARKER)
  if not tf.gfile.Exists(path):
    return None
  try:
    with tf.gfile.GFile(path, "r") as f:
      record = json.loads(f.read())
    if not isinstance(record, dict):
      raise ValueError("not a JSON object")
  except (ValueError, UnicodeDecodeError) as e:
    found = list_checkpoints(output_dir)
    raise ValueError("%s is damaged (%s); it records the settings of the run whose "
                     "checkpoints are in --output_dir=%s: restore it from a copy, or delete "
                     "it (rm %s) and run again to resume from %s with this command's "
                     "settings (the checkpoint's variables are still checked against them)"
                     % (path, str(e).splitlines()[0] if str(e) else type(e).__name__,
                        output_dir, path,
                        os.path.basename(found[-1][1]) if found else "the newest checkpoint"))
  return record


def checkpoint_value(prefix, name):
  """The value of variable `name` in checkpoint `prefix`, or None when it lacks it."""
  reader = tf.train.load_checkpoint(prefix)
  if not reader.has_tensor(name):
    return None
  return reader.get_tensor(name)


def non_finite_variable(prefix):
  """The name of the first variable in a checkpoint that holds NaN or Inf, or None.

  Reads the floating-point tensors one at a time: the I/O of one restore.

  Raises:
    DamagedCheckpoint: a file of the checkpoint is cut short or corrupted.
  """
  try:
    reader = tf.train.load_checkpoint(prefix)
    for name, dtype in sorted(reader.get_variable_to_dtype_map().items()):
      if dtype.is_floating and \
          not np.isfinite(np.asarray(reader.get_tensor(name), np.float32)).all():
        return name
  except (tf.errors.OpError, IndexError) as e:
    raise DamagedCheckpoint.or_error(prefix, e)
  return None


class DamagedCheckpoint(ValueError):
  """A checkpoint whose files cannot be read back (cut short or corrupted on disk)."""

  @classmethod
  def or_error(cls, prefix, error):
    """A DamagedCheckpoint when `error` (raised reading the checkpoint) says its bytes are
    cut short or corrupted, else the error itself: a permission or network error is not
    damage, and its fix is not to move the checkpoint aside."""
    message = str(getattr(error, "message", None) or error)
    # The reader raises IndexError for a .data file cut short, and a bare OpError for
    # a failed checksum.
    if isinstance(error, (IndexError, tf.errors.DataLossError, tf.errors.OutOfRangeError)) \
        or "Checksum does not match" in message:
      return cls(prefix, error)
    return error

  def __init__(self, prefix, error):
    self.prefix = prefix
    # A session's error wraps the reader's line in "Graph execution error:", the node
    # and a stack: the reader's line is the last that is none of those.
    lines = [l.strip() for l in str(getattr(error, "message", None) or error).splitlines()]
    self.reason = ([l for l in lines if l and not l.startswith((
        "Graph execution error", "Detected at node", "File ", "Node:", "[["))]
                   or [type(error).__name__])[-1]
    super(DamagedCheckpoint, self).__init__(
        "checkpoint %s is damaged (%s): cut short or corrupted on disk; pass a complete "
        "checkpoint" % (prefix, self.reason))


def all_finite(variables):
  """A bool scalar Tensor: no floating-point variable among `variables` holds NaN or Inf.

  Run before each save (cheap next to the save itself). With float16 loss scaling a
  step whose gradients overflow is skipped and leaves the variables finite, so it
  passes.
  """
  return tf.reduce_all(tf.stack([tf.reduce_all(tf.is_finite(v)) for v in variables
                                 if v.dtype.base_dtype.is_floating]))


def _problem(prefix):
  """What keeps a run from resuming at a checkpoint ("holds NaN or Inf (<variable>)", "is
  damaged (<reason>)"), or None."""
  try:
    name = non_finite_variable(prefix)
  except DamagedCheckpoint as e:
    return "is damaged (%s)" % e.reason
  return None if name is None else "holds NaN or Inf (%s)" % name


def _check_resumable_values(output_dir, found):
  """Raises ValueError if the newest of `found` is damaged or holds NaN or Inf; names the
  last good one and how to resume from it.

  Args:
    output_dir: the run's --output_dir.
    found: list_checkpoints(output_dir), not empty.
  """
  problem = _problem(found[-1][1])
  if problem is None:
    return
  bad, good = [found[-1]], None
  for step, prefix in reversed(found[:-1]):
    if _problem(prefix) is None:
      good = prefix
      break
    bad.append((step, prefix))
  diverged = problem.startswith("holds")
  what = "--output_dir=%s: its newest checkpoint %s %s, %s" % (
      output_dir, os.path.basename(found[-1][1]), problem,
      "the run that wrote it diverged" if diverged else "cut short or corrupted on disk")
  if good is None:
    raise ValueError("%s, and no checkpoint there can be resumed; start again with a new "
                     "--output_dir%s" % (what, " and a lower --learning_rate" if diverged
                                         else ""))
  folder = "diverged" if diverged else "damaged"
  raise ValueError("%s; the last good one is %s: to resume from it move the newer ones away "
                   "(cd %s && mkdir -p %s && mv %s %s/) and run %s, or start a new "
                   "--output_dir with --init_checkpoint=%s (weights only)"
                   % (what, os.path.basename(good), shlex.quote(output_dir), folder,
                      " ".join("%s.*" % os.path.basename(p) for _, p in sorted(bad)), folder,
                      "again with a lower --learning_rate" if diverged else
                      "the same command again", good))


def lost_files(output_dir):
  """The files missing of the checkpoints of output_dir that TensorFlow's `checkpoint`
  file lists (it is written after their .index and .data): saves that had finished, not
  ones cut short, so never removed; [(checkpoint name, missing file name)], e.g.
  [("model.ckpt-4", "model.ckpt-4.index")]."""
  try:
    state = tf.train.get_checkpoint_state(output_dir)
  except (tf.errors.OpError, ValueError):
    return []
  listed = {os.path.basename(p) for p in ([state.model_checkpoint_path] +
                                          list(state.all_model_checkpoint_paths))} \
      if state else set()
  names = [n.rstrip("/") for n in tf.gfile.ListDirectory(output_dir)] \
      if tf.gfile.IsDirectory(output_dir) else []
  files = [m for m in (_CHECKPOINT_FILE.match(n) for n in names) if m]
  indexed = {m.group(1) for m in files if m.group(3) == "index"}
  lost = []
  for name in sorted(listed & {m.group(1) for m in files}):
    missing = (name + ".index" if name not in indexed else
               _missing_shard(os.path.join(output_dir, name)))
    if missing:
      lost.append((name, missing))
  return lost


def remove_partial_checkpoints(output_dir, step=None):
  """Deletes what an interrupted or failed save left in output_dir.

  That is TensorFlow's temporary files (*.tempstate*), the temporary folders of sharded
  saves, and the files of checkpoints that are not complete (no .index: TensorFlow
  writes it last); with `step`, also every file of model.ckpt-<step> (its save failed).

  Args:
    output_dir: the run's --output_dir.
    step: (optional) the step of a save that failed.

  Returns:
    sorted list of the names removed.
  """
  if not tf.gfile.IsDirectory(output_dir):
    return []
  complete = set(os.path.basename(p) for _, p in list_checkpoints(output_dir))
  # Saved once: not for this function to delete.
  complete.update(name for name, _ in lost_files(output_dir))
  removed = []
  for name in tf.gfile.ListDirectory(output_dir):
    name = name.rstrip("/")
    match = _CHECKPOINT_FILE.match(name)
    if not (_PARTIAL.match(name) or
            (match and (match.group(1) not in complete or
                        (step is not None and int(match.group(2)) == step)))):
      continue
    path = os.path.join(output_dir, name)
    try:
      if tf.gfile.IsDirectory(path):
        tf.gfile.DeleteRecursively(path)
      else:
        tf.gfile.Remove(path)
      removed.append(name)
    except tf.errors.OpError:
      pass
  return sorted(removed)


def disk_full_message(output_dir, what, resumes=True):
  """One line: the disk of output_dir filled up while writing `what`, and what to do.

  Args:
    output_dir: the folder written to.
    what: what was being written (a file name, "checkpoint model.ckpt-N").
    resumes: a run that resumes from its checkpoints (run_pretraining); else a tool that
      writes its files anew.
  """
  try:
    stat = os.statvfs(output_dir)
    free = ", %.1f MB free" % (stat.f_bavail * stat.f_frsize / 1e6)
  except OSError:
    free = ""
  where = ("the disk is full (no space left on the device of --output_dir=%s%s) while "
           "writing %s" % (output_dir, free, what))
  if not resumes:
    return "%s; free space there and run the same command again" % where
  found = list_checkpoints(output_dir)
  if not found:
    return "%s; free space there, then run the same command again: it starts anew" % where
  newest = found[-1][1]
  size = sum(tf.gfile.Stat(path).length for path in checkpoint_files(newest))
  # The oldest checkpoint goes only once the new one is saved: a lower
  # --keep_checkpoint_max frees nothing before that.
  return ("%s; free space there (a checkpoint takes %.1f MB beside the ones kept), then run "
          "the same command again: it resumes from %s"
          % (where, size / 1e6, os.path.basename(newest)))


class DiskFullError(ValueError):
  """No space left on the device of output_dir; the message says where and what to do."""


def save_checkpoint(saver, sess, output_dir, step, resumes=True, keep=0):
  """Saves output_dir/model.ckpt-<step>; on a full disk removes its partial files.

  Args:
    saver: a tf.train.Saver made with save_relative_paths=True and max_to_keep=None
      (this function rotates).
    sess: the session.
    output_dir: the run's --output_dir.
    step: the global step, the checkpoint's number.
    resumes: the run resumes from its checkpoints (disk_full_message).
    keep: once saved, the checkpoints kept in output_dir (remove_old_checkpoints); 0
      keeps all.

  Returns:
    the checkpoint prefix.

  Raises:
    DiskFullError: no space left; the earlier checkpoints are intact.
  """
  try:
    prefix = saver.save(sess, os.path.join(output_dir, CHECKPOINT_NAME), global_step=step,
                        write_meta_graph=False)
  except (tf.errors.OpError, EnvironmentError) as e:
    if not is_disk_full(e):
      raise
    remove_partial_checkpoints(output_dir, step)
    raise DiskFullError(disk_full_message(output_dir, "checkpoint %s-%d"
                                          % (CHECKPOINT_NAME, step), resumes))
  remove_old_checkpoints(output_dir, keep)
  return prefix


def remove_old_checkpoints(output_dir, keep):
  """Deletes the complete checkpoints in output_dir but the newest `keep` (0: none),
  those of the runs this one resumed too: they are one run. TensorFlow's own rotation
  would forget the earlier runs' or delete one of them a save.

  Returns:
    the names of the checkpoints deleted.
  """
  old = list_checkpoints(output_dir)[:-keep] if keep else []
  for _, prefix in old:
    # The index first: a deletion cut short leaves a checkpoint without its index,
    # which the next run removes (remove_partial_checkpoints).
    for path in sorted(checkpoint_files(prefix), key=lambda p: not p.endswith(".index")):
      try:
        tf.gfile.Remove(path)
      except tf.errors.NotFoundError:  # gone already (another process, a user)
        pass
  return [os.path.basename(prefix) for _, prefix in old]


class OutputDirLock(object):
  """An exclusive lock on output_dir for the life of this process.

  fcntl.flock on output_dir/.bert_pretrain.lock: the kernel drops it when the process
  ends, however it ends, so a SIGKILLed run does not block the next one. The file names
  the holder. In a Horovod job rank 0 takes it for the whole job.
  """

  def __init__(self, output_dir):
    self.output_dir = output_dir
    self._handle = None

  def acquire(self, wait=False):
    """Takes the lock, or raises ValueError naming the live run that holds it.

    Args:
      wait: wait for the holder to end instead (the demo's cache: the second of two
        demos started at once finds what the first built).
    """
    handle = open(os.path.join(self.output_dir, LOCK_FILE), "a+")
    self._take(handle, wait)
    handle.seek(0)
    handle.truncate()
    handle.write("pid %d on %s" % (os.getpid(), socket.gethostname()))
    handle.flush()
    self._handle = handle  # Kept open: closing the file would drop the lock.

  def check_free(self):
    """Raises ValueError as acquire() would, without taking the lock or writing anything
    (--check_only, and every process of a job before its chief takes it). A shared lock
    for a moment: the processes of one job may look at once."""
    path = os.path.join(self.output_dir, LOCK_FILE)
    try:
      # Opened for writing, unchanged: NFS and CIFS lock only files open so.
      handle = open(path, "r+")
    except (IOError, OSError) as e:
      if e.errno not in (errno.EACCES, errno.EROFS):
        return  # no lock file (a new folder): no run
      try:
        handle = open(path, "r")  # another user's, or a read-only disk's: a local lock
      except (IOError, OSError):
        return
    self._take(handle, wait=False, only_when_held=True, shared=True)
    handle.close()  # drops the lock just taken

  def _take(self, handle, wait, only_when_held=False, shared=False):
    """flock on the open lock file (exclusive, or shared); on failure closes it and raises
    ValueError naming the holder (only_when_held: only when another process holds it;
    else it says nothing)."""
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    try:
      while True:
        try:
          fcntl.flock(handle, mode)
          break
        except BlockingIOError:  # held
          if not wait:
            raise
        # Polled: a blocking flock would act on a Ctrl-C that another thread got, or that
        # came as the wait began, only once the holder had ended.
        time.sleep(0.2)
    except (IOError, OSError) as e:
      if only_when_held and e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
        return
      handle.seek(0)
      holder = handle.read().strip() or "another process"
      handle.close()
      raise ValueError("--output_dir=%s is in use by another run (%s); wait for it to end "
                       "or pass another --output_dir" % (self.output_dir, holder))

  def release(self):
    """Drops the lock (the end of the process drops it too)."""
    if self._handle is not None:
      self._handle.close()
      self._handle = None


def resolve_checkpoint(path, flag_name="--init_checkpoint"):
  """Returns the checkpoint prefix that `path` names.

  A folder names its checkpoint with the highest step (name-N.index), the newest file
  if no name carries a step.

  Raises:
    ValueError: nothing there is a checkpoint, or the one named is incomplete
      (missing_data); the message says what to pass.
  """
  check_no_pattern(path, flag_name)
  folder = path if tf.gfile.IsDirectory(path) else None
  if folder:
    indexes = _by_step(index_files(folder))
    if not indexes:
      raise ValueError("%s=%s is a folder without a checkpoint; pass the checkpoint prefix, "
                       "e.g. %s=/path/model.ckpt-28252" % (flag_name, path, flag_name))
    prefix = indexes[-1][:-len(".index")]
  else:
    prefix = _CHECKPOINT_FILE_SUFFIX.sub("", path)
    if not tf.gfile.Exists(prefix + ".index"):
      raise ValueError("%s=%s: no checkpoint there (%s.index does not exist); pass the "
                       "prefix of an existing checkpoint, e.g. %s=/path/model.ckpt-28252"
                       % (flag_name, path, prefix, flag_name))
  why = missing_data(prefix)
  if why:
    # The newest complete one beside it: an earlier save of the same run, most often.
    others = [p[:-len(".index")] for p in _by_step(index_files(os.path.dirname(prefix) or "."))]
    complete = [p for p in others if p != prefix and _complete(p)]
    raise ValueError("%s=%s: %s is incomplete (%s): a save or copy not finished; %s"
                     % (flag_name, path, "its newest checkpoint %s" % os.path.basename(prefix)
                        if folder else "the checkpoint", why,
                        "pass %s=%s, the newest complete one there" % (flag_name, complete[-1])
                        if complete else "pass a complete checkpoint"))
  return prefix


def _by_step(index_paths):
  """Checkpoint indexes oldest first: by the step in their names (name-N.index), then by
  time (a name without a step)."""
  def order(index_path):
    step = re.search(r"-(\d+)\.index$", index_path)
    return (int(step.group(1)) if step else -1, tf.gfile.Stat(index_path).mtime_nsec)
  return sorted(index_paths, key=order)


def _complete(prefix):
  """Whether checkpoint `prefix`'s files hold its tensors (an unreadable one's do not)."""
  try:
    return not missing_data(prefix)
  except (ValueError, tf.errors.OpError):
    return False


def _shards(prefix):
  """The .data-NNNNN-of-NNNNN files of checkpoint `prefix`, sorted."""
  return sorted(p for p in checkpoint_files(prefix)
                if re.search(r"\.data-\d{5}-of-\d{5}$", p))


def _missing_shard(prefix):
  """The name of the first .data shard of checkpoint `prefix` that is not there, or ""."""
  shards = _shards(prefix)
  count = int(shards[0][-5:]) if shards else 1
  wanted = ["%s.data-%05d-of-%05d" % (prefix, i, count) for i in range(count)]
  missing = sorted(set(wanted) - set(shards))
  return os.path.basename(missing[0]) if missing else ""


def missing_data(prefix):
  """Why the .data files of checkpoint `prefix` cannot hold the tensors its .index lists
  ("" when they can): a shard is missing, or they are shorter than the tensors (TensorFlow
  writes them one after another, raw). A copy cut short or a save stopped after its
  .index; found from the sizes, without reading the tensors."""
  missing = _missing_shard(prefix)
  if missing:
    return "%s is missing" % missing
  shards = _shards(prefix)
  try:
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    need = sum(int(np.prod(shape)) * dtypes[name].size
               for name, shape in reader.get_variable_to_shape_map().items()
               if dtypes[name] not in (tf.string, tf.resource, tf.variant))
  except tf.errors.OpError as e:
    raise DamagedCheckpoint.or_error(prefix, e)
  have = sum(tf.gfile.Stat(p).length for p in shards)
  if have < need:
    return "its .data %s %d of the %d bytes its tensors take" % (
        "file holds" if len(shards) == 1 else "files hold", have, need)
  return ""


# The config keys a checkpoint's shapes tell: key -> (variable, dimension).
_SHAPE_KEYS = (("vocab_size", "bert/embeddings/word_embeddings", 0),
               ("hidden_size", "bert/embeddings/word_embeddings", 1),
               ("max_position_embeddings", "bert/embeddings/position_embeddings", 0),
               ("type_vocab_size", "bert/embeddings/token_type_embeddings", 0),
               ("intermediate_size", "bert/encoder/layer_0/intermediate/dense/kernel", 1))
_LAYER = re.compile(r"^bert/encoder/layer_(\d+)/")


def check_config(prefix, bert_config, config_flag="--bert_config_file",
                 checkpoint_flag="--init_checkpoint"):
  """Checks that a checkpoint holds the model bert_config describes, before anything is
  built or written.

  The shapes tell the layers, hidden, vocab, intermediate, position and token-type
  sizes; the number of heads only the run marker beside a checkpoint of this recipe
  does (a query kernel is [hidden, hidden] whatever the heads).

  Args:
    prefix: the checkpoint prefix (resolve_checkpoint).
    bert_config: modeling.BertConfig.
    config_flag, checkpoint_flag: how the error names the two, e.g. "--bert_config_file=x".

  Raises:
    ValueError: one line naming each key that differs, both values, and the fix.
  """
  shapes = dict(tf.train.list_variables(prefix))
  if "bert/embeddings/word_embeddings" not in shapes:
    raise ValueError("%s=%s holds no bert/embeddings/word_embeddings: it is not a BERT "
                     "checkpoint with Google's variable names" % (checkpoint_flag, prefix))
  found = {key: shapes[name][dim] for key, name, dim in _SHAPE_KEYS if name in shapes}
  layers = [int(m.group(1)) for m in (_LAYER.match(n) for n in shapes) if m]
  found["num_hidden_layers"] = max(layers) + 1 if layers else 0
  try:
    with tf.gfile.GFile(os.path.join(os.path.dirname(prefix), RUN_MARKER), "r") as f:
      found["num_attention_heads"] = json.load(f)["bert_config"]["num_attention_heads"]
  except (tf.errors.OpError, EnvironmentError, ValueError, KeyError, TypeError):
    pass  # Not this recipe's, or no marker: the shapes do not tell the heads.
  wrong = [key for key in sorted(found) if getattr(bert_config, key) != found[key]]
  if wrong:
    raise ValueError("%s=%s holds a model with %s but %s says %s; pass the config the "
                     "checkpoint was trained with"
                     % (checkpoint_flag, prefix,
                        ", ".join("%s=%s" % (k, found[k]) for k in wrong), config_flag,
                        ", ".join("%s=%s" % (k, getattr(bert_config, k)) for k in wrong)))
  # Every other weight too (the pooler's, the heads'): a checkpoint stitched together.
  expected = heads.pretraining_variable_shapes(bert_config)
  for name in sorted(set(shapes) & set(expected)):
    if list(shapes[name]) != expected[name]:
      raise ValueError("%s=%s holds %s of shape %s but %s makes it %s; pass the config the "
                       "checkpoint was trained with" % (checkpoint_flag, prefix, name,
                                                       list(shapes[name]), config_flag,
                                                       expected[name]))


def variable_name(variable):
  """The checkpoint name of a variable: its name without the ":0" (a mirrored variable's
  in every replica, where its .op is the replica's own copy, "w/replica_1")."""
  return variable.name.rsplit(":", 1)[0]


def restore_model_weights(sess, prefix, model_variables, log=print, warn=None):
  """Loads the model variables found in a checkpoint by name.

  Args:
    sess: the tf.Session whose variables are set.
    prefix: checkpoint prefix (resolve_checkpoint).
    model_variables: the variables to look for (the trainable variables of the model).
    log: function taking a line of text.
    warn: (optional) function taking the line that names the variables the checkpoint
      lacked, where that is a warning (log's otherwise: a classifier's fresh head).

  Returns:
    The list of model variable names that the checkpoint did not have.

  Raises:
    ValueError: a variable has another shape in the checkpoint (names both shapes), or
      the checkpoint holds none of the model's variables, or it is damaged
      (DamagedCheckpoint).
  """
  checkpoint_shapes = dict(tf.train.list_variables(prefix))
  found, missing = {}, []
  for var in model_variables:
    name = variable_name(var)
    if name not in checkpoint_shapes:
      missing.append(name)
      continue
    if list(checkpoint_shapes[name]) != var.shape.as_list():
      raise ValueError("checkpoint %s: variable %s has shape %s but the model needs %s; use "
                       "the --bert_config_file the checkpoint was trained with"
                       % (prefix, name, list(checkpoint_shapes[name]), var.shape.as_list()))
    found[name] = var
  if not found:
    raise ValueError("checkpoint %s holds none of the model's variables (e.g. %s); it is not "
                     "a BERT checkpoint with Google BERT variable names"
                     % (prefix, variable_name(model_variables[0])))
  # Weights stored in another float type (a float16 copy of a model) are read and cast;
  # a Saver restores a variable only from its own type.
  dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
  cast = [name for name, var in found.items()
          if dtypes[name] != var.dtype.base_dtype and dtypes[name].is_floating]
  # A list, not the dict: a Saver restores every replica's copy of a mirrored variable
  # from a list only (TensorFlow 1.15 fails on the dict, 2.15 sets the first copy).
  try:
    same = [var for name, var in found.items() if name not in cast]
    if same:
      tf.train.Saver(var_list=same).restore(sess, prefix)
    _restore_cast(sess, prefix, [found[name] for name in cast])
  except (tf.errors.OpError, IndexError) as e:
    raise DamagedCheckpoint.or_error(prefix, e)
  log("Loaded %d of %d model variables from %s%s" % (
      len(found), len(model_variables), prefix, "" if not cast else " (%d stored in %s, cast)"
      % (len(cast), "/".join(sorted({dtypes[name].name for name in cast})))))
  if missing:
    (warn or log)("Model variables not in the checkpoint (initialized fresh): %s"
                  % ", ".join(missing))
  return missing


def _restore_cast(sess, prefix, variables):
  """Sets each variable (a mirrored one's every copy) to its checkpoint tensor, cast to
  the variable's type."""
  reader = tf.train.load_checkpoint(prefix)
  for var in variables:
    value = reader.get_tensor(variable_name(var))
    for copy in getattr(var, "values", None) or [var]:
      feed = tf.placeholder(copy.dtype.base_dtype, copy.shape)
      sess.run(copy.assign(feed), {feed: value.astype(copy.dtype.base_dtype.as_numpy_dtype)})


def check_resumable(prefix, variables,
                    optional_prefixes=("loss_scale/", DATA_POSITION, UPDATE_SAMPLES)):
  """Checks that `prefix` is a checkpoint of this recipe that holds `variables`.

  Raises:
    ValueError: a variable is missing or has another shape: the checkpoint was written
      by another recipe or another configuration.
  """
  checkpoint_shapes = dict(tf.train.list_variables(prefix))
  for var in variables:
    name = variable_name(var)
    if name.startswith(optional_prefixes):
      continue
    if name not in checkpoint_shapes:
      raise ValueError("--output_dir holds checkpoint %s, which lacks %s: it was written with "
                       "other settings (optimizer, accumulation, config); use those settings "
                       "or a new --output_dir" % (prefix, name))
    if list(checkpoint_shapes[name]) != var.shape.as_list():
      raise ValueError("--output_dir holds checkpoint %s whose %s has shape %s, but this run "
                       "needs %s; use the same --bert_config_file or a new --output_dir"
                       % (prefix, name, list(checkpoint_shapes[name]), var.shape.as_list()))
