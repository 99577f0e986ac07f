"""BERT pretraining (masked LM + next sentence): the training and evaluation loop.

Runs on one card, or on many with --horovod (one process per card, launched by
run_multi_card_FPS.sh). Plain tf.compat.v1 Session code, so the same file runs on
TensorFlow 1.15 and 2.x:

  get batch -> forward -> backward -> (accumulate) -> all-reduce -> LAMB step -> log
  -> checkpoint -> evaluate, until --num_train_steps or masked-LM accuracy reaches
  --stop_threshold.

This file holds the flags, their checks and the loop (run()). The graph is built by
pretraining.py, the device chosen by device.py, the ranks set up by ranks.py; the
loop's throughput and MLPerf evaluation bookkeeping live in meters.py.

python3 -m bert_pretrain.run_pretraining --input_files_dir=... --eval_files_dir=... \
    --bert_config_file=bert_config.json --init_checkpoint=model.ckpt-28252 \
    --output_dir=./results --train_batch_size=6
"""

import collections
import os
import sys
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain import checkpoints
from bert_pretrain import device as device_lib
from bert_pretrain import errors
from bert_pretrain import health
from bert_pretrain import input_pipeline
from bert_pretrain import logs
from bert_pretrain import meters
from bert_pretrain import mlperf
from bert_pretrain import modeling
from bert_pretrain import optimization
from bert_pretrain import pretraining
from bert_pretrain import ranks as ranks_lib
from bert_pretrain import report
from bert_pretrain import signals

flags.DEFINE_string("input_files_dir", None, "Folder (or glob) of the training TFRecords.")
flags.DEFINE_string("eval_files_dir", None, "Folder (or glob) of the evaluation TFRecords.")
flags.DEFINE_string("bert_config_file", None, "bert_config.json of the model to train.")
flags.DEFINE_string("init_checkpoint", None,
                    "Checkpoint whose model weights start the run: a prefix "
                    "(model.ckpt-28252), one of its files, or a folder. Ignored when "
                    "--output_dir already holds a checkpoint of this recipe (resume).")
flags.DEFINE_string("output_dir", "./results", "Checkpoints, TensorBoard events, eval results.")
flags.DEFINE_string("vocab_file", None, "(optional) vocab.txt; checked against vocab_size.")
flags.DEFINE_string("dllog_path", None, "JSON-lines log (default: output_dir/dllog.json).")
flags.DEFINE_string("mllog_path", None, "MLPerf log (default: output_dir/mlperf.log).")
flags.DEFINE_bool("draw_report", True, "Draw output_dir/report.png at the end (losses, "
                  "accuracy, throughput, learning rate); the summary lines are printed either "
                  "way. --nodraw_report saves the 1.5 s of matplotlib in short runs.")

flags.DEFINE_bool("do_train", True, "Train.")
flags.DEFINE_bool("do_eval", True, "Evaluate on --eval_files_dir (periodically and at the end).")
flags.DEFINE_bool("eval_at_start", False, "Also evaluate before the first training step.")
flags.DEFINE_integer("max_seq_length", 512, "Tokens per sequence; must match the records.")
flags.DEFINE_integer("max_predictions_per_seq", 76, "Masked positions per sequence; must "
                     "match the records.")
flags.DEFINE_integer("train_batch_size", 24, "Sequences per micro-batch on each card.")
flags.DEFINE_integer("eval_batch_size", 24, "Sequences per evaluation batch on each card.")
flags.DEFINE_integer("max_eval_steps", 0, "Evaluation batches per card (0: the whole set).")
flags.DEFINE_integer("num_train_steps", 13206, "Optimizer updates to train for.")
flags.DEFINE_integer("num_warmup_steps", 0, "Updates of linear learning-rate warm-up.")
flags.DEFINE_integer("start_warmup_step", 0, "Update at which the warm-up starts.")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate.")
flags.DEFINE_float("poly_power", 1.0, "Power of the polynomial learning-rate decay.")
flags.DEFINE_enum("optimizer", "lamb", ["lamb", "adam"], "LAMB or Adam with weight decay.")
flags.DEFINE_float("weight_decay_rate", 0.01, "Decoupled weight decay (not on LayerNorm, bias).")
flags.DEFINE_float("beta_1", 0.9, "First-moment decay.")
flags.DEFINE_float("beta_2", 0.999, "Second-moment decay.")
flags.DEFINE_float("epsilon", 1e-6, "Optimizer epsilon.")
flags.DEFINE_bool("lamb_adapt_layernorm_and_bias", False, "LAMB's trust ratio "
                  "||w|| / ||update|| for LayerNorm and bias variables too, as NVIDIA's LAMB "
                  "does; by default they keep a ratio of 1, as in MLPerf's reference.")
flags.DEFINE_enum("gradient_clipping", optimization.CLIP_PER_MICRO_BATCH,
                  list(optimization.CLIPPING), "Where gradients are clipped to global norm "
                  "1.0: per_micro_batch (MLPerf's reference and NVIDIA: each micro-batch's "
                  "gradient on each rank, before accumulation and the all-reduce) or "
                  "after_allreduce (the update's mean gradient; then k micro-batches of b "
                  "and r ranks update as one batch of k*r*b). MLPerf's rules allow both.")
flags.DEFINE_bool("reference_hyperparameters", False, "Take the learning rate, steps, "
                  "warm-up, betas, epsilon and weight decay of MLPerf's reference "
                  "convergence point (RCP) for the run's global batch size; flags given "
                  "on the command line still win, and the log names the RCP.")
flags.DEFINE_integer("num_accumulation_steps", 1, "Micro-batches summed into one update.")
flags.DEFINE_bool("allreduce_post_accumulation", True, "All-reduce once per update, after "
                  "accumulation (otherwise after every micro-batch).")
flags.DEFINE_bool("scale_lr_by_ranks", False, "Multiply --learning_rate by the number of ranks.")
flags.DEFINE_integer("save_checkpoints_steps", 1000, "Save a checkpoint every this many updates "
                     "(and always at the end).")
flags.DEFINE_integer("keep_checkpoint_max", 5, "Checkpoints kept in output_dir.")
flags.DEFINE_integer("display_loss_steps", 10, "Log losses and throughput every this many "
                     "updates.")
flags.DEFINE_integer("fps_warmup_steps", 10, "Updates left out of the steady-state FPS.")
flags.DEFINE_integer("samples_between_eval", None, "Evaluate every this many training "
                     "samples (default: MLPerf's rule for the global batch size, "
                     "floor(0.05 * (230.23 * batch + 3e6) / 25000) * 25000).")
flags.DEFINE_integer("samples_start_eval", 0, "No periodic evaluation before this many "
                     "training samples (MLPerf's evaluations start at 0).")
flags.DEFINE_float("expected_initial_accuracy", None, "Masked-LM accuracy expected right "
                   "after loading --init_checkpoint, checked by the evaluation at start "
                   "(--eval_at_start; a warning when it is off by more than "
                   "--initial_accuracy_tolerance). Default: 0.34085 for MLPerf's "
                   "model.ckpt-28252 on eval_10k, none for other checkpoints.")
flags.DEFINE_float("initial_accuracy_tolerance", 0.01, "See --expected_initial_accuracy.")
flags.DEFINE_float("stop_threshold", 0.72, "Stop when masked-LM accuracy reaches this (0: never).")
flags.DEFINE_enum("distribution", "none", list(ranks_lib.DISTRIBUTIONS),
                  "How several cards train together: horovod (one process per card, "
                  "launched by horovodrun or mpirun), mirrored (this process drives every "
                  "card of the host: tf.distribute.MirroredStrategy), multi_worker_mirrored "
                  "(one process per host, TF_CONFIG names the workers: "
                  "tf.distribute.experimental.MultiWorkerMirroredStrategy), none (one card).")
flags.DEFINE_bool("horovod", False, "Same as --distribution=horovod.")
flags.DEFINE_integer("cpu_devices", 1, "With --distribution=mirrored on a CPU: logical CPU "
                     "devices, one replica each (to try the engine; the cores are shared, "
                     "so it is no faster).")
flags.DEFINE_bool("amp", False, "Mixed precision: float16 compute with loss scaling on GPUs, "
                  "bfloat16 on CPUs where TensorFlow computes it faster than float32, float32 "
                  "on others (see --amp_dtype); master weights stay float32.")
flags.DEFINE_bool("use_fp16", False, "Alias of --amp.")
flags.DEFINE_enum("amp_dtype", "auto", ["auto", "float16", "bfloat16"],
                  "Compute type of --amp (auto: float16 on GPUs, bfloat16 on CPUs with bfloat16 "
                  "instructions and oneDNN, float32 on others). float16 always uses dynamic "
                  "loss scaling, also on a CPU. Setting it implies --amp.")
flags.DEFINE_float("init_loss_scale", 2.0 ** 15, "Initial dynamic loss scale of float16 "
                   "compute (x2 after 1000 good steps, halved by an overflowing one).")
flags.DEFINE_enum("device", "auto", ["auto", "gpu", "cpu"],
                  "auto: a GPU if TensorFlow sees one, else the CPU, but an error when "
                  "CUDA_VISIBLE_DEVICES lists cards TensorFlow cannot see; gpu: a GPU or an "
                  "error; cpu: the CPU on purpose, even where GPUs are visible.")
