"""The pretraining run, top to bottom: set up, train, finish.

  run()          the whole run: start() the graph, session and logs; evaluate at the start;
                 train(); finish() with the last checkpoint, evaluation and summary
  train()        the loop: get batch -> forward -> backward -> (accumulate) -> all-reduce
                 -> LAMB step -> log -> checkpoint -> evaluate, until --num_train_steps,
                 the target accuracy or a signal

It reads no flags: the settings come as a config.Settings (cfg), what the run reads as
inputs.Inputs, the device and ranks as chosen by the entry point (run_pretraining.py).
The graph is built by pretraining.py, the lines printed by runlog.py, the throughput and
MLPerf's evaluation schedule kept by meters.py, the resume decided by resume.py, where
the time went (one traced update, the padding, the MFU) by timing.py.
"""

import os
import shlex
import sys
import time

import tensorflow.compat.v1 as tf

from bert_pretrain import errors
from bert_pretrain.data import input_pipeline
from bert_pretrain.distributed import device as device_lib
from bert_pretrain.training import checkpoints
from bert_pretrain.training import health
from bert_pretrain.training import inputs as inputs_lib
from bert_pretrain.training import logs
from bert_pretrain.training import meters
from bert_pretrain.training import mlperf
from bert_pretrain.training import pretraining
from bert_pretrain.training import report
from bert_pretrain.training import resume as resume_lib
from bert_pretrain.training import runlog
from bert_pretrain.training import signals
from bert_pretrain.training import timing


def run(cfg, inputs, ranks, device, stop=None, notes=()):
  """Builds the graph, then trains and evaluates. Returns the process exit status.

  Args:
    cfg: config.Settings.
    inputs: inputs.Inputs (inputs.check_inputs).
    ranks: ranks.Ranks.
    device: device.Device (device.detect_device).
    stop: (optional) the installed signals.StopRequest: SIGTERM or SIGINT then stop the
      training after the current update, on every rank, with a checkpoint.
    notes: lines to log after the run's description (e.g. the RCP taken).
  """
  stop = stop or signals.StopRequest()
  run_start = time.time()
  job = start(cfg, inputs, ranks, device, notes)
  with job.logger.run_stop_on_error():
    results = results_at_start = {}
    at_start = cfg.evaluation.eval_at_start or not cfg.run.do_train
    # A run stopped by a signal right after an update that reached an evaluation point saved
    # without evaluating: the resumed run evaluates there first (again, if one had), and
    # stops there if that evaluation reaches the target.
    at_point = (cfg.run.do_train and job.step < cfg.optimizer.num_train_steps and
                job.evals.reached_by(job.step))
    missed = not at_start and at_point
    if job.finished:
      job.logger.print(job.finished)
    elif cfg.run.do_train and job.step >= cfg.optimizer.num_train_steps:
      job.logger.print("global_step %d already reached --num_train_steps=%d; nothing to train%s"
                       % (job.step, cfg.optimizer.num_train_steps,
                          ", only the evaluation at the start" if job.evaluator is not None
                          and at_start else ""))
    elif missed:
      job.logger.print("Update %d reached an evaluation point: evaluating it first (a run "
                       "stopped right after it saves without evaluating)" % job.step)
    if job.evaluator is not None and (at_start or missed):
      # One at a resumed step between the schedule's points stays out of MLPerf's log.
      results = job.evals.evaluate(job.sess, job.step, scheduled=at_point or job.step == 0)
      results_at_start = dict(results, step=job.step)
      job.meter.pause(results["eval_time_s"])
      if job.step == 0 and inputs.init_checkpoint and not inputs.resume_checkpoint:
        runlog.check_initial_accuracy(cfg, job.logger, results["masked_lm_accuracy"],
                                      inputs.init_checkpoint)
    stop.arm()
    # Every rank decides by the evaluation (which sums over them), not by the chief's files.
    if at_point and reached_target(cfg, results):
      job.logger.print(target_line(cfg, results, job.step))
      (step, finite, stopped_by) = (job.step, True, 0)
    else:
      step, finite, stopped_by, results = train(cfg, job, stop, results)
    return finish(cfg, job, step, finite, stopped_by, results, results_at_start, run_start)


