"""What the training loop keeps count of: its throughput (Throughput) and MLPerf's
schedule of blocks and evaluations (EvalSchedule).

The throughput is measured as MLPerf and NVIDIA's recipes measure it: sentences per
second over the training updates, without the first warm-up updates and without the
time of checkpoints and evaluations; the average "with overhead" keeps warm-up and
checkpoint time in.
"""

import time

from mlperf_logging import mllog

from bert_pretrain.training import mlperf


def samples(step, batch_size, skipped=0, offset=0.0):
  """The sentences read by `step` updates of batch_size (a fraction for packs) and by the
  `skipped` ones float16's loss scaling skipped (their batches were read and are not
  read again), as the whole number MLPerf's log and the evaluation schedule count.
  offset: what updates of another batch size read before a resume (samples_offset)."""
  return int(round((step + skipped) * batch_size + offset))


def samples_offset(samples_read, step, batch_size, skipped):
  """The offset that makes samples() count `samples_read` at `step` (and `skipped`):
  not 0 when the updates before it were of another batch size (a resume with
  --allow_resume_change=global_batch)."""
  return samples_read - (step + skipped) * batch_size


def next_point(samples_read, start_samples, samples_between_eval):
  """The first point of the evaluation schedule (start_samples, then every
  samples_between_eval) past samples_read."""
  done = samples_read - start_samples
  if done < 0:
    return start_samples
  return start_samples + (done // samples_between_eval + 1) * samples_between_eval


def point_between(before, after, start_samples, samples_between_eval):
  """Whether a point of the evaluation schedule lies in (before, after]: an update that
  read from `before` samples to `after` reached it."""
  return next_point(before, start_samples, samples_between_eval) <= after


def reached_point(step, batch_size, skipped, start_samples, samples_between_eval,
                  offset=0.0, update_samples=None):
  """Whether update `step` (counted from 1) read up to or past a point of the evaluation
  schedule: from update_samples, the samples read (before it, after it), when known;
  else counted back one batch from the samples read, which misses updates loss scaling
  skipped around it and, after a resume with another global batch, the batch it read."""
  if step < 1:
    return False
  if update_samples is None:
    update_samples = (samples(step - 1, batch_size, skipped, offset),
                      samples(step, batch_size, skipped, offset))
  return point_between(update_samples[0], update_samples[1], start_samples,
                       samples_between_eval)


class Throughput(object):
  """Sentences per second of the training loop.

  Args:
    batch_size: sentences per update (all ranks, all micro-batches; packs count at the
      data's mean sentences a pack, a fraction).
    warmup_steps: updates left out of the steady-state average.
  """

  def __init__(self, batch_size, warmup_steps):
    self.batch_size = batch_size
    self.warmup_steps = warmup_steps
    self.updates = 0  # updates run in this process, skipped ones included
    self.sentences = 0
    self.steady_sentences = 0
    self.steady_time = 0.0
    self.checkpoint_time = 0.0
    self.eval_time = 0.0  # evaluations between updates
    self.start = time.time()
    self.train_time = None
    self.window_start, self.window_steps = time.time(), 0

  def update(self, seconds, steady=True):
    """Counts an update (skipped or not) that took `seconds`; steady=False leaves it
    out of the steady-state average (a traced update)."""
    self.updates += 1
    self.sentences += self.batch_size
    if self.updates > self.warmup_steps and steady:
      self.steady_sentences += self.batch_size
      self.steady_time += seconds
    self.window_steps += 1

  def window_seconds(self):
    """Seconds since the window started (without pauses)."""
    return max(time.time() - self.window_start, 1e-9)

  def window_fps(self):
    """Sentences per second since the window started (without pauses)."""
    return self.window_steps * self.batch_size / self.window_seconds()

  def new_window(self):
    self.window_start, self.window_steps = time.time(), 0

  def pause(self, seconds, checkpoint=False):
    """Leaves `seconds` of a checkpoint (checkpoint=True) or an evaluation out of the
    window; the average with overhead keeps checkpoint time in."""
    self.window_start += seconds
    if checkpoint:
      self.checkpoint_time += seconds
    else:
      self.eval_time += seconds

  def stop(self):
    """The training loop ends: what follows (final save and evaluation) is not counted."""
    self.train_time = time.time() - self.start

  def averages(self):
    """Returns (with overhead, steady state): sentences per second over the whole loop
    without evaluations, and over the updates after warm-up alone."""
    with_overhead = self.sentences / max(self.train_time - self.eval_time, 1e-9)
    steady = self.steady_sentences / self.steady_time if self.steady_time > 0 else with_overhead
    return with_overhead, steady


class EvalSchedule(object):
  """When the run evaluates, and MLPerf's records of it.

  MLPerf's log splits the training in blocks, the training between two evaluations
  (block_start / block_stop, counted in samples), and logs each evaluation (eval_start,
  eval_stop, eval_accuracy; eval_samples once). An evaluation comes after the first
  update that reaches samples_start_eval, and then each further samples_between_eval
  (MLPerf's interval: mlperf.eval_interval_samples, from 0); a resumed run keeps the
  same points.

  Args:
    logger: logs.RunLogger.
    evaluator: pretraining.Evaluator (None: the run does not evaluate).
    monitor: health.HealthMonitor (warns when the accuracy drops).
    batch_size: training sentences per update (all ranks), as Throughput's.
    samples_between_eval, samples_start_eval: the schedule.
    step: the global step the run starts at.
    output_dir: where eval_results.txt goes (None: not written, e.g. other ranks).
    skipped: the updates float16's loss scaling skipped before `step` (the samples
      count their batches); the loop keeps self.skipped up to date.
    offset: samples_offset of a run resumed with another batch size.
    update_samples: the samples read (before, after) update `step` (its checkpoint's
      checkpoints.UPDATE_SAMPLES; None: not known, counted back). Batches loss scaling
      skipped after it and before the checkpoint are read after it: the first update
      applied next evaluates a point they passed, as an uninterrupted run does.
    stop_threshold, max_eval_steps: the run's target and evaluation batches per card,
      for the warning when its first evaluation read another set than eval_10k.
  """

  def __init__(self, logger, evaluator, monitor, batch_size, samples_between_eval,
               samples_start_eval, step, output_dir, skipped=0, offset=0.0,
               update_samples=None, stop_threshold=0.0, max_eval_steps=0):
    self.logger = logger
    self.stop_threshold = stop_threshold
    self.max_eval_steps = max_eval_steps
    self.skipped = skipped
    self.offset = offset
    self.evaluator = evaluator
    self.monitor = monitor
    self.batch_size = batch_size
    self.samples_between_eval = samples_between_eval
    self.start_samples = samples_start_eval
    # The samples read (before, after) the last update applied (applied()).
    self.update_samples = update_samples
    self.samples_after = self.read(step) if update_samples is None else update_samples[1]
    # The first point of the schedule past the samples done by the last update applied.
    self.next_samples = next_point(self.samples_after, samples_start_eval,
                                   samples_between_eval)
    self.output_dir = output_dir
    self.block_first_samples = None  # None: no block open
    self.last_eval_step = None
    self.last_scheduled = False  # whether that evaluation was at a point of the schedule
    self.eval_time = 0.0
    self.eval_samples = 0  # evaluated, over all evaluations
    self.eval_samples_logged = False  # MLPerf's eval_samples, logged once
    self.eval_set_checked = False  # the warning when it is not eval_10k, once

  def start_block(self, step):
    """Opens a block at `step` unless one is open."""
    if self.block_first_samples is None:
      self.block_first_samples = self.read(step)
      self._log_block(mllog.constants.BLOCK_START, "start")

  def end_block(self):
    """Closes the open block, if any."""
    if self.block_first_samples is not None:
      self._log_block(mllog.constants.BLOCK_STOP, "end")
      self.block_first_samples = None

  def _log_block(self, key, kind):
    self.logger.mlperf(key, kind=kind, metadata={
        "first_epoch_num": self.block_first_samples,
        "epoch_count": self.samples_between_eval})

  def read(self, step):
    """The samples read by the updates up to `step`, the skipped ones included."""
    return samples(step, self.batch_size, self.skipped, self.offset)

  def due(self, step):
    """Whether an evaluation is due after `step`; if so the next one is scheduled."""
    if self.evaluator is None:
      return False
    if self.read(step) < self.next_samples:
      return False
    self.next_samples = next_point(self.read(step), self.start_samples,
                                   self.samples_between_eval)
    return True

  def applied(self, step):
    """Counts update `step` applied (not skipped by loss scaling): it read from the
    samples read after the update applied before it to those read now, what loss scaling
    skipped between included."""
    self.update_samples = (self.samples_after, self.read(step))
    self.samples_after = self.update_samples[1]

  def reached_by(self, step):
    """Whether update `step`, the last applied, reached a point of the schedule: a run
    stopped right after it did not evaluate there."""
    return self.evaluator is not None and reached_point(
        step, self.batch_size, self.skipped, self.start_samples, self.samples_between_eval,
        self.offset, self.update_samples)

  def evaluate(self, sess, step, scheduled=True):
    """Evaluates the weights of `step` and logs the results; one between the schedule's
    points (scheduled=False: the last, when the run ends between two) stays out of
    MLPerf's log, whose evaluations the rules fix.

    Returns:
      dict: the Evaluator's results and eval_time_s, the seconds it took.
    """
    start = time.time()
    trained = {"epoch_num": self.read(step)}
    log_mlperf = self.logger.mlperf if scheduled else lambda *args, **kwargs: None
    log_mlperf(mllog.constants.EVAL_START, metadata=trained, kind="start")
    results = self.evaluator.evaluate(sess)
    log_mlperf(mllog.constants.EVAL_STOP, metadata=trained, kind="end")
    self.eval_time += time.time() - start
    self.eval_samples += results["eval_samples"]
    results["eval_time_s"] = round(time.time() - start, 3)
    if not self.eval_samples_logged and scheduled:
      self.logger.mlperf(mllog.constants.EVAL_SAMPLES, results["eval_samples"])
      self.eval_samples_logged = True
    if not self.eval_set_checked:  # scheduled or not: an evaluation-only run's is neither
      self.eval_set_checked = True
      warning = mlperf.eval_set_warning(results["eval_samples"], self.stop_threshold,
                                        self.max_eval_steps)
      if warning:
        self.logger.warning(step, warning)
    self.last_eval_step, self.last_scheduled = step, scheduled
    log_mlperf(mllog.constants.EVAL_ACCURACY, results["masked_lm_accuracy"], metadata=trained)
    self.logger.eval_results(step, results, self.output_dir, samples=trained["epoch_num"])
    for warning in self.monitor.evaluation(step, results["masked_lm_accuracy"]):
      self.logger.warning(step, warning)
    return results