flags.DEFINE_bool("use_xla", False, "XLA JIT: auto-clustering of the graph (on a CPU too).")
flags.DEFINE_integer("intra_op_threads", 0, "Threads per op (0: cores / ranks on this host).")
flags.DEFINE_integer("inter_op_threads", 0, "Ops run at once (0: 2).")
flags.DEFINE_integer("shuffle_buffer", 10000, "Training records held for shuffling.")
flags.DEFINE_bool("skip_corrupt_records", False, "Read every training record before "
                  "training and leave out the corrupt ones (bad CRC, cut short, other "
                  "lengths, token ids outside the vocab), counted in the log, instead of "
                  "stopping at the first.")
flags.DEFINE_float("max_corrupt_share", 0.001, "With --skip_corrupt_records: stop when more "
                   "than this fraction of the training records is corrupt.")
flags.DEFINE_integer("full_record_check_mb", 256, "Data sets smaller than this (MB) are read "
                     "whole before training (CRCs, framing); larger ones check each file's "
                     "first record up front and locate a bad record when training meets it.")
flags.DEFINE_integer("stall_timeout_s", 300, "With several processes: a rank that does not "
                     "take part for this long (stuck in I/O, stopped, frozen), or has not "
                     "joined the job this long after a process started, is named and the "
                     "job ends with an error; sets Horovod's HOROVOD_STALL_CHECK_TIME_SECONDS "
                     "and HOROVOD_STALL_SHUTDOWN_TIME_SECONDS unless they are set (0: never).")
flags.DEFINE_integer("seed", None, "Random seed of the data order, the dropout masks and the "
                     "initialization. Without it a run draws one and records it in "
                     "output_dir/bert_pretrain_run.json, which a resumed run reuses.")
flags.DEFINE_list("allow_resume_change", [], "Resume although the run in --output_dir had "
                  "another: global_batch (continue at the same sample with updates of the "
                  "new size; steps and schedules go on counting updates), seed (another data "
                  "order and dropout masks), data (other training files). A changed layout "
                  "of the same global batch (ranks, engine, per-card batch, accumulation) "
                  "needs none: it continues at the same sample, re-sharded.")
flags.DEFINE_bool("log_trained_records", False, "Append a fingerprint of every record each "
                  "micro-batch trains on to output_dir/trained_records-rank-N.txt (N: the "
                  "process; lines 'update micro-batch fingerprints...'), to check which "
                  "records a run and its resumed runs trained on.")
flags.DEFINE_bool("allow_random_heads", False, "With --nodo_train: evaluate even weights "
                  "without the masked-LM or next-sentence head (a fine-tuned encoder, or no "
                  "checkpoint at all); those heads are random, so is the accuracy.")
flags.DEFINE_string("submission_org", "unknown", "MLPerf log: submitting organization.")
flags.DEFINE_string("submission_platform", "unknown", "MLPerf log: system name.")

# ---------------------------------------------------------------------------------------
# Flags of the anchors' run_pretraining.py (NVIDIA DeepLearningExamples, Habana's MLPerf
# BERT, Iluvatar's CoreX recipe) that users carry over. Those of the same name and meaning
# are defined above: --do_train, --do_eval, --amp, --use_fp16, --use_xla (--nouse_xla),
# --dllog_path, --init_loss_scale, --horovod, --num_accumulation_steps,
# --allreduce_post_accumulation, --beta_1, --beta_2, --epsilon, --weight_decay_rate,
# --samples_between_eval, --samples_start_eval, --stop_threshold and the rest. The first
# five below are other names of flags above; the others are accepted so that a carried-over
# command line runs, and anchor_flags() prints one line saying what this recipe does
# instead (it always does the thing, or the flag does not apply here).
flags.DEFINE_enum("optimizer_type", None, ["lamb", "adam"], "The anchors' --optimizer.")
flags.DEFINE_float("power", None, "The anchors' --poly_power.")
flags.DEFINE_integer("num_eval_iterations", None, "NVIDIA's --max_eval_steps (its fine-tuning "
                     "scripts'): evaluation batches per card.")
flags.DEFINE_bool("manual_fp16", False, "The anchors' float16 by casts in the graph: here "
                  "--amp (float16 with loss scaling on GPUs, bfloat16 on CPUs where it is "
                  "faster than float32, see --amp_dtype).")
flags.DEFINE_string("eval_checkpoint_path", None, "With --nodo_train: the checkpoint "
                    "evaluated, as --init_checkpoint.")
flags.DEFINE_bool("enable_device_warmup", False, "Accepted: the FPS always leaves out the "
                  "first --fps_warmup_steps updates.")
flags.DEFINE_bool("is_dist_eval_enabled", True, "Accepted: evaluation is always distributed "
                  "over the ranks.")
flags.DEFINE_integer("iterations_per_loop", 1, "Accepted: one update per session call.")
flags.DEFINE_bool("report_loss", True, "Accepted: losses are logged every "
                  "--display_loss_steps.")
flags.DEFINE_integer("save_summary_steps", 0, "Accepted: TensorBoard gets what is logged, "
                     "every --display_loss_steps.")
flags.DEFINE_bool("verbose_logging", False, "Accepted, no effect.")
flags.DEFINE_bool("checkpoint_all_workers", False, "Accepted: rank 0 writes the checkpoints.")
flags.DEFINE_bool("use_lightweight_checkpoint", False, "Accepted: checkpoints hold the "
                  "weights and the optimizer state.")
flags.DEFINE_bool("deterministic_run", False, "Accepted: --seed fixes the data order and "
                  "the dropout masks.")
flags.DEFINE_bool("enable_habana_backend", False, "Accepted: --device chooses the device.")
flags.DEFINE_bool("enable_packed_data_mode", False, "Accepted: records hold one sequence each.")
flags.DEFINE_integer("avg_seq_per_pack", 1, "Accepted: records hold one sequence each.")
flags.DEFINE_bool("compute_lm_loss_per_seq", False, "Accepted: records hold one sequence each.")
flags.DEFINE_integer("tf_profiler_begin_iter", 0, "Accepted: bench/profile_step.py profiles "
                     "a step.")
flags.DEFINE_integer("tf_profiler_num_iter", 0, "Accepted: bench/profile_step.py profiles a "
                     "step.")

FLAGS = flags.FLAGS


# What check_flags found: the BertConfig, the training and eval record files, the
# training records to leave out (input_pipeline.SkippedRecords), and the checkpoint
# prefixes to resume from (this recipe's newest in --output_dir) and of --init_checkpoint
# (each None when there is none); when resuming, the record of the run in --output_dir
# (its bert_pretrain_run.json, None without), the checkpoint's step and its place in
# the data order (None when an older version wrote it).
Inputs = collections.namedtuple("Inputs", [
    "bert_config", "train_files", "eval_files", "skipped_records", "resume_checkpoint",
    "init_checkpoint", "earlier_run", "resume_step", "resume_position"])

# What --allow_resume_change takes (see resume_plan).
RESUME_CHANGES = ("global_batch", "seed", "data")

# The flags every process of a job must share (checked by ranks.agree before the first
# collective): those that decide which collectives run when (a process that differs
# waits in one the others never start) and those that would train replicas apart.
JOB_FLAGS = ("num_train_steps", "train_batch_size", "num_accumulation_steps",
             "allreduce_post_accumulation", "do_train", "do_eval", "eval_at_start",
             "eval_batch_size", "max_eval_steps", "samples_between_eval",
             "samples_start_eval", "stop_threshold", "display_loss_steps",
             "max_seq_length", "max_predictions_per_seq", "optimizer", "learning_rate",
             "num_warmup_steps", "start_warmup_step", "poly_power", "scale_lr_by_ranks",
             "weight_decay_rate", "beta_1", "beta_2", "epsilon", "init_loss_scale",
             "shuffle_buffer", "seed", "lamb_adapt_layernorm_and_bias", "gradient_clipping",
             "reference_hyperparameters")