def train(cfg, job, stop, results):
  """The training loop, from job.step to --num_train_steps. Returns (step, whether the
  losses and weights stayed finite, the signal that stopped it or 0, the last
  evaluation's results)."""
  step = job.step
  last_scale = job.loss_scale()
  skipped_trace = False  # the last try to trace was skipped by loss scaling
  while cfg.run.do_train and step < cfg.optimizer.num_train_steps:
    job.evals.start_block(step)
    step_start = time.time()
    job.ranks.doing = ("update %d: input, forward, backward, the gradients' all-reduce and "
                       "the optimizer's step" % (step + 1))
    # One update is traced for the time split: the first applied after the FPS warm-up
    # (never the very first; after a skipped try, the next but one, not each of a run of
    # skipped updates), else the last; tracing slows it, so it stays out of the steady FPS.
    trace = job.split is None and (
        (job.meter.updates >= max(cfg.run.fps_warmup_steps, 1) and not skipped_trace) or
        step + 1 == cfg.optimizer.num_train_steps)
    values = job.update(step, stop, trace)
    # The first update that fetches the losses also sets up that session call: not steady.
    job.meter.update(time.time() - step_start,
                     steady=not trace and not (job.first_display and job.meter.updates > 0))
    skipped_trace = (skipped_trace or trace) and values["step"] == step
    if "skipped_steps" in values:
      job.evals.skipped = int(values["skipped_steps"])
    if values["step"] == step:
      # Skipped by loss scaling (the scale is halved): this update is run again with
      # new data, and only applied updates count towards --num_train_steps.
      if last_scale <= 1.0:
        job.logger.print("Gradients are not finite at step %d even with loss scale 1: "
                         "stopping without saving. Lower --learning_rate or raise "
                         "--num_warmup_steps" % (step + 1))
        return step, False, 0, results
      last_scale = values["loss_scale"]
      if int(values["stop_signal"]):  # a run of skipped updates can be long
        return step, True, stopped_at(cfg, job, step, int(values["stop_signal"])), results
      continue
    step = int(values["step"])
    job.evals.applied(step)
    if job.train.loss_scale is not None:
      last_scale = values["loss_scale"]
    if step % cfg.run.display_loss_steps == 0 or step == cfg.optimizer.num_train_steps:
      job.ranks.doing = "log line after update %d: the losses' average over the ranks" % step
      if not runlog.log_step(job.logger, job.monitor, job.sess, job.train, values, step,
                             job.meter, step_start, job.evals.read(step)):
        return step, False, 0, results
      job.meter.new_window()
    if step % cfg.run.save_checkpoints_steps == 0:
      job.ranks.doing = "checkpoint after update %d (the chief writes it)" % step
      save_start = time.time()
      if not job.save(step):
        return step, False, 0, results
      job.meter.pause(time.time() - save_start, checkpoint=True)
    if int(values["stop_signal"]):
      return step, True, stopped_at(cfg, job, step, int(values["stop_signal"])), results
    if step < cfg.optimizer.num_train_steps and job.evals.due(step):
      # A signal that came during the update is agreed on now, not at the next one: a
      # stop starts no evaluation (the resumed run evaluates this point first).
      job.ranks.doing = "the ranks' stop agreement before the evaluation after update %d" % step
      stopped_by = int(job.sess.run(job.train.stop_agreed, {job.train.stop_feed: stop.signum}))
      if stopped_by:
        return step, True, stopped_at(cfg, job, step, stopped_by), results
      job.evals.end_block()
      job.ranks.doing = "evaluation after update %d (its counts summed over the ranks)" % step
      results = job.evals.evaluate(job.sess, step)
      job.meter.pause(results["eval_time_s"])
      if reached_target(cfg, results):
        job.logger.print(target_line(cfg, results, step))
        break
  return step, True, 0, results


