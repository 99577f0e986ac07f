"""The BERT pretraining graph: the model with its two heads, the training step, the
evaluator and the session config.

Used alike by the training loop (loop.py), bench/ and the demo. It reads no flags:
everything it needs is an argument.

  features = tf.data.make_initializable_iterator(dataset).get_next()
  train = build_train_graph(bert_config, features, tf.float32,
                            config.Optimizer(learning_rate=1e-4, num_train_steps=1000))
  evaluator = Evaluator(bert_config, eval_files, ranks, tf.float32, 64, 128, 20)
  sess = tf.Session(config=session_config(intra_op_threads=2, inter_op_threads=2))
  ... sess.run(train.accumulate_op) x (k - 1), then sess.run(train.step_fetches) ...
"""

import collections
import functools

import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain.training import checkpoints
from bert_pretrain.data import input_pipeline
from bert_pretrain.model import heads
from bert_pretrain.model import modeling
from bert_pretrain.model import precision
from bert_pretrain.model import unpadded
from bert_pretrain.model import dropout as dropout_lib
from bert_pretrain.training import optimization
from bert_pretrain.training import signals


# Attending sequence by sequence pays on a CPU from sequence 512 up; at 128 each
# sequence's few more ops cost what the padding's attention did (docs/performance.md).
PER_SEQUENCE_ATTENTION_FROM = 512


def attends_per_sequence(seq_length, dtype, on_cpu, use_xla):
  """Whether build_model's encoder should attend sequence by sequence, at the real tokens
  only (its attention_per_sequence): on a CPU without XLA, from sequence length
  PER_SEQUENCE_ATTENTION_FROM up. On a GPU each sequence's small ops would be kernel
  launches of their own, and under XLA every new length a new compilation; so would it
  be with bfloat16 on TensorFlow 1.15, whose CPU build has no bfloat16 batched matmul
  kernel and compiles one with XLA for each new shape."""
  if dtype == tf.bfloat16 and tf.__version__.startswith("1."):
    return False
  return bool(on_cpu and not use_xla and seq_length >= PER_SEQUENCE_ATTENTION_FROM)