def check_flags():
  """Checks the flags and inputs that fail cheaply, before any graph is built.

  Returns:
    Inputs.

  Raises:
    ValueError: with the one-line message the user sees.
  """
  anchor_flags()
  if not FLAGS.bert_config_file:
    raise ValueError("--bert_config_file is required; pass --bert_config_file=PATH/bert_config.json")
  bert_config = modeling.BertConfig.from_json_file(FLAGS.bert_config_file)
  for name in ("train_batch_size", "eval_batch_size", "num_accumulation_steps",
               "max_seq_length", "max_predictions_per_seq", "display_loss_steps",
               "save_checkpoints_steps", "shuffle_buffer"):
    if getattr(FLAGS, name) < 1:
      raise ValueError("--%s=%d must be at least 1" % (name, getattr(FLAGS, name)))
  for name in ("num_warmup_steps", "start_warmup_step", "fps_warmup_steps",
               "keep_checkpoint_max", "max_eval_steps", "samples_start_eval"):
    if getattr(FLAGS, name) < 0:
      raise ValueError("--%s=%d must not be negative" % (name, getattr(FLAGS, name)))
  if FLAGS.horovod and FLAGS.distribution not in ("none", "horovod"):
    raise ValueError("--horovod and --distribution=%s disagree; pass one (with "
                     "run_multi_card_FPS.sh, which passes --horovod, set DISTRIBUTION=%s "
                     "instead)" % (FLAGS.distribution, FLAGS.distribution))
  device_lib.check_cpu_devices(FLAGS.cpu_devices, distribution())
  if not FLAGS.learning_rate > 0:
    raise ValueError("--learning_rate=%g must be positive (the peak of the schedule); pass "
                     "e.g. --learning_rate=%g" % (FLAGS.learning_rate,
                                                 FLAGS["learning_rate"].default))
  if FLAGS.reference_hyperparameters:
    mlperf.rcp_file()  # raises when mlperf-logging has no RCPs
  if FLAGS.samples_between_eval is not None and FLAGS.samples_between_eval < 1:
    raise ValueError("--samples_between_eval=%d must be at least 1 (or leave it out: "
                     "MLPerf's interval for the global batch)" % FLAGS.samples_between_eval)
  if FLAGS.initial_accuracy_tolerance < 0:
    raise ValueError("--initial_accuracy_tolerance=%g must not be negative"
                     % FLAGS.initial_accuracy_tolerance)
  if FLAGS.init_loss_scale < 1:
    raise ValueError("--init_loss_scale=%g must be at least 1" % FLAGS.init_loss_scale)
  unknown = sorted(set(FLAGS.allow_resume_change) - set(RESUME_CHANGES))
  if unknown:
    raise ValueError("--allow_resume_change=%s: %s is not one of %s; pass those to allow"
                     % (",".join(FLAGS.allow_resume_change), ", ".join(unknown),
                        ", ".join(RESUME_CHANGES)))
  if FLAGS.do_train and FLAGS.num_train_steps < 1:
    raise ValueError("--num_train_steps=%d must be at least 1 (or pass --nodo_train)"
                     % FLAGS.num_train_steps)
  if FLAGS.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError("--max_seq_length=%d is above max_position_embeddings=%d of %s; lower "
                     "--max_seq_length or use a config with more positions"
                     % (FLAGS.max_seq_length, bert_config.max_position_embeddings,
                        FLAGS.bert_config_file))
  if FLAGS.max_predictions_per_seq > FLAGS.max_seq_length:
    raise ValueError("--max_predictions_per_seq=%d is above --max_seq_length=%d; lower it"
                     % (FLAGS.max_predictions_per_seq, FLAGS.max_seq_length))
  if FLAGS.vocab_file:
    if not tf.gfile.Exists(FLAGS.vocab_file) or tf.gfile.IsDirectory(FLAGS.vocab_file):
      raise ValueError("--vocab_file=%s does not exist; pass the vocab.txt of the data"
                       % FLAGS.vocab_file)
    with tf.gfile.GFile(FLAGS.vocab_file, "r") as f:
      vocab_size = sum(1 for line in f if line.strip())
    if vocab_size > bert_config.vocab_size:
      raise ValueError("--vocab_file=%s has %d tokens but vocab_size in %s is %d; use the "
                       "config that matches the vocab" % (FLAGS.vocab_file, vocab_size,
                                                          FLAGS.bert_config_file,
                                                          bert_config.vocab_size))
  init_checkpoint = None
  if FLAGS.init_checkpoint:
    init_checkpoint = checkpoints.resolve_checkpoint(FLAGS.init_checkpoint)
  if not FLAGS.do_train and not FLAGS.do_eval:
    raise ValueError("nothing to do: pass --do_train and/or --do_eval")

  train_files = eval_files = []
  if FLAGS.do_train:
    train_files = input_pipeline.list_record_files(FLAGS.input_files_dir, "--input_files_dir")
  if FLAGS.do_eval:
    if not FLAGS.eval_files_dir:
      raise ValueError("--eval_files_dir is not set; pass --eval_files_dir=/path/to/eval "
                       "records, or --nodo_eval to train without evaluation")
    eval_files = input_pipeline.list_record_files(FLAGS.eval_files_dir, "--eval_files_dir")
  if not 0 <= FLAGS.max_corrupt_share < 1:
    raise ValueError("--max_corrupt_share=%g must be in [0, 1)" % FLAGS.max_corrupt_share)
  full_check_bytes = FLAGS.full_record_check_mb * 1024 * 1024
  skipped_records = input_pipeline.SkippedRecords(None, [])
  if train_files:
    skipped_records = input_pipeline.SkippedRecords(*input_pipeline.check_training_files(
        train_files, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
        bert_config.vocab_size, FLAGS.skip_corrupt_records, FLAGS.max_corrupt_share,
        full_check_bytes))
  if eval_files:
    input_pipeline.check_record_files(eval_files, FLAGS.max_seq_length,
                                      FLAGS.max_predictions_per_seq,
                                      vocab_size=bert_config.vocab_size,
                                      full_check_max_bytes=full_check_bytes)
  resume_checkpoint = checkpoints.find_resume_checkpoint(FLAGS.output_dir,
                                                         resume_settings(bert_config))
  if not FLAGS.do_train:
    check_evaluated(resume_checkpoint or init_checkpoint, bert_config)
  _check_output_dir(FLAGS.output_dir)
  earlier_run = resume_step = resume_position = None
  if resume_checkpoint:
    earlier_run = checkpoints.read_run_marker(FLAGS.output_dir)
    resume_step = int(checkpoints.checkpoint_value(resume_checkpoint, "global_step"))
    resume_position = checkpoints.checkpoint_value(resume_checkpoint,
                                                   checkpoints.DATA_POSITION)
    if resume_position is not None:
      resume_position = int(resume_position)
  return Inputs(bert_config, train_files, eval_files, skipped_records, resume_checkpoint,
                init_checkpoint, earlier_run, resume_step, resume_position)


# What this recipe does instead of an accepted anchor flag: (for the anchor's default or
# what we always do, for another value). %(name)s is a flag's value.
_ANCHOR_NOTES = {
    "enable_device_warmup": (
        "the FPS always leaves out the first --fps_warmup_steps=%(fps_warmup_steps)d "
        "updates (and checkpoint time); there is no separate warm-up run",
        "the FPS leaves out the first --fps_warmup_steps=%(fps_warmup_steps)d updates "
        "anyway; pass --fps_warmup_steps=0 to count them"),
    "is_dist_eval_enabled": (
        "evaluation is always distributed over the ranks (each reads its part of the eval "
        "set, the sums are all-reduced)",
        "cannot be honoured: evaluation is always distributed over the ranks (each reads its "
        "part of the eval set, the sums are all-reduced), which reports what one card would"),
    "iterations_per_loop": (
        "one update per session call (no Estimator loop); losses are logged every "
        "--display_loss_steps=%(display_loss_steps)d updates",) * 2,
    "report_loss": (
        "losses are logged every --display_loss_steps=%(display_loss_steps)d updates",
        "cannot be honoured: losses are logged every --display_loss_steps="
        "%(display_loss_steps)d updates; raise it to log less"),
    "save_summary_steps": (
        "TensorBoard gets the logged values, every --display_loss_steps="
        "%(display_loss_steps)d updates",) * 2,
    "verbose_logging": ("no effect: the trainable variables are not listed",) * 2,
    "checkpoint_all_workers": (
        "rank 0 writes the checkpoints (all ranks hold the same weights)",) * 2,
    "use_lightweight_checkpoint": (
        "checkpoints hold the weights and the optimizer state, so that a run resumes",) * 2,
    "deterministic_run": (
        "no effect; --seed fixes the initialization, the data order and the dropout "
        "masks (dropout stays on)",) * 2,
    "enable_habana_backend": ("no effect; --device=%(device)s chooses the device",) * 2,
    "enable_packed_data_mode": (
        "no effect: the records are read as one sequence each",
        "cannot be honoured: packed records are not supported; the records must hold one "
        "sequence each (they are checked before training)"),
    "avg_seq_per_pack": ("no effect: the records are read as one sequence each",) * 2,
    "compute_lm_loss_per_seq": ("no effect: the records are read as one sequence each",) * 2,
    "tf_profiler_begin_iter": (
        "no effect; python3 -m bench.profile_step traces a training step",) * 2,
    "tf_profiler_num_iter": (
        "no effect; python3 -m bench.profile_step traces a training step",) * 2,
}
# Anchor name -> our flag of the same meaning.
_ANCHOR_ALIASES = (("optimizer_type", "optimizer"), ("power", "poly_power"),
                   ("num_eval_iterations", "max_eval_steps"))


def anchor_flags(log=None):
  """Applies the anchors' flags given on the command line (the block at the end of the
  flag definitions) and notes, one line each, those that change nothing here.

  Args:
    log: prints a note; default: to stdout on the first rank only.

  Raises:
    ValueError: an anchor flag contradicts ours (--optimizer_type=adam --optimizer=lamb).
  """
  if log is None:
    rank = (os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or
            os.environ.get("PMI_RANK") or "0")
    log = print if rank == "0" else (lambda line: None)
  for anchor, ours in _ANCHOR_ALIASES:
    value = getattr(FLAGS, anchor)
    if value is None:
      continue
    if FLAGS[ours].present and getattr(FLAGS, ours) != value:
      raise ValueError("--%s=%s and --%s=%s disagree (they are the same setting); pass one"
                       % (anchor, value, ours, getattr(FLAGS, ours)))
    setattr(FLAGS, ours, value)
  if FLAGS.eval_checkpoint_path:
    if FLAGS.do_train:
      log("run_pretraining: note: --eval_checkpoint_path is read with --nodo_train only (then "
          "it is the checkpoint evaluated); this run evaluates the weights it trains")
    elif FLAGS.init_checkpoint and FLAGS.init_checkpoint != FLAGS.eval_checkpoint_path:
      raise ValueError("--eval_checkpoint_path=%s and --init_checkpoint=%s disagree (with "
                       "--nodo_train both name the checkpoint evaluated); pass one"
                       % (FLAGS.eval_checkpoint_path, FLAGS.init_checkpoint))
    else:
      FLAGS.init_checkpoint = FLAGS.eval_checkpoint_path
  values = {name: getattr(FLAGS, name) for name in ("fps_warmup_steps", "display_loss_steps",
                                                    "device")}
  for name, (usual, other) in sorted(_ANCHOR_NOTES.items()):
    if FLAGS[name].present:
      note = usual if getattr(FLAGS, name) == FLAGS[name].default else other
      if name in ("enable_device_warmup", "is_dist_eval_enabled"):
        # What the anchors turn on, this recipe always does: only "off" is not honoured.
        note = other if getattr(FLAGS, name) is False else usual
      log("run_pretraining: note: %s: %s" % (FLAGS[name].serialize(), note % values))