def stopped_at(cfg, job, step, stopped_by):
  """Says where this rank stops after the signal `stopped_by` (every rank says it: the
  ranks agree on the step); returns stopped_by."""
  print("%s: rank %d stops after step %d; to resume, run the same command with "
        "--output_dir=%s" % (errors.signal_name(stopped_by), job.ranks.rank, step,
                             shlex.quote(cfg.run.output_dir)), flush=True)
  return stopped_by


def finish(cfg, job, step, finite, stopped_by, results, results_at_start, run_start):
  """The last checkpoint and evaluation, MLPerf's closing keys, the summary and the
  report (run_start: time.time() as the run began, for its end-to-end time, the last
  checkpoint and evaluation included). Returns the process exit status."""
  job.ranks.doing = "finishing after update %d: last checkpoint, evaluation, summary" % step
  job.evals.end_block()
  if job.records_log:
    job.records_log.close()
  if cfg.run.do_train and step != job.last_saved and finite:
    save_start = time.time()
    finite = job.save(step)
    job.meter.pause(time.time() - save_start, checkpoint=True)
  job.meter.stop()  # the average with overhead counts the final save too
  if job.evaluator is not None and job.evals.last_eval_step != step and finite \
      and not stopped_by:
    scheduled = job.evals.due(step)  # the loop asks it of every update but the last
    results = job.evals.evaluate(job.sess, step, scheduled)
    if not scheduled and job.logger.writes_mlperf:
      job.logger.print(
          "The last evaluation, after update %d, falls between MLPerf's evaluation points "
          "(every %d samples): it is left out of mlperf.log%s"
          % (step, job.evals.samples_between_eval, " and of the --stop_threshold check"
             if cfg.evaluation.stop_threshold > 0 else ""))
  # A training run succeeds only by an evaluation of the weights it ends with at a point
  # of the schedule, unstopped (not by the one at the start a stop or a non-finite loss
  # left as the last); a run that trains nothing, by its checkpoint's.
  evaluated_last = bool(results) and job.evals.last_eval_step == step
  if job.trains:
    evaluated_last = (evaluated_last and finite and not stopped_by and
                      job.evals.last_scheduled)
  status = "success" if evaluated_last and reached_target(cfg, results) else "aborted"
  if status == "success" and job.trains and job.ranks.is_chief:
    # Started again, the run then knows its target is reached (resume.reached_target_before).
    marker = checkpoints.read_run_marker(cfg.run.output_dir)
    if marker is not None:
      checkpoints.write_run_marker(cfg.run.output_dir, dict(marker, reached_target={
          "step": step, "masked_lm_accuracy": float(results["masked_lm_accuracy"])}))
  job.logger.mlperf(logs.mllog.constants.TRAIN_SAMPLES, job.evals.read(step))
  job.logger.mlperf(logs.mllog.constants.RUN_STOP, kind="end", metadata={"status": status})
  runlog.log_summary(cfg, job.logger, step, job.meter, job.evals, results, results_at_start,
                     status, job.ranks.replicas, time.time() - run_start, job.rcp,
                     where=dict(tokens=job.tokens, split=job.split, peak=job.peak,
                                flops_per_sequence=job.flops_per_sequence()),
                     stopped=bool(stopped_by))
  job.logger.close()
  if stopped_by and job.ranks.size > 1:
    last_barrier(job, stopped_by)
  job.sess.close()
  if job.ranks.is_chief and stopped_by:
    # A launcher ends the job within seconds of a signal or of a rank's exit (horovodrun
    # --gloo after 5): the checkpoint and logs are written, the picture can wait. The
    # script's launcher reads this line as rank 0's saved stop (horovodrun.RankErrors).
    print("report: not drawn after %s; python3 -m bert_pretrain.training.report %s draws it"
          % (errors.signal_name(stopped_by), shlex.quote(cfg.run.output_dir)), flush=True)
  elif job.ranks.is_chief:
    dllog_path = cfg.run.dllog_path or os.path.join(cfg.run.output_dir, "dllog.json")
    try:
      report.write_report(cfg.run.output_dir, dllog_path, picture=cfg.run.draw_report)
    except (ValueError, EnvironmentError, RuntimeError) as e:
      print("report: not drawn (%s); the run itself is complete" % e)
  if not finite:
    return 1  # a stop whose weights were not finite saved nothing
  return signals.exit_status(stopped_by) if stopped_by else 0