def build_model(bert_config, features, is_training, dtype, attention_per_sequence=False,
                dropout_seeds=None, drop_padding=True):
  """BERT with its two pretraining heads on a batch of features.

  The heads read the last layer at the [CLS] token and the masked positions only, so
  that layer is computed there only (BertModel's masked_lm_positions), and the encoder
  skips the padding (BertModel's drop_padding): the same losses and gradients for
  fewer FLOPs.

  Args:
    bert_config: modeling.BertConfig.
    features: dict of int32 Tensors, as input_pipeline.make_dataset gives them:
      input_ids, input_mask, segment_ids of shape [batch_size, seq_length];
      masked_lm_positions, masked_lm_ids of shape [batch_size, max_predictions_per_seq];
      masked_lm_weights (float32) of that shape; next_sentence_labels of shape
      [batch_size, 1]. Or a batch of packed records (records.py): positions too, and
      next_sentence_positions, next_sentence_labels, next_sentence_weights (float32)
      of shape [batch_size, max_sequences_per_pack]; attention then stays within each
      sequence and the losses are those of the same sequences unpacked.
    is_training: dropout on.
    dtype: compute type (tf.float32, tf.bfloat16 or tf.float16); weights stay float32.
    attention_per_sequence: the attention too skips the padding, sequence by sequence
      (attends_per_sequence says when it pays).
    dropout_seeds: (optional) dropout_lib.DropoutSeeds of the dropout masks.
    drop_padding: the encoder skips the padding (BertModel's drop_padding); False
      computes every position, as a GPU's static shapes do (bench/packing.py's padded
      rows).

  Returns:
    dict of tensors: total_loss, mlm_loss, nsp_loss (float32 scalars) and the sums that
    evaluation adds up over batches: mlm_correct, mlm_weight, mlm_loss_sum, nsp_correct,
    nsp_count, nsp_loss_sum.
  """
  packed = "positions" in features
  model = modeling.BertModel(config=bert_config, is_training=is_training,
                             input_ids=features["input_ids"],
                             input_mask=features["input_mask"],
                             token_type_ids=features["segment_ids"],
                             compute_type=dtype,
                             masked_lm_positions=features["masked_lm_positions"],
                             drop_padding=drop_padding,
                             attention_per_sequence=attention_per_sequence,
                             dropout_seeds=dropout_seeds,
                             packed=packed,
                             position_ids=features.get("positions"),
                             cls_positions=features.get("next_sentence_positions"))
  nsp_weights = features.get("next_sentence_weights")
  with tf.variable_scope("", custom_getter=precision.get_custom_getter(dtype)):
    (mlm_loss, mlm_example_loss, mlm_log_probs) = heads.get_masked_lm_output(
        bert_config, model.get_masked_positions_output(), model.get_embedding_table(),
        None, features["masked_lm_ids"], features["masked_lm_weights"])
    (nsp_loss, nsp_example_loss, nsp_log_probs) = heads.get_next_sentence_output(
        bert_config, model.get_pooled_output(), features["next_sentence_labels"],
        nsp_weights)

  mlm_ids = tf.reshape(features["masked_lm_ids"], [-1])
  mlm_weights = tf.reshape(features["masked_lm_weights"], [-1])
  mlm_hits = tf.cast(tf.equal(tf.argmax(mlm_log_probs, axis=-1, output_type=tf.int32), mlm_ids),
                     tf.float32)
  nsp_labels = tf.reshape(features["next_sentence_labels"], [-1])
  nsp_hits = tf.cast(tf.equal(tf.argmax(nsp_log_probs, axis=-1, output_type=tf.int32),
                              nsp_labels), tf.float32)
  nsp_weights = (tf.ones_like(nsp_hits) if nsp_weights is None
                 else tf.reshape(nsp_weights, [-1]))
  return {
      "total_loss": mlm_loss + nsp_loss,
      "mlm_loss": mlm_loss,
      "nsp_loss": nsp_loss,
      "mlm_correct": tf.reduce_sum(mlm_hits * mlm_weights),
      "mlm_weight": tf.reduce_sum(mlm_weights),
      "mlm_loss_sum": tf.reduce_sum(mlm_example_loss * mlm_weights),
      "nsp_correct": tf.reduce_sum(nsp_hits * nsp_weights),
      "nsp_count": tf.reduce_sum(nsp_weights),
      "nsp_loss_sum": tf.reduce_sum(nsp_example_loss * nsp_weights),
  }


TrainGraph = collections.namedtuple("TrainGraph", [
    "outputs", "global_step", "loss_scale", "accumulate_op", "update_op", "step_fetches",
    "display_fetches", "stop_feed", "stop_agreed", "rank_time", "rank_times",
    "data_position", "micro_batch", "record_ids", "real_tokens"])