def distribution():
  """The engine: --distribution, or horovod for --horovod."""
  return "horovod" if FLAGS.horovod else FLAGS.distribution


def mixed_precision():
  """Whether the flags ask for mixed precision: --amp, its aliases --use_fp16 and
  --manual_fp16 (the anchors' names), or an --amp_dtype, which implies it.

  Raises:
    ValueError: --noamp with one of the others.
  """
  asked = [(flag, what) for flag, what, on in (
      ("--amp_dtype=%s" % FLAGS.amp_dtype, "%s compute" % FLAGS.amp_dtype,
       FLAGS.amp_dtype != "auto"),
      ("--use_fp16", "mixed precision", FLAGS.use_fp16),
      ("--manual_fp16", "float16 compute", FLAGS.manual_fp16)) if on]
  if asked and FLAGS["amp"].present and not FLAGS.amp:
    raise ValueError("%s asks for %s and --noamp for float32; pass one" % asked[0])
  return bool(FLAGS.amp or asked)


def check_evaluated(prefix, bert_config):
  """With --nodo_train: the checkpoint evaluated must hold the whole model, the
  masked-LM and next-sentence heads included, unless --allow_random_heads.

  Args:
    prefix: the checkpoint to evaluate (resumed or --init_checkpoint), None for none.
    bert_config: modeling.BertConfig.

  Raises:
    ValueError: the one-line error.
  """
  if prefix is None:
    if not FLAGS.allow_random_heads:
      raise ValueError("--nodo_train evaluates a checkpoint but none is given, so every "
                       "weight would be random; pass --init_checkpoint (or "
                       "--eval_checkpoint_path), or --allow_random_heads to evaluate random "
                       "weights on purpose")
    return
  checkpoints.check_config(prefix, bert_config,
                           "--bert_config_file=%s" % FLAGS.bert_config_file)
  names = [name for name, _ in tf.train.list_variables(prefix)]
  missing = ["%s head (%s)" % (head, scope) for head, scope in (
      ("masked-LM", "cls/predictions/"), ("next-sentence", "cls/seq_relationship/"))
             if not any(name.startswith(scope) for name in names)]
  if missing and not FLAGS.allow_random_heads:
    raise ValueError("--nodo_train evaluates %s, which has no %s: those weights would be "
                     "random, and so would the accuracy (a fine-tuned classifier?); pass a "
                     "pretraining checkpoint, or --allow_random_heads to evaluate it anyway"
                     % (prefix, " and no ".join(missing)))


def resume_settings(bert_config):
  """What a run resuming from output_dir must share with the run that wrote it."""
  return {"bert_config": bert_config.to_dict(), "max_seq_length": FLAGS.max_seq_length,
          "max_predictions_per_seq": FLAGS.max_predictions_per_seq,
          "optimizer": FLAGS.optimizer}


def run_record(bert_config, ranks, seed, global_batch_size, train_files):
  """What bert_pretrain_run.json records: the settings a resumed run must share
  (resume_settings), the layout, the seed and the training files."""
  record = resume_settings(bert_config)
  record.update(layout={"distribution": ranks.distribution, "processes": ranks.size,
                        "replicas": ranks.replicas,
                        "train_batch_size": FLAGS.train_batch_size,
                        "num_accumulation_steps": FLAGS.num_accumulation_steps,
                        "global_batch_size": global_batch_size},
                seed=seed, train_files=data_files(train_files))
  return record


def data_files(files):
  """[name, bytes] of each training file: the data the order is made of (the folder
  may move)."""
  return [[os.path.basename(f), tf.gfile.Stat(f).length] for f in files]


def describe_layout(layout):
  """'horovod, 2 processes, 2 replicas x batch 4 x 1 accumulation = global batch 8'."""
  return ("%s, %d process%s, %d replica%s x batch %d x %d accumulation = global batch %d"
          % (layout["distribution"], layout["processes"],
             "es" if layout["processes"] > 1 else "", layout["replicas"],
             "s" if layout["replicas"] > 1 else "", layout["train_batch_size"],
             layout["num_accumulation_steps"], layout["global_batch_size"]))


def _files_change(earlier, now):
  """How two data_files lists differ, in a few words (None: they do not)."""
  if earlier == now:
    return None
  before, after = dict(map(tuple, earlier)), dict(map(tuple, now))
  for name in sorted(set(before) | set(after)):
    if name not in after:
      return "%s is gone" % name
    if name not in before:
      return "%s is new" % name
    if before[name] != after[name]:
      return "%s was %d bytes, now %d" % (name, before[name], after[name])
  return "the files are the same but listed in another order"


# What resume_plan decided: the place in the data order to continue at, the lines to
# log, and whether bert_pretrain_run.json may be written now (False: at the first save,
# so that it describes the newest checkpoint until then).
Resume = collections.namedtuple("Resume", ["position", "lines", "record_now"])


def resume_plan(inputs, record, seed_flag):
  """Where the data order continues and what a resumed run says about it.

  The run records its layout, seed and training files (run_record); the checkpoint
  holds the records of the data order consumed (checkpoints.DATA_POSITION), whatever
  the layouts of the runs that made it. The order itself does not depend on the layout
  (input_pipeline.make_dataset), so:
  - the same layout continues exactly, as an uninterrupted run would;
  - another layout of the same global batch (ranks, engine, per-card batch,
    accumulation) continues at the same sample, re-sharded: each update still takes
    the next global batch of the order, and the step count, learning-rate and
    evaluation schedules, which count updates, keep their meaning;
  - another global batch is refused unless --allow_resume_change=global_batch: those
    schedules and --num_train_steps count updates, which would then hold another
    number of samples than the run was planned with;
  - another --seed or other training files are refused unless allowed: the place in
    the order would then name other records (some repeated, others never trained on).

  Args:
    inputs: Inputs (check_flags).
    record: run_record of this run.
    seed_flag: --seed (None when not given).

  Returns:
    Resume.

  Raises:
    ValueError: a change that is not allowed; the message names it and the flag.
  """
  if not inputs.resume_checkpoint or not FLAGS.do_train:
    return Resume(0, [], True)
  earlier = inputs.earlier_run or {}
  was, now = earlier.get("layout"), record["layout"]
  step = inputs.resume_step
  position = inputs.resume_position
  if position is None:  # An older version's checkpoint: it consumed step global batches.
    position = step * (was or now)["global_batch_size"]
  allowed = set(FLAGS.allow_resume_change)
  where = "sample %d of the data order" % position
  change = _files_change(earlier.get("train_files", record["train_files"]),
                         record["train_files"])
  if change and "data" not in allowed:
    raise ValueError("--output_dir=%s was trained on other data (%s): %s would name other "
                     "records in these files; pass the run's --input_files_dir, or "
                     "--allow_resume_change=data to continue at %s of these files' order"
                     % (FLAGS.output_dir, change, where, where))
  if seed_flag is not None and earlier.get("seed") not in (None, seed_flag) and \
      "seed" not in allowed:
    raise ValueError("--output_dir=%s was trained with seed %d and this run passes "
                     "--seed=%d: the data order and dropout masks would be another's, and %s "
                     "would repeat some records and skip others; pass --seed=%d (or no --seed) "
                     "to continue the run, or --allow_resume_change=seed"
                     % (FLAGS.output_dir, earlier["seed"], seed_flag, where, earlier["seed"]))
  if was and was["global_batch_size"] != now["global_batch_size"] and \
      "global_batch" not in allowed:
    raise ValueError("--output_dir=%s was trained with a global batch of %d (%s) and this "
                     "run's is %d (%s), while --num_train_steps and the learning-rate and "
                     "evaluation schedules count updates; keep the global batch (batch x "
                     "accumulation x replicas = %d) or pass --allow_resume_change=global_batch "
                     "to continue at %s with updates of %d"
                     % (FLAGS.output_dir, was["global_batch_size"], describe_layout(was),
                        now["global_batch_size"], describe_layout(now),
                        was["global_batch_size"], where, now["global_batch_size"]))
  if was is None:
    line = ("Data: %s holds no layout of the run that wrote %s (an older version, or a "
            "deleted bert_pretrain_run.json): continuing at %s"
            % (checkpoints.RUN_MARKER, os.path.basename(inputs.resume_checkpoint), where))
  elif was == now:
    line = ("Data: continuing at %s, the records the run consumed up to step %d (read, not "
            "parsed)" % (where, step))
  elif was["global_batch_size"] == now["global_batch_size"]:
    line = ("Resuming on another layout: %s (was %s); the global batch stays %d, so the run "
            "continues at %s, re-sharded over %d replica%s (the losses are not "
            "bit-identical to an uninterrupted run's)"
            % (describe_layout(now), describe_layout(was), now["global_batch_size"], where,
               now["replicas"], "s" if now["replicas"] > 1 else ""))
  else:
    line = ("Resuming with another global batch (--allow_resume_change=global_batch): %s "
            "(was %s); the run continues at %s in updates of %d, and the schedules go "
            "on counting updates from step %d"
            % (describe_layout(now), describe_layout(was), where, now["global_batch_size"],
               step))
  lines = [line]
  if change:
    lines.append("Data: the training files changed (%s; --allow_resume_change=data): "
                 "continuing at %s of their order" % (change, where))
  return Resume(position, lines, was == now and not change and
                earlier.get("seed") == record["seed"])