def last_barrier(job, stopped_by):
  """After a stop, waits for every rank: no rank exits (which makes the launcher end the
  others) before rank 0 has saved and written its logs. Peers that ended first (under a
  signalled horovodrun --gloo the ranks of other hosts end with their ssh session) leave
  the stop as it is, with a line on stderr (the launcher reads it); other errors are
  raised."""
  try:
    job.sess.run(job.train.stop_agreed)
  except tf.errors.OpError as e:
    if not job.ranks.is_job_error(e):
      raise
    # In a session's error the cause follows "Graph execution error:".
    lines = [line.strip() for line in e.message.splitlines()
             if line.strip() and "Graph execution error" not in line]
    sys.stderr.write("%s: rank %d: other ranks ended before the last barrier (%s); run the "
                     "same command again to resume from the last checkpoint\n"
                     % (errors.signal_name(stopped_by), job.ranks.rank,
                        (lines or [type(e).__name__])[0]))
    sys.stderr.flush()


def reached_target(cfg, results):
  """Whether an evaluation's masked-LM accuracy reached --stop_threshold."""
  threshold = cfg.evaluation.stop_threshold
  return threshold > 0 and results["masked_lm_accuracy"] >= threshold


def target_line(cfg, results, step):
  return ("masked_lm_accuracy %.4f reached --stop_threshold=%g at step %d"
          % (results["masked_lm_accuracy"], cfg.evaluation.stop_threshold, step))


def attends_per_sequence(cfg, device):
  """Whether the training graph attends sequence by sequence, at the real tokens only
  (pretraining.attends_per_sequence decides; the evaluation attends at every position)."""
  return pretraining.attends_per_sequence(cfg.data.max_seq_length, device.dtype,
                                          device.kind == "CPU", cfg.runtime.use_xla)


