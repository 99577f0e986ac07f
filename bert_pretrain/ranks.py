"""Who this process is in a job: its rank among the ranks (Horovod), its local rank on
its host, and the watch that names a rank that stalls.

One process per card; run_multi_card_FPS.sh starts them with horovodrun. Without
--horovod a run is rank 0 of 1.
"""

import os
import sys
import threading
import time


class Ranks(object):
  """Who this process is: its rank among `size` ranks, and its local rank on the host.

  With Horovod and stall_timeout_s, a rank that stops taking part is named and the job
  ends instead of hanging. Two checks share the timeout:
  - Horovod's stall check (HOROVOD_STALL_CHECK_TIME_SECONDS, then
    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS; set here unless the user set them) lists the
    ranks that did not submit an all-reduce ("Missing ranks"), e.g. a rank stuck in I/O,
    and shuts Horovod down; the training loop then fails with a Horovod error. It runs
    under MPI; Horovod 0.28.1's Gloo controller did not run it in our tests.
  - A whole process stopped or frozen cannot answer Horovod's negotiation, so the stall
    check never runs (MPI waits forever, Gloo times out without a rank). Each rank
    therefore rewrites a small file output_dir/.ranks/rank-N every few seconds from a
    thread; a rank that sees another's file unchanged for stall_timeout_s prints a
    one-line error naming it and exits with status 3. On several hosts this needs an
    output_dir all hosts see; otherwise only ranks of the same host are named.

  Args:
    use_horovod: initialize Horovod.
    stall_timeout_s: seconds a rank may stay away (0: no stall checks).
    output_dir: the run's folder (for the .ranks files).
  """

  def __init__(self, use_horovod, stall_timeout_s=0, output_dir=None):
    self.hvd = None
    self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
    self.stall_timeout_s = stall_timeout_s
    self._folder = None
    self._interval = 1.0
    self._thread = None
    self._stop = threading.Event()
    self._seen = {}  # rank -> (file content, time it last changed)
    if use_horovod:
      try:
        import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
      except ImportError as e:
        raise ValueError("--horovod needs Horovod with TensorFlow support (%s); run "
                         "bash init_tf.sh" % e)
      if stall_timeout_s > 0:
        # Horovod reads these in init(); a user's own setting wins.
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS",
                              str(max(1, min(60, stall_timeout_s // 2))))
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(stall_timeout_s))
        # Gloo's own timeout ends a job with a frozen rank without naming it; the
        # watchdog below names it first.
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(stall_timeout_s + 30))
      hvd.init()
      self.hvd = hvd
      self.rank, self.size = hvd.rank(), hvd.size()
      self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
    if self.size > 1 and stall_timeout_s > 0 and output_dir:
      self._folder = os.path.join(output_dir, ".ranks")
      self._interval = max(1.0, min(10.0, stall_timeout_s / 10.0))
      self._thread = threading.Thread(target=self._watch, name="stall_watchdog", daemon=True)
      self._thread.start()

  @property
  def is_chief(self):
    return self.rank == 0

  def _watch(self):
    """Heartbeat and watchdog thread: see the class docstring."""
    beats = 0
    while not self._stop.wait(0 if beats == 0 else self._interval):
      beats += 1
      try:
        if not os.path.isdir(self._folder):
          os.makedirs(self._folder, exist_ok=True)
        path = os.path.join(self._folder, "rank-%d" % self.rank)
        with open(path + ".tmp", "w") as f:
          f.write("%d %d\n" % (os.getpid(), beats))
        os.replace(path + ".tmp", path)
      except OSError:
        continue  # The heartbeat is best effort; training goes on.
      stalled = self.stalled_ranks(self.stall_timeout_s)
      if stalled:
        print("run_pretraining: error: rank %s stalled: no sign of life for %d s (stuck "
              "in I/O, stopped, or its host frozen; --stall_timeout_s=%d); the job stops, "
              "checkpoints in %s are kept: check that host and rerun the same command to "
              "resume" % (", ".join(str(r) for r in stalled), self.stall_timeout_s,
                          self.stall_timeout_s, os.path.dirname(self._folder)),
              file=sys.stderr)
        sys.stderr.flush()
        os._exit(3)  # pylint: disable=protected-access

  def stalled_ranks(self, min_age_s=None):
    """Other ranks whose heartbeat changed since this rank started watching, then not
    for min_age_s seconds (default: three heartbeats; a file left by an earlier run never
    counts)."""
    if min_age_s is None:
      min_age_s = 3 * self._interval
    if self._folder is None:
      return []
    now = time.time()
    stalled = []
    for rank in range(self.size):
      if rank == self.rank:
        continue
      try:
        with open(os.path.join(self._folder, "rank-%d" % rank)) as f:
          content = f.read()
      except OSError:
        continue
      if content.startswith("done"):
        continue
      previous = self._seen.get(rank)
      if previous is None:
        self._seen[rank] = (content, None)
      elif previous[0] != content:
        self._seen[rank] = (content, now)
      elif previous[1] is not None and now - previous[1] >= min_age_s:
        stalled.append(rank)
    return stalled

  def stop(self):
    """Ends the heartbeat thread; the others no longer wait for this rank."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=10)
    if self._folder is not None:
      try:
        with open(os.path.join(self._folder, "rank-%d" % self.rank), "w") as f:
          f.write("done\n")
      except OSError:
        pass