def build_train_graph(bert_config, features, dtype, opt, learning_rate=None, ranks=None,
                      attention_per_sequence=False, seed=None, drop_padding=True):
  """The ops of one training update: features -> model -> gradients -> (accumulation)
  -> all-reduce -> optimizer, and what the loop fetches with them.

  Args:
    bert_config: modeling.BertConfig.
    features: dict of int32 Tensors of one micro-batch of batch_size sequences (see
      build_model), e.g. an iterator's get_next() of input_pipeline.make_dataset (with
      ranks, of ranks.iterator(): one micro-batch per replica).
    dtype: compute type; tf.float16 brings dynamic loss scaling.
    opt: config.Optimizer: the optimizer, its schedule, accumulation, all-reduce,
      clipping and float16's first loss scale (train_ops).
    learning_rate: the schedule's peak (default: opt.learning_rate).
    ranks: (optional) ranks.Ranks of several replicas: the graph is built per replica
      (under ranks.scope()); gradients (train_ops), losses and stop signal all-reduced.
    attention_per_sequence, drop_padding: build_model's (attends_per_sequence says
      when attending per sequence pays).
    seed: (optional) Python int: each dropout mask is a function of it, the site and
      the micro-batch's first record (a resumed run draws the same); None: stateful.

  Returns:
    TrainGraph with
      outputs: build_model's dict of the micro-batch (of the first replica).
      global_step: int64 variable, the updates applied.
      loss_scale: optimization.DynamicLossScale, None unless dtype is float16.
      accumulate_op, update_op: run accumulate_op k-1 times (None when k == 1), then
        update_op (optimization.create_train_ops).
      step_fetches: dict to fetch with feed {stop_feed: signal number}; it runs the
        update and gives "step" (global_step after it: the same when loss scaling
        skipped the update), "stop_signal" (the largest signal number of all ranks, 0:
        none) and with loss scaling "loss_scale" and "skipped_steps".
      display_fetches: step_fetches plus "losses" (float32 [3]: total, masked-LM and
        next-sentence loss, averaged over the replicas), "learning_rate" and
        "forward_done" (when this rank's forward pass ended, seconds since the epoch).
      stop_feed, stop_agreed: signals.agreed_signal's placeholder and its agreed value.
      rank_time, rank_times: with several processes, a float64 [1] placeholder (this
        rank's step time) and every rank's (float64 [ranks]); None otherwise.
      data_position: int64 variable (checkpoints.DATA_POSITION), the records of the
        data order consumed: update_op adds the global batch (batch_size x accumulation x
        replicas), also when loss scaling skips the update (its data was read).
      micro_batch: int64 placeholder (default 0): the micro-batch's index in the update,
        fed when accumulate_op and update_op run (the dropout masks differ by it).
      record_ids, real_tokens: to fetch with the ops above: int64, a fingerprint of each
        record the micro-batch trained on (record_fingerprints); int32 [3], the first
        replica's real tokens, its sequences' squared real tokens summed and its
        sequences (real_token_counts, for timing.Tokens).
  """
  global_step = tf.train.get_or_create_global_step()
  data_position = tf.get_variable(checkpoints.DATA_POSITION, [], tf.int64, trainable=False,
                                  initializer=tf.zeros_initializer())
  micro_batch = tf.placeholder_with_default(tf.constant(0, tf.int64), [], name="micro_batch")
  replicas = ranks.replicas if ranks is not None else 1
  several = ranks is not None and ranks.replicas > 1
  all_reduce = ranks.all_reduce if several else None
  stop_feed = tf.placeholder_with_default(tf.constant(0.0), [], name="stop_signal")
  rank_time = None
  if ranks is not None and ranks.size > 1:
    # Gathered on display steps only: each rank's input + forward time of that step.
    rank_time = tf.placeholder(tf.float64, [1])

  def replica(features):
    batch_size = tf.shape(features["input_ids"], out_type=tf.int64)[0]
    dropout_seeds = None
    if seed is not None:
      replica_index = ranks.replica_index() if ranks is not None else tf.constant(0, tf.int64)
      first_record = data_position.read_value() + (
          micro_batch * replicas + replica_index) * batch_size
      dropout_seeds = dropout_lib.DropoutSeeds(seed, first_record)
    outputs = build_model(bert_config, features, True, dtype, attention_per_sequence,
                          dropout_seeds, drop_padding)
    (lr, loss_scale, accumulate_op, update_op) = train_ops(
        opt, outputs["total_loss"], global_step, dtype,
        opt.learning_rate if learning_rate is None else learning_rate, all_reduce)
    with tf.control_dependencies([update_op]):
      # After the update, whose forward pass read it for the dropout masks.
      advance = data_position.assign_add(batch_size * opt.num_accumulation_steps * replicas)
    update_op = tf.group(update_op, advance)
    losses = tf.stack([outputs["total_loss"], outputs["mlm_loss"], outputs["nsp_loss"]])
    if several:
      losses = all_reduce([losses], name="display_losses")[0]
    stop_agreed = signals.agreed_signal(stop_feed, ranks if several else None)
    (step_fetches, display_fetches) = fetches(global_step, update_op, loss_scale,
                                              stop_agreed, outputs, losses, lr)
    # Each rank's time at its own place, summed: every rank's time.
    rank_times = None if rank_time is None else ranks.process_sum(
        tf.one_hot(ranks.rank, ranks.size, dtype=tf.float64) * rank_time,
        name="rank_step_times")
    return TrainGraph(outputs, global_step, loss_scale, accumulate_op, update_op,
                      step_fetches, display_fetches, stop_feed, stop_agreed, rank_time,
                      rank_times, data_position, micro_batch, record_fingerprints(features),
                      real_token_counts(features["input_mask"],
                                        features.get("next_sentence_positions")))

  if ranks is None:
    return replica(features)
  graphs = ranks.each_replica(replica, features)
  # Every replica's records, in the order of the replicas (merged keeps the first's).
  record_ids = tf.concat([g.record_ids for g in graphs], axis=0)
  return ranks.merged(graphs)._replace(record_ids=record_ids)