def choose_seed(inputs, ranks, device, config):
  """The run's seed, the same in every process: --seed, else the one the run in
  --output_dir recorded (a resumed run continues its data order and dropout masks),
  else one the first process draws. Checks first that every process runs with the same
  settings (ranks.agree: the first collective).

  Returns:
    (seed, line): line says where the seed came from (None with --seed).
  """
  recorded = (inputs.earlier_run or {}).get("seed") if inputs.resume_checkpoint else None
  candidate = FLAGS.seed
  if candidate is None:
    candidate = recorded if recorded is not None else int.from_bytes(os.urandom(4), "big") >> 1
  settings = {"--%s" % name: getattr(FLAGS, name) for name in JOB_FLAGS}
  settings.update({"the model config": inputs.bert_config.to_dict(),
                   "the training files": data_files(inputs.train_files),
                   "the compute type": device.dtype.name,
                   "seed": candidate})
  seed = ranks.agree(settings, config, shared=("seed",))["seed"]
  if FLAGS.seed is not None:
    return seed, None
  if recorded is not None and seed == recorded:
    return seed, ("Seed: no --seed; the run's seed %d from %s (its data order and dropout "
                  "masks continue)" % (seed, checkpoints.RUN_MARKER))
  return seed, ("Seed: no --seed; drew %d for the data order, dropout masks and "
                "initialization (recorded in %s, which a resumed run reuses; --seed=%d "
                "repeats the run)" % (seed, checkpoints.RUN_MARKER, seed))


def _check_output_dir(output_dir):
  """Creates output_dir if needed and checks that it can be written."""
  try:
    tf.gfile.MakeDirs(output_dir)
    # Named per process: all ranks probe the same folder at once.
    probe = os.path.join(output_dir, ".write_test.%d" % os.getpid())
    with tf.gfile.GFile(probe, "w") as f:
      f.write("ok")
    tf.gfile.Remove(probe)
  except (tf.errors.OpError, OSError) as e:
    raise ValueError("--output_dir=%s cannot be written (%s); pass a folder you can write to"
                     % (output_dir, getattr(e, "message", e)))


def enable_cpu_xla(argv):
  """Lets --use_xla auto-cluster on a CPU too: TensorFlow applies global_jit_level to
  GPUs only unless TF_XLA_FLAGS holds --tf_xla_cpu_global_jit. TensorFlow reads it once,
  and within absl's app.run too early for main to set it, so this runs before app.run
  on the command line `argv` (where a GPU build might find a GPU, it is left alone)."""
  try:
    FLAGS(argv)
  except flags.Error:
    return  # app.run reports it.
  if not FLAGS.use_xla or (FLAGS.device != "cpu" and tf.test.is_built_with_cuda()):
    return
  flags_now = os.environ.get("TF_XLA_FLAGS", "")
  if "--tf_xla_cpu_global_jit" not in flags_now:
    os.environ["TF_XLA_FLAGS"] = (flags_now + " --tf_xla_cpu_global_jit").strip()


def optimizer_rule():
  """One line on the optimizer's rules that recipes differ in: LAMB's layer adaptation
  and where the gradients are clipped."""
  clipping = ("gradients clipped to norm 1.0 per micro-batch on each rank (MLPerf's "
              "reference)" if FLAGS.gradient_clipping == optimization.CLIP_PER_MICRO_BATCH
              else "gradients clipped to norm 1.0 after accumulation and all-reduce")
  if FLAGS.optimizer != "lamb":
    return "%s, %s" % (FLAGS.optimizer, clipping)
  return "lamb, %s, %s" % ("trust ratio on every variable (NVIDIA's LAMB)"
                           if FLAGS.lamb_adapt_layernorm_and_bias else
                           "LayerNorm and bias without trust ratio (MLPerf's reference)",
                           clipping)


def log_hyperparameters(logger, ranks, global_batch_size, learning_rate):
  """The MLPerf hyperparameter keys of the BERT benchmark."""
  c = logs.mllog.constants
  logger.mlperf(c.SUBMISSION_BENCHMARK, "bert")
  logger.mlperf(c.SUBMISSION_ORG, FLAGS.submission_org)
  logger.mlperf(c.SUBMISSION_PLATFORM, FLAGS.submission_platform)
  logger.mlperf(c.SUBMISSION_DIVISION, "closed")
  logger.mlperf(c.SUBMISSION_STATUS, "onprem")
  # The recipe does not drop the OS page cache (that needs root); the log says so.
  logger.mlperf(c.CACHE_CLEAR, False)
  logger.mlperf(c.GLOBAL_BATCH_SIZE, global_batch_size)
  logger.mlperf("train_batch_size", FLAGS.train_batch_size)
  logger.mlperf("max_sequence_length", FLAGS.max_seq_length)
  logger.mlperf("max_predictions_per_seq", FLAGS.max_predictions_per_seq)
  logger.mlperf(c.GRADIENT_ACCUMULATION_STEPS, FLAGS.num_accumulation_steps)
  logger.mlperf(c.OPT_BASE_LR, learning_rate)
  logger.mlperf(c.OPT_LAMB_EPSILON, FLAGS.epsilon)
  logger.mlperf(c.OPT_LR_TRAINING_STEPS, FLAGS.num_train_steps)
  logger.mlperf(c.OPT_LR_WARMUP_STEPS, FLAGS.num_warmup_steps)
  logger.mlperf("num_warmup_steps", FLAGS.num_warmup_steps)
  logger.mlperf("start_warmup_step", FLAGS.start_warmup_step)
  logger.mlperf(c.OPT_LAMB_BETA_1, FLAGS.beta_1)
  logger.mlperf(c.OPT_LAMB_BETA_2, FLAGS.beta_2)
  logger.mlperf(c.OPT_LAMB_WEIGHT_DECAY, FLAGS.weight_decay_rate)
  logger.mlperf(c.OPT_LAMB_LR_DECAY_POLY_POWER, FLAGS.poly_power)
  logger.mlperf("opt_name", FLAGS.optimizer)
  logger.mlperf("num_ranks", ranks.replicas)
  logger.mlperf("distribution", ranks.distribution)