class Job(object):
  """What the loop works with, set up by start(): the session and graph (sess, train: a
  pretraining.TrainGraph or None, evaluator: a pretraining.Evaluator or None), the logs
  (logger), the meters (meter, evals, monitor, tokens, split), the step the run starts
  at, whether it trains (trains: else it writes no MLPerf log) and the line saying that
  an earlier run reached the target there (finished, None if none)."""

  def __init__(self, cfg, ranks, **parts):
    self.cfg = cfg
    self.ranks = ranks
    self.__dict__.update(parts)
    self.step = self.last_saved = int(self.sess.run(tf.train.get_global_step()))
    self.monitor = health.HealthMonitor()
    per_update = inputs_lib.sentences_per_update(cfg, ranks.replicas, self.packing)
    self.evals = meters.EvalSchedule(
        self.logger, self.evaluator, self.monitor, per_update,
        self.eval_interval, cfg.evaluation.samples_start_eval, self.step,
        cfg.run.output_dir if ranks.is_chief else None, self.skipped, self.samples_offset,
        self.update_samples, cfg.evaluation.stop_threshold, cfg.evaluation.max_eval_steps)
    self.meter = meters.Throughput(per_update, cfg.run.fps_warmup_steps)
    self.tokens = timing.Tokens(cfg.data.max_seq_length)
    self.split = None  # the traced update's parts (timing.split_update), once traced
    self.first_display = self.displayed = False  # the losses fetched this update, ever
    self.records_log = None
    if cfg.run.do_train and cfg.data.log_trained_records:
      self.records_log = open(os.path.join(cfg.run.output_dir,
                                           "trained_records-rank-%d.txt" % ranks.rank), "a")

  def flops_per_sequence(self):
    """The matmul FLOPs of training one sequence at the mean real tokens of those
    trained (timing.training_flops_per_sequence), None before any."""
    tokens, squared = self.tokens.per_sequence()
    if tokens is None:
      return None
    c = self.bert_config
    # A pack's masked-LM rows are shared by its sequences.
    predictions = self.packing.max_predictions / self.packing.sequences_per_record
    return timing.training_flops_per_sequence(
        c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.vocab_size,
        self.cfg.data.max_seq_length, predictions, tokens, squared)["total"]

  def loss_scale(self):
    """float16's loss scale now, None without loss scaling."""
    if self.train is None or self.train.loss_scale is None:
      return None
    return self.sess.run(self.train.loss_scale.scale)

  def update(self, step, stop, trace=False):
    """Runs one update: the accumulated micro-batches, then the last one with the
    optimizer's step (and on display steps the losses). Returns its fetched values.
    With trace, its session runs are traced and self.split says where its time went."""
    cfg, train = self.cfg, self.train
    last = cfg.optimizer.num_accumulation_steps - 1
    options = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE) if trace else None
    traces = []

    def run(fetches, feed):
      metadata = tf.RunMetadata() if trace else None
      values = self.sess.run(dict(fetches, real_tokens=train.real_tokens), feed,
                             options=options, run_metadata=metadata)
      self.tokens.add(values["real_tokens"], cfg.run.train_batch_size)
      if trace:
        traces.append(metadata.step_stats)
      return values

    for micro in range(last):
      done = run({"op": train.accumulate_op, "record_ids": train.record_ids}
                 if self.records_log else {"op": train.accumulate_op},
                 {train.micro_batch: micro})
      if self.records_log:
        runlog.log_records(self.records_log, step + 1, micro, done["record_ids"])
    display = (step + 1 == cfg.optimizer.num_train_steps or
               (step + 1) % cfg.run.display_loss_steps == 0)
    # Losses are fetched (and averaged over ranks) on display steps only.
    fetches = train.display_fetches if display else train.step_fetches
    self.first_display, self.displayed = display and not self.displayed, self.displayed or display
    if self.records_log:
      fetches = dict(fetches, record_ids=train.record_ids)
    values = run(fetches, {train.stop_feed: stop.signum, train.micro_batch: last})
    if self.records_log:
      runlog.log_records(self.records_log, step + 1, last, values["record_ids"])
    if trace and int(values["step"]) > step:  # not one skipped by loss scaling
      self.split = dict(timing.split_update(traces, timing.graph_op_types(self.sess.graph)),
                        update=step + 1)
    return values

  def save(self, step):
    """Saves model.ckpt-<step> (the chief does) unless the weights or the optimizer
    state hold NaN or Inf; the first save of a run on another layout also records the
    layout. Returns False when they do (and says so): the run must stop."""
    if not self.sess.run(self.all_finite):
      saved = checkpoints.list_checkpoints(self.cfg.run.output_dir)
      self.logger.print(
          "NaN or Inf in the weights or optimizer state after step %d: stopping without "
          "saving. Lower --learning_rate or raise --num_warmup_steps and run again: %s"
          % (step, "it resumes from %s" % os.path.basename(saved[-1][1]) if saved
             else "it starts anew"))
      return False
    if self.ranks.is_chief:
      known = self.evals.update_samples
      self.sess.run(self.mark_samples[0], {self.mark_samples[1]: [-1, -1] if known is None
                                           else [int(n) for n in known]})
      checkpoints.save_checkpoint(self.saver, self.sess, self.cfg.run.output_dir, step,
                                  keep=self.cfg.run.keep_checkpoint_max)
      if self.record_pending:
        checkpoints.write_run_marker(self.cfg.run.output_dir, self.record)
        self.record_pending = False
    self.last_saved = step
    return True


