"""BERT pretraining (masked LM + next sentence): the training and evaluation loop.

Runs on one card, or on many with --horovod (one process per card, launched by
run_multi_card_FPS.sh). Plain tf.compat.v1 Session code, so the same file runs on
TensorFlow 1.15 and 2.x:

  get batch -> forward -> backward -> (accumulate) -> all-reduce -> LAMB step -> log
  -> checkpoint -> evaluate, until --num_train_steps or masked-LM accuracy reaches
  --stop_threshold.

python3 -m bert_pretrain.run_pretraining --input_files_dir=... --eval_files_dir=... \
    --bert_config_file=bert_config.json --init_checkpoint=model.ckpt-28252 \
    --output_dir=./results --train_batch_size=6
"""

import math
import os
import sys
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain import checkpoints
from bert_pretrain import input_pipeline
from bert_pretrain import logs
from bert_pretrain import modeling
from bert_pretrain import optimization
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
flags.DEFINE_integer("samples_between_eval", 150000, "Evaluate every this many training samples.")
flags.DEFINE_integer("samples_start_eval", 3000000, "No periodic evaluation before this many "
                     "training samples.")
flags.DEFINE_float("stop_threshold", 0.72, "Stop when masked-LM accuracy reaches this (0: never).")
flags.DEFINE_bool("horovod", False, "One process per card, gradients all-reduced by Horovod.")
flags.DEFINE_bool("amp", False, "Mixed precision: float16 compute with loss scaling on GPUs, "
                  "bfloat16 on CPUs; master weights stay float32.")
flags.DEFINE_bool("use_fp16", False, "Alias of --amp.")
flags.DEFINE_bool("use_xla", False, "XLA JIT: auto-clustering of the graph, and the optimizer "
                  "update compiled as one XLA cluster.")
flags.DEFINE_integer("intra_op_threads", 0, "Threads per op (0: cores / ranks on this host).")
flags.DEFINE_integer("inter_op_threads", 0, "Ops run at once (0: 2).")
flags.DEFINE_integer("shuffle_buffer", 10000, "Training records held for shuffling.")
flags.DEFINE_integer("seed", None, "Graph-level random seed (dropout, shuffling).")
flags.DEFINE_string("submission_org", "unknown", "MLPerf log: submitting organization.")
flags.DEFINE_string("submission_platform", "unknown", "MLPerf log: system name.")

FLAGS = flags.FLAGS


class Ranks(object):
  """Who this process is: its rank among `size` ranks, and its local rank on the host."""

  def __init__(self, use_horovod):
    self.hvd = None
    self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
    if use_horovod:
      try:
        import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
      except ImportError as e:
        raise ValueError("--horovod needs Horovod with TensorFlow support (%s); run "
                         "bash init_tf.sh" % e)
      hvd.init()
      self.hvd = hvd
      self.rank, self.size = hvd.rank(), hvd.size()
      self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()

  @property
  def is_chief(self):
    return self.rank == 0


def check_flags():
  """Checks the flags and inputs that fail cheaply, before any graph is built.

  Returns:
    (bert_config, train_files, eval_files).

  Raises:
    ValueError: with the one-line message the user sees.
  """
  if FLAGS.use_fp16:
    FLAGS.amp = True
  if not FLAGS.bert_config_file:
    raise ValueError("--bert_config_file is required; pass --bert_config_file=PATH/bert_config.json")
  bert_config = modeling.BertConfig.from_json_file(FLAGS.bert_config_file)
  for name in ("train_batch_size", "eval_batch_size", "num_accumulation_steps",
               "max_seq_length", "max_predictions_per_seq", "display_loss_steps",
               "save_checkpoints_steps", "samples_between_eval", "shuffle_buffer"):
    if getattr(FLAGS, name) < 1:
      raise ValueError("--%s=%d must be at least 1" % (name, getattr(FLAGS, name)))
  for name in ("num_warmup_steps", "start_warmup_step", "fps_warmup_steps",
               "keep_checkpoint_max", "max_eval_steps", "samples_start_eval"):
    if getattr(FLAGS, name) < 0:
      raise ValueError("--%s=%d must not be negative" % (name, getattr(FLAGS, name)))
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
  if FLAGS.init_checkpoint:
    checkpoints.resolve_checkpoint(FLAGS.init_checkpoint)
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
  for files in (train_files, eval_files):
    if files:
      input_pipeline.check_record_files(files, FLAGS.max_seq_length,
                                        FLAGS.max_predictions_per_seq,
                                        vocab_size=bert_config.vocab_size)
  _check_output_dir(FLAGS.output_dir)
  checkpoints.find_resume_checkpoint(FLAGS.output_dir, resume_settings(bert_config))
  return bert_config, train_files, eval_files