def train_ops(opt, total_loss, global_step, dtype, learning_rate, all_reduce=None):
  """The schedule, the optimizer and its ops for one replica's loss.

  Args:
    opt: config.Optimizer.
    total_loss: float32 scalar Tensor of one micro-batch.
    global_step: int64 variable.
    dtype: compute type; tf.float16 brings dynamic loss scaling.
    learning_rate: the schedule's peak.
    all_reduce: (optional) ranks.Ranks.all_reduce: the gradients are summed (or
      averaged, as opt.cross_replica_gradients says) over the replicas, before or after
      the accumulation (opt.allreduce_post_accumulation).

  Returns:
    (learning_rate Tensor, DynamicLossScale or None, accumulate_op or None, update_op).
  """
  lr = optimization.learning_rate_schedule(global_step, learning_rate, opt.num_train_steps,
                                           opt.num_warmup_steps, opt.poly_power,
                                           opt.start_warmup_step,
                                           micro_batches=opt.num_accumulation_steps
                                           if opt.lr_schedule_step == "micro_batch" else 1)
  optimizer = optimization.create_optimizer(opt.optimizer, lr, opt.weight_decay_rate,
                                            opt.beta_1, opt.beta_2, opt.epsilon,
                                            opt.lamb_adapt_layernorm_and_bias)
  loss_scale = None
  if dtype == tf.float16:
    loss_scale = optimization.DynamicLossScale(initial_scale=opt.init_loss_scale)
  if all_reduce is not None:
    all_reduce = functools.partial(all_reduce, average=opt.cross_replica_gradients == "mean")
  post = opt.allreduce_post_accumulation
  (accumulate_op, update_op) = optimization.create_train_ops(
      total_loss, optimizer, global_step, opt.num_accumulation_steps,
      allreduce_fn=all_reduce if post else None, loss_scale=loss_scale,
      pre_accumulation_fn=None if post else all_reduce, clipping=opt.gradient_clipping)
  return lr, loss_scale, accumulate_op, update_op


def fetches(global_step, update_op, loss_scale, stop_agreed, outputs, losses, lr):
  """(step_fetches, display_fetches): TrainGraph's dicts (see build_train_graph)."""
  with tf.control_dependencies([update_op]):
    # global_step after the update: one more, or the same when loss scaling skipped
    # an update whose gradients overflowed.
    step_fetches = {"step": global_step.read_value()}
    if loss_scale is not None:
      step_fetches.update(loss_scale=loss_scale.scale.read_value(),
                          skipped_steps=loss_scale.skipped_steps.read_value())
  # The stop request agreed by all ranks, in the same session run as the update.
  step_fetches["stop_signal"] = stop_agreed
  # When this rank's forward pass ended (seconds since the epoch): what the step took
  # here before waiting for the other ranks in the all-reduce.
  with tf.control_dependencies([outputs["total_loss"]]):
    forward_done = tf.timestamp()
  return step_fetches, dict(step_fetches, losses=losses, learning_rate=lr,
                            forward_done=forward_done)


def real_token_counts(input_mask, cls_positions=None):
  """int32 [3]: a batch's real tokens, the sum of its sequences' squared real tokens,
  and its sequences. input_mask: int [batch_size, seq_length]; packed rows
  (cls_positions [batch_size, k] given) hold each token's sequence index 1..k."""
  lengths = unpadded.sequence_lengths(
      input_mask, 1 if cls_positions is None else cls_positions.shape.as_list()[1])
  sequences = tf.reduce_sum(tf.cast(lengths > 0, tf.int32))
  return tf.stack([tf.reduce_sum(lengths), tf.reduce_sum(lengths * lengths), sequences])


