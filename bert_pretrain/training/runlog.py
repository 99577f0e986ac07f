"""What a pretraining run prints and records: the lines users grep, the JSON-lines records,
MLPerf's log keys and the run's closing summary. The loop (loop.py) calls these; they read
the settings (config.Settings) they are given and nothing else.

  device: CPU, 2 cores, compute bfloat16
  Step 100, total_loss: 7.1, mlm_loss: 6.4, nsp_loss: 0.69, learning_rate: 1e-4, ...
  | 1 card | acc 0.41 | fps 812.3 | status aborted |
  projected time to train: 3 h 16 min (2414421 samples, the mean of MLPerf's ...)
"""

import os

import numpy as np

from bert_pretrain.data import input_pipeline
from bert_pretrain.distributed import device as device_lib
from bert_pretrain.training import logs
from bert_pretrain.training import mlperf
from bert_pretrain.training import optimization
from bert_pretrain.training import timing

def start_logs(cfg, ranks, device, config, global_batch_size, learning_rate, seed,
               skipped_records, eval_interval, per_sequence, notes, packing, mlperf_log=True):
  """Opens the run's logs and writes what the run is: its device, its batch and
  optimizer, MLPerf's hyperparameters, the training records left out.

  cfg: config.Settings. config: the session's tf.ConfigProto (TensorFlow 1.15 names a
  GPU with it). per_sequence: the training graph attends sequence by sequence. notes:
  lines to print after the run's description. packing: inputs.Packing of the training
  records (a packed run's batch counts packs, its samples sequences). mlperf_log: False
  for a run that trains nothing, which writes no MLPerf log (and says so).

  Returns:
    logs.RunLogger.
  """
  name = ""
  if device.kind == "GPU" and ranks.is_chief:
    index = 0 if ranks.strategy else device_lib.gpu_index(ranks, len(device.gpus))
    name = device_lib.gpu_name(device.gpus[index], config)
  where = device_lib.device_line(device, ranks, name)
  mllog_path = None
  if mlperf_log:
    mllog_path = cfg.run.mllog_path or logs.new_log_path(cfg.run.output_dir, "mlperf", ".log")
  logger = logs.RunLogger(
      output_dir=cfg.run.output_dir, is_chief=ranks.is_chief,
      dllog_path=cfg.run.dllog_path or os.path.join(cfg.run.output_dir, "dllog.json"),
      mllog_path=mllog_path)
  logger.mlperf(logs.mllog.constants.INIT_START, kind="start")
  logger.print("device: " + where)
  logger.mlperf("device", where)
  logger.record("device", {"device": where, "kind": device.kind,
                           "compute_type": device.dtype.name, "why": device.why})
  per_update = "%d sentences" % global_batch_size
  if packing.max_sequences is not None:
    packs = cfg.run.train_batch_size * cfg.optimizer.num_accumulation_steps * ranks.replicas
    per_update = "%d packs of up to %d sentences, %.2f sentences at the data's %.3f a pack" % (
        packs, packing.max_sequences, packs * packing.sequences_per_record,
        packing.sequences_per_record)
  logger.print("bert_pretrain: %d rank(s), batch %d x %d accumulation x %d ranks = %s "
               "per update, seq %d, %s compute%s, optimizer %s, lr %g%s, "
               "distribution %s%s"
               % (ranks.replicas, cfg.run.train_batch_size,
                  cfg.optimizer.num_accumulation_steps, ranks.replicas, per_update,
                  cfg.data.max_seq_length, device.dtype.name,
                  " (XLA)" if cfg.runtime.use_xla else "", cfg.optimizer.optimizer,
                  learning_rate, " (scaled by ranks)" if cfg.optimizer.scale_lr_by_ranks else "",
                  ranks.distribution,
                  ", attention per sequence" if cfg.run.do_train and per_sequence else ""))
  for note in notes:
    logger.print(note)
  if not mlperf_log:
    logger.print("MLPerf log: none, this run trains nothing")
  rule = optimizer_rule(cfg.optimizer, ranks.replicas)
  logger.print("optimizer: %s; evaluation every %d samples%s" % (
      rule, eval_interval, "" if cfg.evaluation.samples_between_eval else
      " (MLPerf's interval for a global batch of %d)" % global_batch_size))
  logger.record("optimizer", {"rule": rule, "optimizer": cfg.optimizer.optimizer,
                              "lamb_adapt_layernorm_and_bias":
                                  cfg.optimizer.lamb_adapt_layernorm_and_bias,
                              "gradient_clipping": cfg.optimizer.gradient_clipping,
                              "cross_replica_gradients":
                                  cfg.optimizer.cross_replica_gradients,
                              "lr_schedule_step": cfg.optimizer.lr_schedule_step,
                              "samples_between_eval": eval_interval})
  log_hyperparameters(cfg, logger, ranks, global_batch_size, learning_rate, seed)
  if cfg.data.skip_corrupt_records:
    bad = skipped_records.bad
    logger.print("--skip_corrupt_records: %d of %d training records skipped%s"
                 % (len(bad), skipped_records.records,
                    "; first: " + input_pipeline.describe_bad_record(bad[0]) if bad else ""))
    logger.metrics(0, {"skipped_records": len(bad), "records": skipped_records.records},
                   prefix="data")
  return logger