def run(inputs, ranks, device, stop=None):
  """Builds the graph, then trains and evaluates. Returns the process exit status.

  inputs: Inputs (check_flags). device: device_lib.Device (detect_device). stop:
  (optional) the installed signals.StopRequest: SIGTERM or SIGINT then stop the
  training after the current update, on every rank, with a checkpoint.
  """
  stop = stop or signals.StopRequest()
  run_start = time.time()
  is_chief = ranks.is_chief
  gpu = None
  if device.kind == "GPU":
    gpu = "all" if ranks.strategy else device_lib.gpu_index(ranks, len(device.gpus))
  config = pretraining.session_config(
      FLAGS.intra_op_threads or max(1, (os.cpu_count() or 1) // ranks.local_size),
      FLAGS.inter_op_threads or 2, gpu, FLAGS.use_xla,
      FLAGS.cpu_devices if device.kind == "CPU" else 1)
  global_batch_size = FLAGS.train_batch_size * FLAGS.num_accumulation_steps * ranks.replicas
  rcp, rcp_note = None, None
  try:
    rcp = mlperf.choose_rcp(global_batch_size, mlperf.load_rcps())
  except ValueError as e:  # --reference_hyperparameters has been checked to have them
    rcp_note = "MLPerf's RCPs: %s; no projected time to train" % e
  if FLAGS.reference_hyperparameters:
    rcp_note = apply_reference_hyperparameters(rcp)
  learning_rate = FLAGS.learning_rate * (ranks.replicas if FLAGS.scale_lr_by_ranks else 1)
  seed, seed_line = choose_seed(inputs, ranks, device, config)
  record = run_record(inputs.bert_config, ranks, seed, global_batch_size, inputs.train_files)
  resume = resume_plan(inputs, record, FLAGS.seed)
  eval_interval = FLAGS.samples_between_eval or mlperf.eval_interval_samples(global_batch_size)
  logger = start_logs(ranks, device, config, global_batch_size, learning_rate,
                      inputs.skipped_records, eval_interval, rcp_note)
  if seed_line:
    logger.print(seed_line)

  sess, train, evaluator, saver, all_finite = start_session(inputs, ranks, device, config,
                                                           learning_rate, seed,
                                                           resume.position, logger)
  for line in resume.lines:
    logger.print(line)
  record_pending = not resume.record_now
  if ranks.is_chief and FLAGS.do_train and resume.record_now:
    checkpoints.write_run_marker(FLAGS.output_dir, record)

  def save(step):
    """save_if_finite; the first save of a run on another layout records it."""
    nonlocal record_pending
    saved = save_if_finite(sess, saver, all_finite, step, logger, is_chief)
    if saved and record_pending and is_chief:
      checkpoints.write_run_marker(FLAGS.output_dir, record)
      record_pending = False
    return saved
  logger.mlperf(logs.mllog.constants.INIT_STOP, kind="end")
  logger.mlperf(logs.mllog.constants.RUN_START, kind="start")

  step = last_saved = int(sess.run(tf.train.get_global_step()))
  monitor = health.HealthMonitor()
  evals = meters.EvalSchedule(logger, evaluator, monitor, global_batch_size, eval_interval,
                              FLAGS.samples_start_eval, step,
                              FLAGS.output_dir if is_chief else None)
  results = results_at_start = {}
  if evaluator is not None and (FLAGS.eval_at_start or not FLAGS.do_train):
    results = results_at_start = evals.evaluate(sess, step)
    if step == 0 and inputs.init_checkpoint and not inputs.resume_checkpoint:
      check_initial_accuracy(logger, results["masked_lm_accuracy"], inputs.init_checkpoint)
  meter = meters.Throughput(global_batch_size, FLAGS.fps_warmup_steps)
  last_scale = None
  if train is not None and train.loss_scale is not None:
    last_scale = sess.run(train.loss_scale.scale)
  loss_is_finite = True
  stopped_by = 0  # The signal that stopped the training (all ranks agree), 0: none.
  if FLAGS.do_train and step >= FLAGS.num_train_steps:
    logger.print("global_step %d already reached --num_train_steps=%d; nothing to train"
                 % (step, FLAGS.num_train_steps))
  records_log = None
  if FLAGS.do_train and FLAGS.log_trained_records:
    records_log = open(os.path.join(FLAGS.output_dir,
                                    "trained_records-rank-%d.txt" % ranks.rank), "a")
  stop.arm()

  while FLAGS.do_train and step < FLAGS.num_train_steps:
    evals.start_block(step)
    step_start = time.time()
    last = FLAGS.num_accumulation_steps - 1
    for micro in range(last):
      done = sess.run({"op": train.accumulate_op, "record_ids": train.record_ids}
                      if records_log else train.accumulate_op, {train.micro_batch: micro})
      if records_log:
        log_records(records_log, step + 1, micro, done["record_ids"])
    display = step + 1 == FLAGS.num_train_steps or (step + 1) % FLAGS.display_loss_steps == 0
    # Losses are fetched (and averaged over ranks) on display steps only.
    fetches = train.display_fetches if display else train.step_fetches
    if records_log:
      fetches = dict(fetches, record_ids=train.record_ids)
    values = sess.run(fetches, {train.stop_feed: stop.signum, train.micro_batch: last})
    if records_log:
      log_records(records_log, step + 1, last, values["record_ids"])
    meter.update(time.time() - step_start)
    if values["step"] == step:
      # Skipped by loss scaling (the scale is halved): this update is run again with
      # new data, and only applied updates count towards --num_train_steps.
      if last_scale <= 1.0:
        loss_is_finite = False
        logger.print("Gradients are not finite at step %d even with loss scale 1: stopping "
                     "without saving. Lower --learning_rate or raise --num_warmup_steps"
                     % (step + 1))
        break
      last_scale = values["loss_scale"]
      continue
    step = int(values["step"])
    if train.loss_scale is not None:
      last_scale = values["loss_scale"]

    if step % FLAGS.display_loss_steps == 0 or step == FLAGS.num_train_steps:
      loss_is_finite = log_step(logger, monitor, sess, train, values, step, meter, step_start)
      if not loss_is_finite:
        break
      meter.new_window()
    if step % FLAGS.save_checkpoints_steps == 0:
      start = time.time()
      loss_is_finite = save(step)
      if not loss_is_finite:
        break
      meter.pause(time.time() - start, checkpoint=True)
      last_saved = step
    stopped_by = int(values["stop_signal"])
    if stopped_by:
      # Every rank says where it stopped: the ranks agree on the step.
      print("%s: rank %d stops after step %d; to resume, run the same command with "
            "--output_dir=%s" % (signals.name(stopped_by), ranks.rank, step, FLAGS.output_dir),
            flush=True)
      break
    if step < FLAGS.num_train_steps and evals.due(step):
      evals.end_block()
      results = evals.evaluate(sess, step)
      meter.pause(results["eval_time_s"])
      if reached_target(results):
        logger.print("masked_lm_accuracy %.4f reached --stop_threshold=%g at step %d"
                     % (results["masked_lm_accuracy"], FLAGS.stop_threshold, step))
        break
  meter.stop()
  evals.end_block()

  if records_log:
    records_log.close()
  if FLAGS.do_train and step != last_saved and loss_is_finite:
    loss_is_finite = save(step)
  if evaluator is not None and evals.last_eval_step != step and loss_is_finite \
      and not stopped_by:
    results = evals.evaluate(sess, step)
  status = "success" if results and reached_target(results) else "aborted"
  logger.mlperf(logs.mllog.constants.TRAIN_SAMPLES, step * global_batch_size)
  logger.mlperf(logs.mllog.constants.RUN_STOP, kind="end", metadata={"status": status})
  log_summary(logger, step, meter, evals, results, results_at_start, status,
              ranks.replicas, time.time() - run_start, rcp)
  logger.close()
  if stopped_by and ranks.size > 1:
    # A barrier: no rank exits (which makes the launcher end the others) before rank 0
    # has saved and written its logs.
    sess.run(train.stop_agreed)
  sess.close()
  if is_chief and stopped_by:
    # A launcher that forwarded the signal ends the job within seconds (horovodrun
    # --gloo after 5): the checkpoint and logs are written, the picture can wait.
    print("report: not drawn after %s; python3 -m bert_pretrain.report %s draws it"
          % (signals.name(stopped_by), FLAGS.output_dir), flush=True)
  elif is_chief:
    dllog_path = FLAGS.dllog_path or os.path.join(FLAGS.output_dir, "dllog.json")
    try:
      report.write_report(FLAGS.output_dir, dllog_path, picture=FLAGS.draw_report)
    except (ValueError, EnvironmentError, RuntimeError) as e:
      print("report: not drawn (%s); the run itself is complete" % e)
  if stopped_by:
    return signals.exit_status(stopped_by)
  return 0 if loss_is_finite else 1


def log_records(log, update, micro_batch, record_ids):
  """One line of --log_trained_records: the update (global_step after it), the
  micro-batch and the fingerprints of its records (pretraining.record_fingerprints)."""
  log.write("%d %d %s\n" % (update, micro_batch, " ".join(str(i) for i in record_ids)))
  log.flush()


def attends_per_sequence(device):
  """Whether the training graph attends sequence by sequence, at the real tokens only
  (pretraining.attends_per_sequence decides; the evaluation attends at every position)."""
  return pretraining.attends_per_sequence(FLAGS.max_seq_length, device.dtype,
                                          device.kind == "CPU", FLAGS.use_xla)


def start_session(inputs, ranks, device, config, learning_rate, seed, position, logger):
  """Builds the graph (the training step, the evaluator, the checkpoint ops), then starts
  the session: the weights from the checkpoint to resume from, else --init_checkpoint,
  else random (the same on every rank), and the training data where the run stands.

  seed: the run's (choose_seed). position: the place in the data order to continue
  at (resume_plan), set into the data position of a checkpoint that lacks one.

  Returns:
    (sess, train, evaluator, saver, all_finite): train is a pretraining.TrainGraph
    (None without --do_train), evaluator a pretraining.Evaluator (None without
    --do_eval), all_finite the op of checkpoints.all_finite.
  """
  tf.set_random_seed(seed)
  # Under a tf.distribute strategy the variables are mirrored over its replicas.
  with ranks.scope():
    global_step = tf.train.get_or_create_global_step()
    train = set_position = None
    if FLAGS.do_train:
      skip_samples = tf.placeholder_with_default(tf.constant(0, tf.int64), [])
      # The job's replicas take the micro-batches of one order in turn; this process's
      # replicas are ranks.local_replicas consecutive ones.
      dataset = input_pipeline.make_dataset(
          inputs.train_files, FLAGS.train_batch_size, FLAGS.max_seq_length,
          FLAGS.max_predictions_per_seq, is_training=True, num_shards=ranks.replicas,
          shard_index=ranks.rank * ranks.local_replicas, local_shards=ranks.local_replicas,
          shuffle_buffer=FLAGS.shuffle_buffer, seed=seed,
          vocab_size=inputs.bert_config.vocab_size,
          skip_records=inputs.skipped_records.bad, skip_samples=skip_samples)
      train_iterator = ranks.iterator(dataset)
      train = pretraining.build_train_graph(
          inputs.bert_config, train_iterator.get_next(), device.dtype, learning_rate,
          FLAGS.num_train_steps, num_warmup_steps=FLAGS.num_warmup_steps,
          poly_power=FLAGS.poly_power, start_warmup_step=FLAGS.start_warmup_step,
          optimizer_name=FLAGS.optimizer, weight_decay_rate=FLAGS.weight_decay_rate,
          beta_1=FLAGS.beta_1, beta_2=FLAGS.beta_2, epsilon=FLAGS.epsilon,
          num_accumulation_steps=FLAGS.num_accumulation_steps,
          init_loss_scale=FLAGS.init_loss_scale, ranks=ranks,
          allreduce_post_accumulation=FLAGS.allreduce_post_accumulation,
          attention_per_sequence=attends_per_sequence(device),
          adapt_every_variable=FLAGS.lamb_adapt_layernorm_and_bias,
          clipping=FLAGS.gradient_clipping, seed=seed)
      if inputs.resume_checkpoint and inputs.resume_position is None:
        # An older version's checkpoint has no data position: resume_plan's is set.
        set_position = train.data_position.assign(tf.constant(position, tf.int64))
    evaluator = None
    if FLAGS.do_eval:
      evaluator = pretraining.Evaluator(inputs.bert_config, inputs.eval_files, ranks,
                                        device.dtype, FLAGS.eval_batch_size,
                                        FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
                                        FLAGS.max_eval_steps)
    model_variables = tf.trainable_variables()
    # max_to_keep=0 keeps every checkpoint. Relative paths in the `checkpoint` file keep a
    # copied or moved output_dir pointing at its own files.
    saver = tf.train.Saver(max_to_keep=FLAGS.keep_checkpoint_max or None,
                           save_relative_paths=True)
    # Checked before every save: nothing with NaN or Inf is written. Weights are the same
    # on every rank, so every rank gets the same answer and they stop together.
    all_finite = checkpoints.all_finite(tf.global_variables())
    broadcast_op = ranks.broadcast_op()

  sess = ranks.session(config)
  sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
  restore(sess, saver, global_step, model_variables, inputs, logger.print)
  if set_position is not None:
    sess.run(set_position)
  if broadcast_op is not None:
    sess.run(broadcast_op)
  if FLAGS.do_train:
    # Every process continues the one order at the position rank 0 restored.
    sess.run(train_iterator.initializer, {skip_samples: sess.run(train.data_position)})
  sess.graph.finalize()  # Nothing may add ops inside the loop.
  return sess, train, evaluator, saver, all_finite


def start_logs(ranks, device, config, global_batch_size, learning_rate, skipped_records,
               eval_interval, rcp_note):
  """Opens the run's logs and writes what the run is: its device, its batch and
  optimizer, MLPerf's hyperparameters, the training records left out.

  config: the session's tf.ConfigProto (TensorFlow 1.15 names a GPU with it).

  Returns:
    logs.RunLogger.
  """
  name = ""
  if device.kind == "GPU" and ranks.is_chief:
    index = 0 if ranks.strategy else device_lib.gpu_index(ranks, len(device.gpus))
    name = device_lib.gpu_name(device.gpus[index], config)
  where = device_lib.device_line(device, ranks, name)
  logger = logs.RunLogger(
      output_dir=FLAGS.output_dir, is_chief=ranks.is_chief,
      dllog_path=FLAGS.dllog_path or os.path.join(FLAGS.output_dir, "dllog.json"),
      mllog_path=FLAGS.mllog_path or logs.new_log_path(FLAGS.output_dir, "mlperf", ".log"))
  logger.mlperf(logs.mllog.constants.INIT_START, kind="start")
  logger.print("device: " + where)
  logger.mlperf("device", where)
  logger.record("device", {"device": where, "kind": device.kind,
                           "compute_type": device.dtype.name, "why": device.why})
  logger.print("bert_pretrain: %d rank(s), batch %d x %d accumulation x %d ranks = %d "
               "sentences per update, seq %d, %s compute, optimizer %s, lr %g%s, "
               "distribution %s%s"
               % (ranks.replicas, FLAGS.train_batch_size, FLAGS.num_accumulation_steps,
                  ranks.replicas, global_batch_size, FLAGS.max_seq_length, device.dtype.name,
                  FLAGS.optimizer, learning_rate,
                  " (scaled by ranks)" if FLAGS.scale_lr_by_ranks else "", ranks.distribution,
                  ", attention per sequence"
                  if FLAGS.do_train and attends_per_sequence(device) else ""))
  if rcp_note:
    logger.print(rcp_note)
  rule = optimizer_rule()
  logger.print("optimizer: %s; evaluation every %d samples%s" % (
      rule, eval_interval, "" if FLAGS.samples_between_eval else
      " (MLPerf's interval for a global batch of %d)" % global_batch_size))
  logger.record("optimizer", {"rule": rule, "optimizer": FLAGS.optimizer,
                              "lamb_adapt_layernorm_and_bias":
                                  FLAGS.lamb_adapt_layernorm_and_bias,
                              "gradient_clipping": FLAGS.gradient_clipping,
                              "samples_between_eval": eval_interval})
  log_hyperparameters(logger, ranks, global_batch_size, learning_rate)
  if FLAGS.skip_corrupt_records:
    bad = skipped_records.bad
    logger.print("--skip_corrupt_records: %d of %d training records skipped%s"
                 % (len(bad), skipped_records.records,
                    "; first: " + input_pipeline.describe_bad_record(bad[0]) if bad else ""))
    logger.metrics(0, {"skipped_records": len(bad), "records": skipped_records.records},
                   prefix="data")
  return logger


def restore(sess, saver, global_step, model_variables, inputs, log):
  """Starts the weights: all variables from the checkpoint to resume from, else the
  model's from --init_checkpoint, else the random ones the session initialized."""
  prefix = inputs.resume_checkpoint
  if prefix:
    checkpoints.check_resumable(prefix, tf.global_variables())
    present = dict(tf.train.list_variables(prefix))
    tf.train.Saver(var_list=[v for v in tf.global_variables()
                             if checkpoints.variable_name(v) in present]).restore(sess, prefix)
    # The earlier run's checkpoints in this output_dir (never those the `checkpoint`
    # file may name elsewhere) stay in the rotation of --keep_checkpoint_max.
    saver.recover_last_checkpoints(
        [p for _, p in checkpoints.list_checkpoints(FLAGS.output_dir)])
    log("Resuming from %s at step %d (weights, optimizer state, learning-rate "
        "schedule); --init_checkpoint is not applied" % (prefix, sess.run(global_step)))
  elif inputs.init_checkpoint:
    checkpoints.restore_model_weights(sess, inputs.init_checkpoint, model_variables, log=log)
  else:
    log("No --init_checkpoint: the model starts from random weights")


def log_step(logger, monitor, sess, train, values, step, meter, step_start):
  """Logs the losses and the throughput of a display step and the health warnings.

  values: what sess.run returned for train.display_fetches; meter: meters.Throughput;
  step_start: when the update began (time.time()).

  Returns:
    False when the loss is not finite (and says so): the run must stop.
  """
  window_fps = meter.window_fps()
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
            "samples": step * meter.batch_size}
  scale = skipped = None
  if train.loss_scale is not None:
    scale, skipped = values["loss_scale"], values["skipped_steps"]
    logged.update(loss_scale=scale, skipped_steps=skipped)
  logger.metrics(step, logged, prefix="train")
  warnings = monitor.window(step, window_fps, meter.window_steps, scale, skipped)
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