def resume_settings(bert_config):
  """What a run resuming from output_dir must share with the run that wrote it."""
  return {"bert_config": bert_config.to_dict(), "max_seq_length": FLAGS.max_seq_length,
          "max_predictions_per_seq": FLAGS.max_predictions_per_seq,
          "optimizer": FLAGS.optimizer}


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


def session_config(ranks):
  """Threads, GPU placement and XLA for this rank's session."""
  cores = os.cpu_count() or 1
  intra = FLAGS.intra_op_threads or max(1, cores // ranks.local_size)
  config = tf.ConfigProto(intra_op_parallelism_threads=intra,
                          inter_op_parallelism_threads=FLAGS.inter_op_threads or 2,
                          allow_soft_placement=True)
  config.gpu_options.allow_growth = True
  if ranks.hvd is not None:
    # One card per rank: the local rank picks it.
    config.gpu_options.visible_device_list = str(ranks.local_rank)
  if FLAGS.use_xla:
    config.graph_options.optimizer_options.global_jit_level = tf.OptimizerOptions.ON_1
  return config


def compute_type():
  """float32, or with --amp float16 on a GPU and bfloat16 on a CPU."""
  if not FLAGS.amp:
    return tf.float32
  # list_physical_devices starts no GPU, so it does not fight the session's
  # visible_device_list (one card per Horovod rank).
  gpus = tf.config.experimental.list_physical_devices("GPU")
  return tf.float16 if gpus else tf.bfloat16


def build_model(bert_config, features, is_training, dtype):
  """BERT with its two pretraining heads on a batch of features.

  Returns:
    dict of tensors: total_loss, mlm_loss, nsp_loss (float32 scalars) and the sums that
    evaluation adds up over batches: mlm_correct, mlm_weight, mlm_loss_sum, nsp_correct,
    nsp_count, nsp_loss_sum.
  """
  model = modeling.BertModel(config=bert_config, is_training=is_training,
                             input_ids=features["input_ids"],
                             input_mask=features["input_mask"],
                             token_type_ids=features["segment_ids"],
                             compute_type=dtype)
  with tf.variable_scope("", custom_getter=modeling.get_custom_getter(dtype)):
    (mlm_loss, mlm_example_loss, mlm_log_probs) = modeling.get_masked_lm_output(
        bert_config, model.get_sequence_output(), model.get_embedding_table(),
        features["masked_lm_positions"], features["masked_lm_ids"],
        features["masked_lm_weights"])
    (nsp_loss, nsp_example_loss, nsp_log_probs) = modeling.get_next_sentence_output(
        bert_config, model.get_pooled_output(), features["next_sentence_labels"])

  mlm_ids = tf.reshape(features["masked_lm_ids"], [-1])
  mlm_weights = tf.reshape(features["masked_lm_weights"], [-1])
  mlm_hits = tf.cast(tf.equal(tf.argmax(mlm_log_probs, axis=-1, output_type=tf.int32), mlm_ids),
                     tf.float32)
  nsp_labels = tf.reshape(features["next_sentence_labels"], [-1])
  nsp_hits = tf.cast(tf.equal(tf.argmax(nsp_log_probs, axis=-1, output_type=tf.int32),
                              nsp_labels), tf.float32)
  return {
      "total_loss": mlm_loss + nsp_loss,
      "mlm_loss": mlm_loss,
      "nsp_loss": nsp_loss,
      "mlm_correct": tf.reduce_sum(mlm_hits * mlm_weights),
      "mlm_weight": tf.reduce_sum(mlm_weights),
      "mlm_loss_sum": tf.reduce_sum(mlm_example_loss * mlm_weights),
      "nsp_correct": tf.reduce_sum(nsp_hits),
      "nsp_count": tf.cast(tf.size(nsp_hits), tf.float32),
      "nsp_loss_sum": tf.reduce_sum(nsp_example_loss),
  }


EVAL_SUMS = ("mlm_correct", "mlm_weight", "mlm_loss_sum", "nsp_correct", "nsp_count",
             "nsp_loss_sum")


class Evaluator(object):
  """Evaluates the current weights on the eval set; each rank reads its part of it and
  the sums are all-reduced, so N ranks report what one card would on the whole set.

  Args:
    bert_config: BertConfig.
    eval_files: list of TFRecord paths.
    ranks: Ranks.
    dtype: compute type of the model.
    batch_size, max_seq_length, max_predictions_per_seq: of the eval records.
    max_eval_steps: batches per rank (0: the whole set).
  """

  def __init__(self, bert_config, eval_files, ranks, dtype, batch_size, max_seq_length,
               max_predictions_per_seq, max_eval_steps=0):
    dataset = input_pipeline.make_dataset(
        eval_files, batch_size, max_seq_length, max_predictions_per_seq,
        is_training=False, num_shards=ranks.size, shard_index=ranks.rank)
    if max_eval_steps > 0:
      dataset = dataset.take(max_eval_steps)
    self.iterator = tf.data.make_initializable_iterator(dataset)
    # AUTO_REUSE: the eval model shares the training model's variables, or makes them
    # when there is no training.
    with tf.variable_scope("", reuse=tf.AUTO_REUSE):
      outputs = build_model(bert_config, self.iterator.get_next(), False, dtype)
    self.batch_sums = tf.stack([outputs[k] for k in EVAL_SUMS])
    self.ranks = ranks
    if ranks.hvd is not None:
      self.rank_sums = tf.placeholder(tf.float64, [len(EVAL_SUMS)])
      self.all_sums = ranks.hvd.allreduce(self.rank_sums, op=ranks.hvd.Sum,
                                          name="eval_sums")

  def evaluate(self, sess):
    """Returns dict: masked_lm_accuracy, masked_lm_loss, next_sentence_accuracy,
    next_sentence_loss, eval_samples."""
    sess.run(self.iterator.initializer)
    sums = np.zeros(len(EVAL_SUMS), np.float64)
    while True:
      try:
        sums += sess.run(self.batch_sums)
      except tf.errors.OutOfRangeError:
        break
    if self.ranks.hvd is not None:
      sums = sess.run(self.all_sums, {self.rank_sums: sums})
    s = dict(zip(EVAL_SUMS, sums))
    return {
        "masked_lm_accuracy": s["mlm_correct"] / max(s["mlm_weight"], 1e-12),
        "masked_lm_loss": s["mlm_loss_sum"] / max(s["mlm_weight"], 1e-12),
        "next_sentence_accuracy": s["nsp_correct"] / max(s["nsp_count"], 1.0),
        "next_sentence_loss": s["nsp_loss_sum"] / max(s["nsp_count"], 1.0),
        "eval_samples": int(s["nsp_count"]),
    }


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
  logger.mlperf("num_ranks", ranks.size)


def run(bert_config, train_files, eval_files, ranks, stop=None):
  """Builds the graph, then trains and evaluates. Returns the process exit status.

  stop: (optional) the installed signals.StopRequest: SIGTERM or SIGINT then stop the
  training after the current update, on every rank, with a checkpoint.
  """
  stop = stop or signals.StopRequest()
  run_start = time.time()
  is_chief = ranks.is_chief
  logger = logs.RunLogger(
      output_dir=FLAGS.output_dir, is_chief=is_chief,
      dllog_path=FLAGS.dllog_path or os.path.join(FLAGS.output_dir, "dllog.json"),
      mllog_path=FLAGS.mllog_path or logs.new_log_path(FLAGS.output_dir, "mlperf", ".log"))
  logger.mlperf(logs.mllog.constants.INIT_START, kind="start")
  if FLAGS.seed is not None:
    tf.set_random_seed(FLAGS.seed)
  dtype = compute_type()
  global_batch_size = FLAGS.train_batch_size * FLAGS.num_accumulation_steps * ranks.size
  learning_rate_value = FLAGS.learning_rate * (ranks.size if FLAGS.scale_lr_by_ranks else 1)
  logger.print("bert_pretrain: %d rank(s), batch %d x %d accumulation x %d ranks = %d "
               "sentences per update, seq %d, %s compute, optimizer %s, lr %g%s"
               % (ranks.size, FLAGS.train_batch_size, FLAGS.num_accumulation_steps, ranks.size,
                  global_batch_size, FLAGS.max_seq_length, dtype.name, FLAGS.optimizer,
                  learning_rate_value,
                  " (scaled by ranks)" if FLAGS.scale_lr_by_ranks else ""))
  log_hyperparameters(logger, ranks, global_batch_size, learning_rate_value)

  global_step = tf.train.get_or_create_global_step()
  outputs = update_op = accumulate_op = learning_rate = loss_scale = None
  if FLAGS.do_train:
    skip_batches = tf.placeholder_with_default(tf.constant(0, tf.int64), [])
    dataset = input_pipeline.make_dataset(
        train_files, FLAGS.train_batch_size, FLAGS.max_seq_length,
        FLAGS.max_predictions_per_seq, is_training=True, num_shards=ranks.size,
        shard_index=ranks.rank, shuffle_buffer=FLAGS.shuffle_buffer, seed=FLAGS.seed,
        skip_batches=skip_batches)
    train_iterator = tf.data.make_initializable_iterator(dataset)
    features = train_iterator.get_next()
    outputs = build_model(bert_config, features, True, dtype)
    learning_rate = optimization.learning_rate_schedule(
        global_step, learning_rate_value, FLAGS.num_train_steps, FLAGS.num_warmup_steps,
        FLAGS.poly_power, FLAGS.start_warmup_step)
    optimizer = optimization.create_optimizer(FLAGS.optimizer, learning_rate,
                                              FLAGS.weight_decay_rate, FLAGS.beta_1,
                                              FLAGS.beta_2, FLAGS.epsilon)
    if dtype == tf.float16:
      loss_scale = optimization.DynamicLossScale()
    allreduce_fn = None
    if ranks.hvd is not None:
      hvd = ranks.hvd
      allreduce_fn = lambda grads: [hvd.allreduce(g, op=hvd.Average) for g in grads]
    (accumulate_op, update_op) = optimization.create_train_ops(
        outputs["total_loss"], optimizer, global_step, FLAGS.num_accumulation_steps,
        allreduce_fn=allreduce_fn if FLAGS.allreduce_post_accumulation else None,
        loss_scale=loss_scale,
        pre_accumulation_fn=None if FLAGS.allreduce_post_accumulation else allreduce_fn,
        compile_optimizer=FLAGS.use_xla)
  if FLAGS.do_train:
    losses = tf.stack([outputs["total_loss"], outputs["mlm_loss"], outputs["nsp_loss"]])
    if ranks.hvd is not None:
      losses = ranks.hvd.allreduce(losses, op=ranks.hvd.Average, name="display_losses")
    display_fetches = {"update": update_op, "losses": losses, "learning_rate": learning_rate}
    stop_feed, stop_agreed = signals.agreed_signal(ranks.hvd)
    if loss_scale is not None:
      display_fetches.update(loss_scale=loss_scale.scale,
                             skipped_steps=loss_scale.skipped_steps)
  evaluator = None
  if FLAGS.do_eval:
    evaluator = Evaluator(bert_config, eval_files, ranks, dtype, FLAGS.eval_batch_size,
                          FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
                          FLAGS.max_eval_steps)

  model_variables = tf.trainable_variables()
  # max_to_keep=0 keeps every checkpoint.
  saver = tf.train.Saver(max_to_keep=FLAGS.keep_checkpoint_max or None)
  broadcast_op = ranks.hvd.broadcast_global_variables(0) if ranks.hvd is not None else None

  sess = tf.Session(config=session_config(ranks))
  sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
  resume_prefix = checkpoints.find_resume_checkpoint(FLAGS.output_dir,
                                                     resume_settings(bert_config))
  if resume_prefix:
    checkpoints.check_resumable(resume_prefix, tf.global_variables())
    present = dict(tf.train.list_variables(resume_prefix))
    tf.train.Saver(var_list=[v for v in tf.global_variables()
                             if v.op.name in present]).restore(sess, resume_prefix)
    # Older checkpoints of the earlier run stay in the rotation of --keep_checkpoint_max.
    state = tf.train.get_checkpoint_state(FLAGS.output_dir)
    if state is not None:
      saver.recover_last_checkpoints(list(state.all_model_checkpoint_paths))
    logger.print("Resuming from %s at step %d (weights, optimizer state, learning-rate "
                 "schedule); --init_checkpoint is not applied"
                 % (resume_prefix, sess.run(global_step)))
  elif FLAGS.init_checkpoint:
    checkpoints.restore_model_weights(sess, checkpoints.resolve_checkpoint(FLAGS.init_checkpoint),
                                      model_variables, log=logger.print)
  else:
    logger.print("No --init_checkpoint: the model starts from random weights")
  if broadcast_op is not None:
    sess.run(broadcast_op)
  if FLAGS.do_train:
    sess.run(train_iterator.initializer,
             {skip_batches: data_position(int(sess.run(global_step)), logger.print)})
  if is_chief and FLAGS.do_train:
    checkpoints.write_run_marker(FLAGS.output_dir, resume_settings(bert_config))
  sess.graph.finalize()  # Nothing may add ops inside the loop.
  logger.mlperf(logs.mllog.constants.INIT_STOP, kind="end")
  logger.mlperf(logs.mllog.constants.RUN_START, kind="start")

  step = int(sess.run(global_step))
  results = {}
  last_eval_step = None
  status = "aborted"
  eval_time = 0.0

  def evaluate(at_step):
    nonlocal eval_time, last_eval_step
    start = time.time()
    samples = {"epoch_num": at_step * global_batch_size}
    logger.mlperf(logs.mllog.constants.EVAL_START, metadata=samples, kind="start")
    res = evaluator.evaluate(sess)
    logger.mlperf(logs.mllog.constants.EVAL_STOP, metadata=samples, kind="end")
    eval_time += time.time() - start
    res["eval_time_s"] = round(time.time() - start, 3)
    if last_eval_step is None:
      logger.mlperf(logs.mllog.constants.EVAL_SAMPLES, res["eval_samples"])
    last_eval_step = at_step
    logger.mlperf(logs.mllog.constants.EVAL_ACCURACY, res["masked_lm_accuracy"],
                  metadata=samples)
    logger.eval_results(at_step, res, FLAGS.output_dir if is_chief else None)
    return res

  def reached_target(res):
    return FLAGS.stop_threshold > 0 and res["masked_lm_accuracy"] >= FLAGS.stop_threshold

  if evaluator is not None and (FLAGS.eval_at_start or not FLAGS.do_train):
    results = evaluate(step)
    results_at_start = results
  else:
    results_at_start = None

  # Throughput bookkeeping: steps after the first fps_warmup_steps, without checkpoint
  # and evaluation time, give the steady-state FPS.
  trained_sentences = 0
  steady_sentences = 0
  steady_time = 0.0
  checkpoint_time = 0.0
  loop_start = time.time()
  window_start, window_steps = time.time(), 0
  first_step = step
  next_eval_samples = max(FLAGS.samples_start_eval, step * global_batch_size +
                          FLAGS.samples_between_eval)
  last_saved = step
  loss_is_finite = True
  loop_eval_time = 0.0
  if FLAGS.do_train and step >= FLAGS.num_train_steps:
    logger.print("global_step %d already reached --num_train_steps=%d; nothing to train"
                 % (step, FLAGS.num_train_steps))
  block_first_step = None  # MLPerf "blocks": the training between two evaluations.
  stopped_by = 0  # The signal that stopped the training (all ranks agree), 0: none.
  stop.arm()

  def block(kind):
    nonlocal block_first_step
    if kind == "start":
      block_first_step = step
    metadata = {"first_epoch_num": block_first_step * global_batch_size,
                "epoch_count": FLAGS.samples_between_eval}
    logger.mlperf(logs.mllog.constants.BLOCK_START if kind == "start"
                  else logs.mllog.constants.BLOCK_STOP, metadata=metadata, kind=kind)
    if kind == "end":
      block_first_step = None

  while FLAGS.do_train and step < FLAGS.num_train_steps:
    if block_first_step is None:
      block("start")
    step_start = time.time()
    for _ in range(FLAGS.num_accumulation_steps - 1):
      sess.run(accumulate_op)
    display = step + 1 == FLAGS.num_train_steps or (step + 1) % FLAGS.display_loss_steps == 0
    # Losses are fetched (and averaged over ranks) on display steps only.
    values = sess.run(dict(display_fetches if display else {"update": update_op},
                           stop_signal=stop_agreed), {stop_feed: stop.signum})
    step += 1
    step_time = time.time() - step_start
    trained_sentences += global_batch_size
    if step - first_step > FLAGS.fps_warmup_steps:
      steady_sentences += global_batch_size
      steady_time += step_time
    window_steps += 1

    if step % FLAGS.display_loss_steps == 0 or step == FLAGS.num_train_steps:
      window_fps = window_steps * global_batch_size / max(time.time() - window_start, 1e-9)
      total_loss, mlm_loss, nsp_loss = values["losses"]
      line = ("Step %d, total_loss: %.4f, mlm_loss: %.4f, nsp_loss: %.4f, learning_rate: %.3e, "
              "sentences_per_second: %.2f" % (step, total_loss, mlm_loss, nsp_loss,
                                              values["learning_rate"], window_fps))
      if loss_scale is not None:
        line += ", loss_scale: %g, skipped_steps: %d" % (values["loss_scale"],
                                                         values["skipped_steps"])
      logger.print(line)
      logger.metrics(step, {"total_loss": total_loss, "mlm_loss": mlm_loss,
                            "nsp_loss": nsp_loss, "learning_rate": values["learning_rate"],
                            "throughput_train": window_fps}, prefix="train")
      # All ranks see the same averaged loss, so they stop together. With loss
      # scaling a non-finite step is skipped, not fatal.
      loss_is_finite = bool(np.isfinite(total_loss)) or loss_scale is not None
      if not loss_is_finite:
        logger.print("Loss is %s at step %d: stopping without saving. Lower --learning_rate "
                     "or raise --num_warmup_steps" % (total_loss, step))
        break
      window_start, window_steps = time.time(), 0

    if is_chief and step % FLAGS.save_checkpoints_steps == 0:
      start = time.time()
      saver.save(sess, os.path.join(FLAGS.output_dir, "model.ckpt"), global_step=step,
                 write_meta_graph=False)
      checkpoint_time += time.time() - start
      last_saved = step
      window_start += time.time() - start

    stopped_by = int(values["stop_signal"])
    if stopped_by:
      # Every rank says where it stopped: the ranks agree on the step.
      print("%s: rank %d stops after step %d; to resume, run the same command with "
            "--output_dir=%s" % (signals.name(stopped_by), ranks.rank, step, FLAGS.output_dir),
            flush=True)
      break
    if evaluator is not None and step * global_batch_size >= next_eval_samples \
        and step < FLAGS.num_train_steps:
      while next_eval_samples <= step * global_batch_size:
        next_eval_samples += FLAGS.samples_between_eval
      block("end")
      results = evaluate(step)
      loop_eval_time += results["eval_time_s"]
      window_start += results["eval_time_s"]
      if reached_target(results):
        logger.print("masked_lm_accuracy %.4f reached --stop_threshold=%g at step %d"
                     % (results["masked_lm_accuracy"], FLAGS.stop_threshold, step))
        break
  train_time = time.time() - loop_start
  if block_first_step is not None:
    block("end")

  if FLAGS.do_train and is_chief and step != last_saved and loss_is_finite:
    saver.save(sess, os.path.join(FLAGS.output_dir, "model.ckpt"), global_step=step,
               write_meta_graph=False)
  if evaluator is not None and last_eval_step != step and loss_is_finite and not stopped_by:
    results = evaluate(step)
  if results and reached_target(results):
    status = "success"
  logger.mlperf(logs.mllog.constants.TRAIN_SAMPLES, step * global_batch_size)
  logger.mlperf(logs.mllog.constants.RUN_STOP, kind="end", metadata={"status": status})

  e2e_time = time.time() - run_start
  fps_all = trained_sentences / max(train_time - loop_eval_time, 1e-9)
  fps_steady = steady_sentences / steady_time if steady_time > 0 else fps_all
  summary = {"e2e_time_s": e2e_time, "training_sentences": trained_sentences,
             "throughput_with_overhead": fps_all, "throughput": fps_steady,
             "checkpoint_time_s": checkpoint_time, "eval_time_s": eval_time}
  if results_at_start and FLAGS.do_train:
    logger.print("masked_lm_accuracy before training: %.4f"
                 % results_at_start["masked_lm_accuracy"])
  logger.print("e2e_time: %.2f s, training sentences: %d, checkpoint time: %.2f s, eval time: "
               "%.2f s" % (e2e_time, trained_sentences, checkpoint_time, eval_time))
  logger.print("Throughput Average (sentences/sec) with overhead = %.2f (warm-up and checkpoint "
               "time included, evaluation excluded)" % fps_all)
  logger.print("Throughput Average (sentences/sec) = %.2f (after %d warm-up steps, without "
               "checkpoint and eval time)" % (fps_steady, FLAGS.fps_warmup_steps))
  accuracy = results.get("masked_lm_accuracy") if results else None
  cards = "1 card" if ranks.size == 1 else "%d cards" % ranks.size
  logger.print("| %s | acc %s | fps %.2f | status %s |"
               % (cards, "%.6f" % accuracy if accuracy is not None else "n/a", fps_steady,
                  status if FLAGS.stop_threshold > 0 else "no target"))
  logger.metrics(step, summary, prefix="summary")
  logger.close()
  if stopped_by and ranks.hvd is not None:
    # A barrier: no rank exits (which makes the launcher end the others) before rank 0
    # has saved and written its logs.
    sess.run(stop_agreed)
  sess.close()
  if stopped_by:
    return signals.exit_status(stopped_by)
  return 0 if loss_is_finite else 1


def data_position(step, log):
  """Micro-batches of this rank's training data to skip when resuming at `step`.

  With --seed the data order is the same in every run, so a resumed run skips what the
  run it resumes consumed (step x num_accumulation_steps micro-batches per rank) and
  continues that order. Without --seed a resumed run starts a new shuffled pass.
  """
  if step == 0:
    return 0
  if FLAGS.seed is None:
    log("Data: no --seed, so the resumed run starts a new shuffled pass over the data "
        "(with --seed it continues the data order where the run stopped)")
    return 0
  skip = step * FLAGS.num_accumulation_steps
  log("Data: skipping the %d micro-batches (%d records) of each rank that the run consumed "
      "up to step %d; the data order continues where it stopped"
      % (skip, skip * FLAGS.train_batch_size, step))
  return skip


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("unexpected arguments: %s; flags take the form --name=value"
                         % " ".join(argv[1:]))
  tf.logging.set_verbosity(tf.logging.ERROR)
  tf.disable_v2_behavior()
  stop = signals.StopRequest()
  stop.install()
  try:
    bert_config, train_files, eval_files = check_flags()
  except ValueError as e:
    print("run_pretraining: error: %s" % e, file=sys.stderr)
    return 2
  try:
    return run(bert_config, train_files, eval_files, Ranks(FLAGS.horovod), stop)
  except ValueError as e:
    print("run_pretraining: error: %s" % e, file=sys.stderr)
    return 2
  except tf.errors.ResourceExhaustedError as e:
    print("run_pretraining: error: out of memory (%s); lower --train_batch_size and raise "
          "--num_accumulation_steps to keep the global batch" % e.message.splitlines()[0],
          file=sys.stderr)
    return 2
  except tf.errors.DataLossError as e:
    print("run_pretraining: error: corrupt TFRecord data (%s); re-create or remove the "
          "corrupt file" % e.message.splitlines()[0], file=sys.stderr)
    return 2


if __name__ == "__main__":
  app.run(lambda argv: sys.exit(main(argv)))