def optimizer_rule(opt, replicas=1):
  """One line on the optimizer's rules that recipes differ in: LAMB's layer adaptation,
  where the gradients are clipped, and with several ranks or micro-batches how the
  gradients are combined and what the schedule steps by (opt: config.Optimizer)."""
  clipping = ("gradients clipped to norm 1.0 per micro-batch on each rank (MLPerf's "
              "reference)" if opt.gradient_clipping == optimization.CLIP_PER_MICRO_BATCH
              else "gradients clipped to norm 1.0 after accumulation and all-reduce")
  rules = [opt.optimizer]
  if opt.optimizer == "lamb":
    rules.append("trust ratio on every variable (NVIDIA's LAMB)"
                 if opt.lamb_adapt_layernorm_and_bias else
                 "LayerNorm and bias without trust ratio (MLPerf's reference)")
  rules.append(clipping)
  if replicas > 1:
    rules.append("summed over the %d ranks (MLPerf's reference)" % replicas
                 if opt.cross_replica_gradients == "sum" else
                 "averaged over the %d ranks" % replicas)
  if opt.num_accumulation_steps > 1:
    rules.append("learning rate stepped per micro-batch (MLPerf's reference)"
                 if opt.lr_schedule_step == "micro_batch" else "learning rate stepped per update")
  return ", ".join(rules)


def log_hyperparameters(cfg, logger, ranks, global_batch_size, learning_rate, seed):
  """The MLPerf hyperparameter keys of the BERT benchmark, and the run's seed, which
  MLPerf's rules (from v4.1) require in the log: the package checker refuses a run
  without one."""
  c = logs.mllog.constants
  logger.mlperf(c.SEED, seed)
  logger.mlperf(c.SUBMISSION_BENCHMARK, "bert")
  logger.mlperf(c.SUBMISSION_ORG, cfg.run.submission_org)
  logger.mlperf(c.SUBMISSION_PLATFORM, cfg.run.submission_platform)
  logger.mlperf(c.SUBMISSION_DIVISION, "closed")
  logger.mlperf(c.SUBMISSION_STATUS, "onprem")
  logger.mlperf(c.CACHE_CLEAR, cfg.run.clear_cache)  # dropped by loop.start
  logger.mlperf(c.GLOBAL_BATCH_SIZE, global_batch_size)
  logger.mlperf("train_batch_size", cfg.run.train_batch_size)
  logger.mlperf("max_sequence_length", cfg.data.max_seq_length)
  logger.mlperf("max_predictions_per_seq", cfg.data.max_predictions_per_seq)
  logger.mlperf(c.GRADIENT_ACCUMULATION_STEPS, cfg.optimizer.num_accumulation_steps)
  logger.mlperf(c.OPT_BASE_LR, learning_rate)
  logger.mlperf(c.OPT_LAMB_EPSILON, cfg.optimizer.epsilon)
  logger.mlperf(c.OPT_LR_TRAINING_STEPS, cfg.optimizer.num_train_steps)
  logger.mlperf(c.OPT_LR_WARMUP_STEPS, cfg.optimizer.num_warmup_steps)
  logger.mlperf("num_warmup_steps", cfg.optimizer.num_warmup_steps)
  logger.mlperf("start_warmup_step", cfg.optimizer.start_warmup_step)
  logger.mlperf(c.OPT_LAMB_BETA_1, cfg.optimizer.beta_1)
  logger.mlperf(c.OPT_LAMB_BETA_2, cfg.optimizer.beta_2)
  logger.mlperf(c.OPT_LAMB_WEIGHT_DECAY, cfg.optimizer.weight_decay_rate)
  logger.mlperf(c.OPT_LAMB_LR_DECAY_POLY_POWER, cfg.optimizer.poly_power)
  logger.mlperf("opt_name", cfg.optimizer.optimizer)
  logger.mlperf("num_ranks", ranks.replicas)
  logger.mlperf("distribution", ranks.distribution)