def start(cfg, inputs, ranks, device, notes):
  """Sets the run up: the session's config, the global batch, MLPerf's RCP and
  evaluation interval, the seed and the resume plan (resume.py), the logs, the graph
  and session (start_session); then MLPerf's clock, and the small record sets read whole
  (inputs.read_records_through). Returns a Job."""
  gpu = None
  if device.kind == "GPU":
    gpu = "all" if ranks.strategy else device_lib.gpu_index(ranks, len(device.gpus))
  config = pretraining.session_config(
      cfg.runtime.intra_op_threads or max(1, (os.cpu_count() or 1) // ranks.local_size),
      cfg.runtime.inter_op_threads or 2, gpu, cfg.runtime.use_xla,
      cfg.runtime.cpu_devices if device.kind == "CPU" else 1)
  global_batch_size = inputs_lib.global_batch_size(cfg, ranks.replicas, inputs.packing)
  notes = list(notes)
  rcp = None
  try:
    rcp = mlperf.choose_rcp(global_batch_size, mlperf.load_rcps())
  except ValueError as e:
    notes.append("MLPerf's RCPs: %s; no projected time to train" % e)
  learning_rate = cfg.optimizer.learning_rate * (
      ranks.replicas if cfg.optimizer.scale_lr_by_ranks else 1)
  seed, seed_line = resume_lib.choose_seed(cfg, inputs, ranks, device, config)
  record = resume_lib.run_record(cfg, inputs.bert_config, ranks, seed, global_batch_size,
                                 inputs.train_files, learning_rate, device.dtype.name)
  plan = resume_lib.resume_plan(cfg, inputs, record)
  eval_interval = (cfg.evaluation.samples_between_eval or
                   mlperf.eval_interval_samples(global_batch_size))
  if cfg.run.clear_cache and ranks.local_rank == 0:  # once a host
    ranks.doing = "dropping the page cache (--clear_cache)"
    mlperf.clear_cache()
  # A run that trains nothing (an evaluation, or a finished run started again) is no
  # MLPerf run: a log of it would hold a run_stop, even a success, without training.
  skipped = skipped_updates(inputs.resume_checkpoint)
  per_update = inputs_lib.sentences_per_update(cfg, ranks.replicas, inputs.packing)
  offset = 0.0
  if inputs.resume_position is not None:  # the checkpoint's data position: what was read
    offset = meters.samples_offset(inputs.resume_position * inputs.packing.sequences_per_record,
                                   inputs.resume_step, per_update, skipped)
  update_samples = checkpoint_update_samples(inputs.resume_checkpoint)
  finished = resume_lib.reached_target_before(cfg, inputs, meters.reached_point(
      inputs.resume_step or 0, per_update, skipped, cfg.evaluation.samples_start_eval,
      eval_interval, offset, update_samples))
  trains = (cfg.run.do_train and (inputs.resume_step or 0) < cfg.optimizer.num_train_steps
            and not finished)
  logger = runlog.start_logs(cfg, ranks, device, config, global_batch_size, learning_rate,
                             seed, inputs.skipped_records, eval_interval,
                             attends_per_sequence(cfg, device), notes, inputs.packing,
                             mlperf_log=trains)
  if seed_line:
    logger.print(seed_line)
  peak = None  # (a card's matmul TFLOPS, where it comes from), for the MFU
  if cfg.run.peak_tflops > 0:
    peak = (cfg.run.peak_tflops, "--peak_tflops")
  elif cfg.run.measure_peak and cfg.run.do_train:
    ranks.doing = "measuring the matmul peak (--measure_peak)"
    peak = (timing.measure_peak_tflops(device.dtype, config=config),
            "measured in %s" % device.dtype.name)
    logger.print("Matmul peak: %.3g TFLOPS a card in %s (--measure_peak)"
                 % (peak[0], device.dtype.name))
  ranks.doing = "building the graph, then the session: the weights' broadcast from rank 0"
  sess, train, evaluator, saver, all_finite, mark_samples = start_session(
      cfg, inputs, ranks, device, config, learning_rate, seed, plan.position, logger)
  for line in plan.lines:
    logger.print(line)
  if ranks.is_chief and cfg.run.do_train and plan.record_now and not finished:
    checkpoints.write_run_marker(cfg.run.output_dir, record)
  logger.mlperf(logs.mllog.constants.INIT_STOP, kind="end")
  logger.mlperf(logs.mllog.constants.RUN_START, kind="start")
  ranks.doing = "reading the small record sets whole (framing, CRCs) on MLPerf's clock"
  with logger.run_stop_on_error():
    counted = inputs_lib.read_records_through(cfg, inputs)
    records = inputs_lib.records_per_update(cfg, ranks.replicas)
    missing, counted_shards = input_pipeline.missing_shards(inputs.train_files)
    if trains and missing:
      logger.warning(inputs.resume_step or 0, (
          "the training files are %d of the %d their names count: %s%s is not there; "
          "training on those found" % (counted_shards - len(missing), counted_shards,
                                       missing[0], " (and %d more)" % (len(missing) - 1)
                                       if len(missing) > 1 else "")))
    if trains and counted is not None and counted < records:
      logger.warning(inputs.resume_step or 0, (
          "the training set holds %d records, fewer than the %d an update reads (batch %d x "
          "accumulation %d x %d replicas): every update repeats records; pass more data or a "
          "smaller batch" % (counted, records, cfg.run.train_batch_size,
                             cfg.optimizer.num_accumulation_steps, ranks.replicas)))
    return Job(cfg, ranks, sess=sess, train=train, evaluator=evaluator, saver=saver,
               all_finite=all_finite, logger=logger, rcp=rcp, record=record,
               record_pending=not plan.record_now, trains=trains, finished=finished,
               eval_interval=eval_interval, peak=peak, bert_config=inputs.bert_config,
               packing=inputs.packing, skipped=skipped, samples_offset=offset,
               mark_samples=mark_samples, update_samples=update_samples)


def checkpoint_update_samples(checkpoint):
  """The samples read (before, after) the update `checkpoint` was saved after
  (checkpoints.UPDATE_SAMPLES); None without a checkpoint, for one of an older version,
  or when not known."""
  value = checkpoints.checkpoint_value(checkpoint, checkpoints.UPDATE_SAMPLES) \
      if checkpoint else None
  if value is None or min(value) < 0:
    return None
  return tuple(int(n) for n in value)


def skipped_updates(checkpoint):
  """The updates float16's loss scaling skipped in the run that saved `checkpoint` (its
  batches were read: MLPerf's samples count them), also when this run computes in
  another type; 0 without one."""
  value = checkpoints.checkpoint_value(checkpoint, "loss_scale/skipped_steps") \
      if checkpoint else None
  return int(value or 0)


def start_session(cfg, inputs, ranks, device, config, learning_rate, seed, position,
                  logger):
  """Builds the graph (the training step, the evaluator, the checkpoint ops), then starts
  the session: the weights from the checkpoint to resume from, else --init_checkpoint,
  else random (the same on every rank), and the training data where the run stands.

  seed: the run's (resume.choose_seed). position: the place in the data order to
  continue at (resume.resume_plan), set into the data position of a checkpoint that
  lacks one.

  Returns:
    (sess, train, evaluator, saver, all_finite, mark_samples): train is a
    pretraining.TrainGraph (None without --do_train), evaluator a pretraining.Evaluator
    (None without --do_eval), all_finite the op of checkpoints.all_finite, mark_samples
    (op, feed) that sets checkpoints.UPDATE_SAMPLES to the pair fed (before a save).
  """
  tf.set_random_seed(seed)
  # Under a tf.distribute strategy the variables are mirrored over its replicas.
  with ranks.scope():
    global_step = tf.train.get_or_create_global_step()
    train = set_position = None
    if cfg.run.do_train:
      skip_samples = tf.placeholder_with_default(tf.constant(0, tf.int64), [])
      # The job's replicas take the micro-batches of one order in turn; this process's
      # replicas are ranks.local_replicas consecutive ones.
      dataset = input_pipeline.make_dataset(
          inputs.train_files, cfg.run.train_batch_size, cfg.data.max_seq_length,
          inputs.packing.max_predictions, is_training=True, num_shards=ranks.replicas,
          shard_index=ranks.rank * ranks.local_replicas, local_shards=ranks.local_replicas,
          shuffle_buffer=cfg.data.shuffle_buffer, seed=seed,
          vocab_size=inputs.bert_config.vocab_size,
          skip_records=inputs.skipped_records.bad, skip_samples=skip_samples,
          max_sequences=inputs.packing.max_sequences)
      train_iterator = ranks.iterator(dataset)
      train = pretraining.build_train_graph(
          inputs.bert_config, train_iterator.get_next(), device.dtype, cfg.optimizer,
          learning_rate, ranks=ranks,
          attention_per_sequence=attends_per_sequence(cfg, device), seed=seed)
      if inputs.resume_checkpoint and inputs.resume_position is None:
        # An older version's checkpoint has no data position: resume_plan's is set.
        set_position = train.data_position.assign(tf.constant(position, tf.int64))
    evaluator = None
    if cfg.evaluation.do_eval:
      evaluator = pretraining.Evaluator(inputs.bert_config, inputs.eval_files, ranks,
                                        device.dtype, cfg.evaluation.eval_batch_size,
                                        cfg.data.max_seq_length,
                                        cfg.data.max_predictions_per_seq,
                                        cfg.evaluation.max_eval_steps)
    model_variables = tf.trainable_variables()
    samples_feed = tf.placeholder(tf.int64, [2])
    mark_samples = (tf.get_variable(checkpoints.UPDATE_SAMPLES, [2], tf.int64, trainable=False,
                                    initializer=tf.constant_initializer(-1)).assign(
                                        samples_feed), samples_feed)
    # checkpoints.save_checkpoint rotates, not the Saver. Relative paths in the `checkpoint`
    # file keep a copied or moved output_dir pointing at its own files.
    saver = tf.train.Saver(max_to_keep=None, save_relative_paths=True)
    # Checked before every save: nothing with NaN or Inf is written. Weights are the same
    # on every rank, so every rank gets the same answer and they stop together.
    all_finite = checkpoints.all_finite(tf.global_variables())
    broadcast_op = ranks.broadcast_op()

  sess = ranks.session(config)
  sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
  restore(sess, global_step, model_variables, inputs, logger)
  if set_position is not None:
    sess.run(set_position)
  if broadcast_op is not None:
    sess.run(broadcast_op)
  if cfg.run.do_train:
    # Every process continues the one order at the position rank 0 restored.
    sess.run(train_iterator.initializer, {skip_samples: sess.run(train.data_position)})
  sess.graph.finalize()  # Nothing may add ops inside the loop.
  return sess, train, evaluator, saver, all_finite, mark_samples


def restore(sess, global_step, model_variables, inputs, logger):
  """Starts the weights: all variables from the checkpoint to resume from, else the
  model's from --init_checkpoint, else the random ones the session initialized; the
  JSON-lines log's "weights" record says which (and a warning, the weights
  --init_checkpoint lacked)."""
  prefix = inputs.resume_checkpoint
  if prefix:
    checkpoints.check_resumable(prefix, tf.global_variables())
    present = dict(tf.train.list_variables(prefix))
    tf.train.Saver(var_list=[v for v in tf.global_variables()
                             if checkpoints.variable_name(v) in present]).restore(sess, prefix)
    step = int(sess.run(global_step))
    logger.print("Resuming from %s at step %d (weights, optimizer state, learning-rate "
                 "schedule); --init_checkpoint is not applied" % (prefix, step))
    logger.record("weights", {"from": "resumed", "checkpoint": prefix, "step": step})
  elif inputs.init_checkpoint:
    fresh = checkpoints.restore_model_weights(
        sess, inputs.init_checkpoint, model_variables, log=logger.print,
        warn=lambda line: logger.warning(0, line))
    logger.record("weights", {"from": "init_checkpoint", "checkpoint": inputs.init_checkpoint,
                              "loaded": len(model_variables) - len(fresh), "fresh": fresh})
  else:
    logger.print("No --init_checkpoint: the model starts from random weights")
    logger.record("weights", {"from": "random"})