def record_fingerprints(features):
  """int64 [batch_size]: a number that tells the records of a batch apart (a weighted
  sum of their input_ids, segment_ids and masked_lm_positions), the same for a record
  in every run, whatever batch it is in. For tests and checks of which records were
  trained on; it is computed only when fetched."""
  with tf.name_scope("record_fingerprints"):
    parts = [tf.cast(features[name], tf.int64) for name in
             ("input_ids", "segment_ids", "masked_lm_positions")]
    values = tf.concat(parts, axis=1)
    # Weights 1, 31, 31^2, ... modulo a number below 2^31: with ids below 2^16 the sum
    # stays below 2^63 up to 2^16 columns.
    width = values.shape.as_list()[1]
    weights = [1]
    for _ in range(width - 1):
      weights.append(weights[-1] * 31 % 2147483629)
    return tf.reduce_sum(values * tf.constant(weights, tf.int64), axis=1)


EVAL_SUMS = ("mlm_correct", "mlm_weight", "mlm_loss_sum", "nsp_correct", "nsp_count",
             "nsp_loss_sum")


class Evaluator(object):
  """Evaluates the current weights on the eval set; each rank reads its part of it and
  the sums are all-reduced, so N ranks report what one card would on the whole set.

  Args:
    bert_config: BertConfig.
    eval_files: list of TFRecord paths.
    ranks: ranks.Ranks.
    dtype: compute type of the model.
    batch_size, max_seq_length, max_predictions_per_seq: of the eval records.
    max_eval_steps: batches per rank (0: the whole set).
  """

  def __init__(self, bert_config, eval_files, ranks, dtype, batch_size, max_seq_length,
               max_predictions_per_seq, max_eval_steps=0):
    dataset = input_pipeline.make_dataset(
        eval_files, batch_size, max_seq_length, max_predictions_per_seq,
        is_training=False, num_shards=ranks.size, shard_index=ranks.rank,
        vocab_size=bert_config.vocab_size)
    if max_eval_steps > 0:
      dataset = dataset.take(max_eval_steps)
    self.iterator = tf.data.make_initializable_iterator(dataset)
    # AUTO_REUSE: the eval model shares the training model's variables, or makes them
    # when there is no training.
    with tf.variable_scope("", reuse=tf.AUTO_REUSE):
      outputs = build_model(bert_config, self.iterator.get_next(), False, dtype)
    self.batch_sums = tf.stack([outputs[k] for k in EVAL_SUMS])
    self.ranks = ranks
    if ranks.size > 1:
      self.rank_sums = tf.placeholder(tf.float64, [len(EVAL_SUMS)])
      self.all_sums = ranks.merged(ranks.each_replica(
          lambda: ranks.process_sum(self.rank_sums, name="eval_sums")))

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
    if self.ranks.size > 1:
      sums = sess.run(self.all_sums, {self.rank_sums: sums})
    s = dict(zip(EVAL_SUMS, sums))
    return {
        "masked_lm_accuracy": s["mlm_correct"] / max(s["mlm_weight"], 1e-12),
        "masked_lm_loss": s["mlm_loss_sum"] / max(s["mlm_weight"], 1e-12),
        "next_sentence_accuracy": s["nsp_correct"] / max(s["nsp_count"], 1.0),
        "next_sentence_loss": s["nsp_loss_sum"] / max(s["nsp_count"], 1.0),
        "eval_samples": int(s["nsp_count"]),
    }


def session_config(intra_op_threads, inter_op_threads, gpu=None, use_xla=False,
                   cpu_devices=1):
  """Threads, GPU placement and XLA of a training session.

  Args:
    intra_op_threads: threads per op.
    inter_op_threads: ops run at once.
    gpu: (optional) index, among the GPUs this process sees, of the one it computes on
      (one card per rank), or "all" (one process drives every card it sees); None: the
      CPU, no GPU.
    use_xla: XLA auto-clustering of the graph.
    cpu_devices: logical CPU devices (/cpu:0, /cpu:1, ...), for replicas on the CPU.

  Returns:
    tf.ConfigProto.
  """
  config = tf.ConfigProto(intra_op_parallelism_threads=intra_op_threads,
                          inter_op_parallelism_threads=inter_op_threads,
                          allow_soft_placement=True)
  config.device_count["CPU"] = cpu_devices
  if gpu is not None:
    config.gpu_options.allow_growth = True
    if gpu != "all":
      config.gpu_options.visible_device_list = str(gpu)
  else:
    config.device_count["GPU"] = 0
  if use_xla:
    config.graph_options.optimizer_options.global_jit_level = tf.OptimizerOptions.ON_1
  return config