def log_step(logger, monitor, sess, train, values, step, meter, step_start, samples):
  """Logs the losses and the throughput of a display step and the health warnings.

  values: what sess.run returned for train.display_fetches; meter: meters.Throughput;
  step_start: when the update began (time.time()); samples: those read so far
  (meters.EvalSchedule.read).

  Returns:
    False when the loss is not finite (and says so): the run must stop.
  """
  window_fps, window_seconds = meter.window_fps(), meter.window_seconds()
  total_loss, mlm_loss, nsp_loss = values["losses"]
  line = ("Step %d, total_loss: %.4f, mlm_loss: %.4f, nsp_loss: %.4f, learning_rate: %.3e, "
          "sentences_per_second: %.2f" % (step, total_loss, mlm_loss, nsp_loss,
                                          values["learning_rate"], window_fps))
  if train.loss_scale is not None:
    line += ", loss_scale: %g, skipped_steps: %d" % (values["loss_scale"],
                                                     values["skipped_steps"])
  logger.print(line)
  logged = {"total_loss": total_loss, "mlm_loss": mlm_loss, "nsp_loss": nsp_loss,
            "learning_rate": values["learning_rate"], "throughput_train": window_fps,
            "samples": samples}
  scale = skipped = None
  if train.loss_scale is not None:
    scale, skipped = values["loss_scale"], values["skipped_steps"]
    logged.update(loss_scale=scale, skipped_steps=skipped)
  logger.metrics(step, logged, prefix="train")
  warnings = monitor.window(step, window_fps, meter.window_steps, scale, skipped,
                            window_seconds)
  if train.rank_times is not None:
    own_time = values["forward_done"] - step_start
    warnings += monitor.rank_step_times(
        step, list(sess.run(train.rank_times, {train.rank_time: [own_time]})))
  for warning in warnings:
    logger.warning(step, warning)
  # All ranks see the same averaged loss, so they stop together. With loss scaling a
  # non-finite step is skipped, not fatal.
  if np.isfinite(total_loss) or train.loss_scale is not None:
    return True
  logger.print("Loss is %s at step %d: stopping without saving. Lower --learning_rate "
               "or raise --num_warmup_steps" % (total_loss, step))
  return False