def save_if_finite(sess, saver, all_finite, step, logger, is_chief):
  """Saves model.ckpt-<step> (the chief does) unless the weights or the optimizer state
  hold NaN or Inf (all_finite is checkpoints.all_finite's op).

  Returns:
    False when they do (and says so): nothing is saved and the run must stop.
  """
  if not sess.run(all_finite):
    saved = checkpoints.list_checkpoints(FLAGS.output_dir)
    logger.print("NaN or Inf in the weights or optimizer state after step %d: stopping "
                 "without saving. Lower --learning_rate or raise --num_warmup_steps and run "
                 "again: %s" % (step, "it resumes from %s" % os.path.basename(saved[-1][1])
                                if saved else "it starts anew"))
    return False
  if is_chief:
    checkpoints.save_checkpoint(saver, sess, FLAGS.output_dir, step)
  return True


def reached_target(results):
  return FLAGS.stop_threshold > 0 and results["masked_lm_accuracy"] >= FLAGS.stop_threshold


def log_summary(logger, step, meter, evals, results, results_at_start, status,
                num_ranks, e2e_time, rcp):
  """The run's closing lines: time, throughput, the one-line table row
  "| 1 card | acc ... | fps ... | status ... |" and the projected time to train (rcp:
  mlperf.RcpChoice); also a dllog record of type summary."""
  eval_time = evals.eval_time
  fps_all, fps_steady = meter.averages()
  summary = {"e2e_time_s": e2e_time, "training_sentences": meter.sentences,
             "throughput_with_overhead": fps_all, "throughput": fps_steady,
             "checkpoint_time_s": meter.checkpoint_time, "eval_time_s": eval_time}
  if results_at_start and FLAGS.do_train:
    logger.print("masked_lm_accuracy before training: %.4f"
                 % results_at_start["masked_lm_accuracy"])
  logger.print("e2e_time: %.2f s, training sentences: %d, checkpoint time: %.2f s, eval time: "
               "%.2f s" % (e2e_time, meter.sentences, meter.checkpoint_time, eval_time))
  logger.print("Throughput Average (sentences/sec) with overhead = %.2f (warm-up and checkpoint "
               "time included, evaluation excluded)" % fps_all)
  logger.print("Throughput Average (sentences/sec) = %.2f (after %d warm-up steps, without "
               "checkpoint and eval time)" % (fps_steady, FLAGS.fps_warmup_steps))
  accuracy = results.get("masked_lm_accuracy") if results else None
  cards = "1 card" if num_ranks == 1 else "%d cards" % num_ranks
  logger.print("| %s | acc %s | fps %.2f | status %s |"
               % (cards, "%.6f" % accuracy if accuracy is not None else "n/a", fps_steady,
                  status if FLAGS.stop_threshold > 0 else "no target"))
  if FLAGS.do_train and meter.sentences and rcp is not None:
    summary.update(log_time_to_train(logger, fps_steady, evals, rcp, status, step,
                                     meter.batch_size))
  logger.metrics(step, summary, prefix="summary")