def log_summary(cfg, logger, step, meter, evals, results, results_at_start, status,
                num_ranks, e2e_time, rcp, where=None, stopped=False):
  """The run's closing lines: time, throughput, where the time went (where: the keyword
  arguments of log_where_time_goes but fps and replicas), the one-line table row
  "| 1 card | acc ... | fps ... | status ... |" and the projected time to train (rcp:
  mlperf.RcpChoice); also a dllog record of type summary. stopped: a signal ended the
  run, whose row then says aborted even without a target."""
  eval_time = evals.eval_time
  fps_all, fps_steady = meter.averages()
  # samples: the run's, all processes' (the report's count when the run stopped between
  # two log lines); training_sentences: this process's.
  summary = {"e2e_time_s": e2e_time,
             "samples": evals.read(step),
             "training_sentences": meter.sentences,
             "checkpoint_time_s": meter.checkpoint_time, "eval_time_s": eval_time}
  if meter.sentences:
    # The steady sentences and time let the report add up a run resumed in parts.
    summary.update(throughput_with_overhead=fps_all, throughput=fps_steady,
                   steady_sentences=meter.steady_sentences, steady_time_s=meter.steady_time)
  if results_at_start and cfg.run.do_train:
    logger.print("masked_lm_accuracy %s: %.4f" % (
        "at the start (step %d, resumed)" % results_at_start["step"]
        if results_at_start["step"] else "before training",
        results_at_start["masked_lm_accuracy"]))
  logger.print("e2e_time: %.2f s, training sentences: %d, checkpoint time: %.2f s, eval time: "
               "%.2f s" % (e2e_time, round(meter.sentences), meter.checkpoint_time,
                           eval_time))
  log_throughput(cfg, logger, meter)
  if where is not None and cfg.run.do_train:
    summary.update(log_where_time_goes(logger, fps_steady, replicas=num_ranks, **where))
  accuracy = results.get("masked_lm_accuracy") if results else None
  cards = "1 card" if num_ranks == 1 else "%d cards" % num_ranks
  logger.print("| %s | acc %s | fps %s | status %s |"
               % (cards, "%.6f" % accuracy if accuracy is not None else "n/a",
                  "%.2f" % fps_steady if meter.sentences else "n/a",
                  status if cfg.evaluation.stop_threshold > 0 or stopped else "no target"))
  if cfg.run.do_train and meter.sentences and rcp is not None:
    summary.update(log_time_to_train(logger, fps_steady, evals, rcp, status, step,
                                     meter.batch_size))
  logger.metrics(step, summary, prefix="summary")


def log_throughput(cfg, logger, meter):
  """Prints the training throughput: with overhead, then after the warm-up."""
  fps_all, fps_steady = meter.averages()
  if not meter.sentences:
    # A zero would read as a measurement: a finished run resumed or an evaluation alone.
    logger.print("Throughput Average (sentences/sec): not measured, this process trained no "
                 "update")
    return
  logger.print("Throughput Average (sentences/sec) with overhead = %.2f (warm-up and "
               "checkpoint time included, evaluation excluded)" % fps_all)
  if meter.steady_time > 0:
    logger.print("Throughput Average (sentences/sec) = %.2f (after %d warm-up steps, without "
                 "checkpoint and eval time)" % (fps_steady, cfg.run.fps_warmup_steps))
  else:  # meter.averages gave the average with overhead
    logger.print("Throughput Average (sentences/sec) = %.2f (with overhead: no update is "
                 "left once the %d warm-up steps, the traced one and the first to log the "
                 "losses are out; train more updates or lower --fps_warmup_steps)"
                 % (fps_steady, cfg.run.fps_warmup_steps))


def log_where_time_goes(logger, fps, tokens, split, flops_per_sequence, peak, replicas):
  """Prints where the run's time went: real and padded tokens per second and the padding
  share (tokens: timing.Tokens), the traced update's split (split: timing.split_update's
  dict with "update", or None) and a hint when one part dominates, the MFU (flops:
  Job.flops_per_sequence; peak: (TFLOPS a card, where it comes from) or None). Returns
  the figures for the summary record."""
  figures = {}
  padding = tokens.padding_share()
  if padding is None or not fps:
    return figures  # nothing trained in this process
  padded = fps * tokens.positions_per_sequence()
  figures.update(padding_share=padding, real_tokens_per_s=padded * (1 - padding),
                 padded_tokens_per_s=padded)
  logger.print("Tokens per second: %.0f real, %.0f with the padding (padding %.1f%% of "
               "the positions)" % (padded * (1 - padding), padded, 100 * padding))
  if split is not None and split["step"] > 0:
    shares = {part: split[part] / split["step"] for part in timing.SHARES}
    figures.update({"time_%s_share" % part: share for part, share in shares.items()},
                   ranks=replicas)
    logger.print("Update time (update %d traced, %.3f s): %s" % (
        split["update"], split["step"], timing.format_shares(shares, replicas)))
    for hint in timing.hints(shares, replicas):
      logger.print("Hint: " + hint)
  utilization = timing.mfu(fps, flops_per_sequence, peak[0] if peak else None, replicas)
  if utilization is None:
    logger.print("MFU: not computed (%.3g GFLOP a sequence at its real tokens); pass "
                 "--peak_tflops=<a card's matmul peak> or --measure_peak"
                 % (flops_per_sequence / 1e9))
  else:
    figures.update(mfu=utilization, peak_tflops=peak[0])
    logger.print("MFU: %.1f%% of %.3g TFLOPS a card (%s), %.3g GFLOP a sequence at its "
                 "real tokens" % (100 * utilization, peak[0], peak[1], flops_per_sequence / 1e9))
  return figures


def log_time_to_train(logger, throughput, evals, rcp, status, step, batch_size):
  """Prints the projected time to train to MLPerf's target at `throughput`: the RCP's mean
  samples to converge (rcp: mlperf.RcpChoice), plus MLPerf's evaluations of eval_10k at
  the rule's interval, timed by this run's evaluations; after a run that reached the
  target, its samples beside the RCP's. Returns the figures for the summary record."""
  per_sample = evals.eval_time / evals.eval_samples if evals.eval_samples else None
  # MLPerf's interval takes the global batch as the run does, a whole number.
  total, evaluations, eval_seconds = mlperf.projected_time_to_train(
      rcp.samples_mean, throughput, int(round(batch_size)), per_sample)
  logger.print("projected time to train: %s (%.0f samples, the mean of MLPerf's %s, at "
               "%.2f sentences/s, and %d evaluations of %d samples: %s)"
               % (mlperf.format_duration(total), rcp.samples_mean, rcp.judged_by, throughput,
                  evaluations, mlperf.EVAL_SAMPLES,
                  mlperf.format_duration(eval_seconds) if eval_seconds is not None
                  else "not timed, the run did not evaluate"))
  figures = {"projected_time_to_train_s": total, "rcp_samples_mean": rcp.samples_mean}
  if status == "success":
    samples = evals.read(step)
    logger.print("samples to converge: %d; %s: mean %.0f, stdev %.0f (%.2f of the mean)"
                 % (samples, rcp.judged_by, rcp.samples_mean, rcp.samples_stdev,
                    samples / rcp.samples_mean))
    figures["samples_to_converge"] = samples
  return figures


def check_initial_accuracy(cfg, logger, accuracy, init_checkpoint):
  """The load check: the accuracy right after loading --init_checkpoint beside the
  expected one, and a warning when they are apart."""
  expected = cfg.evaluation.expected_initial_accuracy
  if expected is None:
    expected = mlperf.expected_initial_accuracy(init_checkpoint)
  if expected is None:
    return
  logger.print("masked_lm_accuracy after loading %s: %.5f (expected %.5f)"
               % (os.path.basename(init_checkpoint), accuracy, expected))
  warning = mlperf.initial_accuracy_warning(accuracy, expected,
                                            cfg.evaluation.initial_accuracy_tolerance)
  if warning:
    logger.warning(0, warning)


def log_records(log, update, micro_batch, record_ids):
  """One line of --log_trained_records: the update (global_step after it), the
  micro-batch and the fingerprints of its records (pretraining.record_fingerprints)."""
  log.write("%d %d %s\n" % (update, micro_batch, " ".join(str(i) for i in record_ids)))
  log.flush()