def log_time_to_train(logger, throughput, evals, rcp, status, step, batch_size):
  """Prints the projected time to train to MLPerf's target at `throughput`: the RCP's mean
  samples to converge (rcp: mlperf.RcpChoice), plus MLPerf's evaluations of eval_10k at
  the rule's interval, timed by this run's evaluations; after a run that reached the
  target, its samples beside the RCP's. Returns the figures for the summary record."""
  per_sample = evals.eval_time / evals.eval_samples if evals.eval_samples else None
  total, evaluations, eval_seconds = mlperf.projected_time_to_train(
      rcp.samples_mean, throughput, batch_size, per_sample)
  logger.print("projected time to train: %s (%.0f samples, the mean of MLPerf's %s, at "
               "%.2f sentences/s, and %d evaluations of %d samples: %s)"
               % (mlperf.format_duration(total), rcp.samples_mean, rcp.rcp.name, throughput,
                  evaluations, mlperf.EVAL_SAMPLES,
                  mlperf.format_duration(eval_seconds) if eval_seconds is not None
                  else "not timed, the run did not evaluate"))
  figures = {"projected_time_to_train_s": total, "rcp_samples_mean": rcp.samples_mean}
  if status == "success":
    samples = step * batch_size
    logger.print("samples to converge: %d; %s: mean %.0f, stdev %.0f (%.2f of the mean)"
                 % (samples, rcp.rcp.name, rcp.samples_mean, rcp.samples_stdev,
                    samples / rcp.samples_mean))
    figures["samples_to_converge"] = samples
  return figures


def apply_reference_hyperparameters(rcp):
  """Sets the hyperparameters of the RCP (mlperf.RcpChoice) that the command line does not
  give. Returns the log line that says which RCP and which flags."""
  taken = []
  for name, value in sorted(rcp.hyperparameters.items()):
    if not FLAGS[name].present:
      setattr(FLAGS, name, value)
      taken.append("--%s=%s" % (name, value))
  if not FLAGS["optimizer"].present:
    FLAGS.optimizer = "lamb"
  return "--reference_hyperparameters: %s; %s" % (
      rcp.note, ", ".join(taken) if taken else "every one given on the command line")


def check_initial_accuracy(logger, accuracy, init_checkpoint):
  """The load check: the accuracy right after loading --init_checkpoint beside the
  expected one, and a warning when they are apart."""
  expected = FLAGS.expected_initial_accuracy
  if expected is None:
    expected = mlperf.expected_initial_accuracy(init_checkpoint)
  if expected is None:
    return
  logger.print("masked_lm_accuracy after loading %s: %.5f (expected %.5f)"
               % (os.path.basename(init_checkpoint), accuracy, expected))
  warning = mlperf.initial_accuracy_warning(accuracy, expected,
                                            FLAGS.initial_accuracy_tolerance)
  if warning:
    logger.warning(0, warning)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("unexpected arguments: %s; flags take the form --name=value"
                         % " ".join(argv[1:]))
  tf.logging.set_verbosity(tf.logging.ERROR)
  tf.disable_v2_behavior()
  stop = signals.StopRequest()
  stop.install()
  try:
    # --use_fp16 and --manual_fp16 (the anchors' names) are aliases of --amp; --amp_dtype
    # implies it.
    device = device_lib.detect_device(FLAGS.device, mixed_precision(), FLAGS.amp_dtype)
    inputs = check_flags()
  except ValueError as e:
    errors.print_error("run_pretraining", e)
    return 2
  except (EnvironmentError, tf.errors.OpError) as e:
    if not errors.is_file_error(e):
      raise
    errors.print_error("run_pretraining", errors.os_error_message(e))
    return 2
  ranks = None
  try:
    ranks = ranks_lib.Ranks(distribution(), FLAGS.stall_timeout_s, FLAGS.output_dir,
                            device_lib.replica_devices(device, FLAGS.cpu_devices))
    if ranks.is_chief:
      # Held while this frame lives (the whole run); a Horovod job's other ranks share it.
      lock = checkpoints.OutputDirLock(FLAGS.output_dir)
      lock.acquire()
      removed = checkpoints.remove_partial_checkpoints(FLAGS.output_dir)
      if removed:
        print("Removed what an interrupted save left in %s: %s"
              % (FLAGS.output_dir, ", ".join(removed)))
    status = run(inputs, ranks, device, stop)
    ranks.stop()
    if stop.requested:
      # Saved and logged. horovodrun --gloo kills the ranks 5 s after it forwards a
      # signal, and the interpreter's teardown (TensorFlow, Horovod) took 2 of those at
      # load 2, more than 5 with the save at load 9: skip it.
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(status)  # pylint: disable=protected-access
    return status
  except ValueError as e:
    errors.print_error("run_pretraining", e)
    return 2
  except EnvironmentError as e:
    errors.print_error("run_pretraining", errors.os_error_message(
        e, lambda what: checkpoints.disk_full_message(FLAGS.output_dir, what)))
    return 2
  except tf.errors.ResourceExhaustedError as e:
    if checkpoints.is_disk_full(e):
      errors.print_error("run_pretraining", checkpoints.disk_full_message(
          FLAGS.output_dir, "its files"))
      return 2
    errors.print_error("run_pretraining",
                       "out of memory (%s); lower --train_batch_size and raise "
                       "--num_accumulation_steps to keep the global batch"
                       % e.message.splitlines()[0])
    return 2
  except tf.errors.DataLossError as e:
    errors.print_error("run_pretraining", bad_record_message(e, inputs, ranks))
    return 2
  except tf.errors.InvalidArgumentError as e:
    if input_pipeline.TOKEN_ID_ERROR not in e.message:
      raise
    errors.print_error("run_pretraining", bad_record_message(e, inputs, ranks))
    return 2
  except tf.errors.OpError as e:
    if errors.is_file_error(e):
      errors.print_error("run_pretraining", errors.os_error_message(e))
      return 2
    if ranks is None or not _is_job_error(e, ranks):
      raise
    stalled = ranks.stalled_ranks()
    errors.print_error(
        "run_pretraining",
        "%s stopped the job (%s)%s; checkpoints in %s are kept: rerun the same command to "
        "resume" % ("Horovod" if ranks.hvd else "TensorFlow's collective all-reduce",
                    _error_line(e.message).split(". ")[0],
                    "; rank %s stopped answering" % ", ".join(str(r) for r in stalled)
                    if stalled else "; a rank stalled or failed: its number is in the lines "
                    "above ('Missing ranks', or its own error)", FLAGS.output_dir))
    return 3


def bad_record_message(error, inputs, ranks):
  """The one-line error for a bad record met while training or evaluating: reads this
  rank's files to name the file and the record (the rest of the line says what to do)."""
  # Every rank reads every training file (make_dataset), and its part of the eval set.
  where = list(inputs.train_files) + input_pipeline.rank_files(
      inputs.eval_files, ranks.size if ranks else 1, ranks.rank if ranks else 0)
  record = input_pipeline.locate_bad_record(where, FLAGS.max_seq_length,
                                            FLAGS.max_predictions_per_seq,
                                            inputs.bert_config.vocab_size, error.message)
  if record is None:
    return ("bad TFRecord data (%s); find it with python3 tools/inspect_tfrecords.py "
            "--input=%s" % (_error_line(error.message), FLAGS.input_files_dir))
  if "token id" in record.problem:
    fix = ("use the bert_config.json whose vocab_size matches the data's vocab, re-create "
           "the file, or pass --skip_corrupt_records")
  else:
    fix = "re-create or remove the file, or pass --skip_corrupt_records"
  return "bad TFRecord %s; %s; checkpoints in %s are kept" % (
      input_pipeline.describe_bad_record(record), fix, FLAGS.output_dir)


def _error_line(message):
  """The informative line of a TensorFlow error message (not "Graph execution error:")."""
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  for line in lines:
    if not line.startswith(("Graph execution error", "Detected at node", "File ", "Node:",
                            "[[", "Traceback")) and not line.endswith(":"):
      return line
  return lines[0] if lines else "no message"


def _is_job_error(error, ranks):
  """True for the errors Horovod, or TensorFlow's collectives of multi_worker_mirrored,
  raise when the job is broken (a rank stalled or gone)."""
  if ranks.hvd is not None:
    return any(word in error.message for word in ("Horovod", "horovod", "gloo", "Gloo"))
  return ranks.size > 1 and isinstance(error, (tf.errors.UnavailableError,
                                               tf.errors.CancelledError,
                                               tf.errors.AbortedError,
                                               tf.errors.DeadlineExceededError))


if __name__ == "__main__":
  enable_cpu_xla(sys.argv)
  app.run(lambda argv: sys.exit(main(argv)))
