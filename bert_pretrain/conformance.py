r"""Numerics conformance: one batch, forward and backward, on the device and precision
under test against the CPU in float32, layer by layer.

  python3 -m bert_pretrain.conformance --bert_config_file=bert_config.json \
      --init_checkpoint=model.ckpt-28252 --input_files_dir=/data/train \
      --max_seq_length=512 --max_predictions_per_seq=76 --train_batch_size=8 --amp

It takes the flags of run_pretraining (a run's command line can be passed as it is, its
--preset applied; the flags that do not change the numbers are ignored; a demo's, as
--preset=demo, reads the demo's model and records): the model (--bert_config_file,
--init_checkpoint, or fresh weights from --seed), the batch (the first
--train_batch_size records of --input_files_dir in file order, or a synthetic batch
from --seed when it is not given), the lengths, and where and in which type the run
computes (--device, --amp / --amp_dtype, --use_xla, --init_loss_scale), decided as the
run decides them (device.detect_device). Two graphs are built with the recipe's own
builder (pretraining.build_model: BertModel with its two heads, dropout off): the tested
one on that device in that compute type, and a reference on the CPU in float32, from the
same weights and fed the same batch. Each computes the losses and the gradients of the
total loss.

The table has a row per layer, in the order of the forward pass: the embeddings, each
encoder layer's attention output and feed-forward output, the heads (pooler, masked-LM
transform and logits, next-sentence logits) and the losses, each found in the graph by
Google's scope name (bert/encoder/layer_3/attention/output/LayerNorm), and a row per
variable group's gradients (each layer's attention, each layer's feed-forward, the
embeddings, the pooler, each head), in the order the backward pass computes them. The
first row outside its tolerance is named and the exit status is 1.

Relative error: ||tested - reference|| / ||reference||, the 2-norms over the tensor's
real tokens (the encoder computes its padding rows differently in different graphs, and
nothing reads them), or over the group's variables.

Tolerance: K x sqrt(1 + depth) x (u x m + u32 x sqrt(n)), from the tested compute type:
- u is the unit round-off of the type the tested matmuls compute in: 2^-8 for bfloat16,
  2^-11 for float16 (and for float32 on a GPU where TensorFlow runs float32 matmuls in
  TF32, which has float16's mantissa), 2^-24 for float32. Each matmul rounds its inputs
  and output to it.
- m is 1 where the elementwise math between the matmuls (GELU, softmax, residual, layer
  norm's input) computes in float32, as it does for bfloat16 (precision.elementwise_dtype),
  and ELEMENTWISE_ROUNDINGS where it computes in the low-precision type too (float16):
  its roundings add to the matmuls'.
- u32 x sqrt(n), with u32 = 2^-24 and n the longest dot product of an encoder layer
  (max(hidden_size, intermediate_size)), is what another order of float32 additions
  gives (another device's kernels): it dominates only when both sides compute float32.
- depth counts the matmuls on the way: one per sublayer (2 x layer + 1 for a layer's
  attention output, + 2 for its feed-forward output, 2 x layers + 1 for the heads, + 1
  for the logits and the losses), and for a gradient also the backward pass's from the
  losses down to its variables. Rounding errors of independent sublayers add up like a
  random walk, hence its square root: the errors measured grew so (BERT-Base, 12 layers).
- K is K_FORWARD for the forward rows and K_GRADIENT for the gradients, whose products
  are differences of larger terms (the softmax's and layer norm's gradients) and come
  out less accurate. They were set from bfloat16 and float16 on the CPU (a 2-layer BERT
  fresh and trained, a 12-layer one fresh), about 2.5x above the largest errors there,
  while a second GELU in a trained layer's feed-forward is 2.5x above its tolerance in
  bfloat16.
A row outside its tolerance is where the tested numbers leave float32's by more than
their type explains: a wrong kernel, or a place where the type itself falls short. The
pooler's tanh computes in bfloat16 (dense_layer applies it to the matmul's output), and
when training has pushed it near +-1 its gradient, 1 - tanh^2 of the rounded output, can
leave its tolerance (seen on a tiny BERT after 40 updates).
"""

import collections
import math
import os
import sys

from absl import flags
import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain import config
from bert_pretrain import demo
from bert_pretrain import errors
from bert_pretrain.training import checkpoints
from bert_pretrain.distributed import device as device_lib
from bert_pretrain.data import input_pipeline
from bert_pretrain.model import modeling
from bert_pretrain.model import precision
from bert_pretrain.training import pretraining
from bert_pretrain.distributed import ranks as ranks_lib
from bert_pretrain import run_pretraining  # its flags: a run's command line works here
from bert_pretrain.wiki import workdir

flags.DEFINE_integer("inject_fault_layer", -1, "Checks the checker: a second activation "
                     "after the feed-forward activation of this encoder layer, in the "
                     "tested graph only, as a wrong kernel would compute it (-1: none).")

FLAGS = flags.FLAGS

# The tolerance's constants (the module docstring says how they were set).
K_FORWARD = 2.0
K_GRADIENT = 16.0
# The rounding factor where the elementwise math computes in the low-precision type.
ELEMENTWISE_ROUNDINGS = 4.0
# Unit round-off (half the spacing of the numbers around 1) of each compute type.
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11,
                 "tf32": 2.0 ** -11}
# Fresh weights and the synthetic batch without --seed.
DEFAULT_SEED = 12345

# A compared quantity: its name (a scope of the graph, or a loss, or a variable group),
# what it is, its depth in matmuls and the relative error with its tolerance.
Row = collections.namedtuple("Row", ["section", "name", "what", "depth", "error",
                                     "tolerance"])


def row_ok(row):
  return row.error <= row.tolerance  # False for NaN


def synthetic_batch(batch_size, seq_length, predictions, vocab_size, seed=DEFAULT_SEED):
  """A batch of the records' shapes with random tokens: each sequence has a random
  length from a quarter of seq_length up (the rest padding), two segments, 15% of its
  tokens masked (at most `predictions`, the other prediction slots padding of weight 0)
  and a random next-sentence label.

  Returns:
    dict name -> numpy array, as input_pipeline.make_dataset gives them (int32, and
    float32 masked_lm_weights).
  """
  rng = np.random.RandomState(seed)
  shape = (batch_size, seq_length)
  batch = {"input_ids": np.zeros(shape, np.int32), "input_mask": np.zeros(shape, np.int32),
           "segment_ids": np.zeros(shape, np.int32),
           "masked_lm_positions": np.zeros((batch_size, predictions), np.int32),
           "masked_lm_ids": np.zeros((batch_size, predictions), np.int32),
           "masked_lm_weights": np.zeros((batch_size, predictions), np.float32),
           "next_sentence_labels": rng.randint(0, 2, (batch_size, 1)).astype(np.int32)}
  for b in range(batch_size):
    length = rng.randint(max(2, seq_length // 4), seq_length + 1)
    batch["input_ids"][b, :length] = rng.randint(1, vocab_size, length)
    batch["input_mask"][b, :length] = 1
    batch["segment_ids"][b, length // 2:length] = 1
    count = min(predictions, max(1, int(round(config.MASKED_LM_PROB * length))), length - 1)
    positions = np.sort(rng.choice(np.arange(1, length), count, replace=False))
    batch["masked_lm_positions"][b, :count] = positions
    batch["masked_lm_ids"][b, :count] = rng.randint(1, vocab_size, count)
    batch["masked_lm_weights"][b, :count] = 1.0
  return batch


def read_batch(files, batch_size, seq_length, predictions, vocab_size):
  """The first `batch_size` records of `files`, in file order (fewer if the files hold
  fewer), as a dict name -> numpy array."""
  with tf.Graph().as_default():
    dataset = input_pipeline.make_dataset(files, batch_size, seq_length, predictions,
                                          is_training=False, vocab_size=vocab_size)
    features = tf.data.make_one_shot_iterator(dataset).get_next()
    with tf.Session() as sess:
      return sess.run(features)


def faulty_activation(activation, layer):
  """The activation `activation` with a second GELU after it in encoder layer `layer`'s
  feed-forward, as a graph built with a wrong kernel would compute it: a hidden_act
  (BertConfig takes a function there, as Google's does) that the tested graph gets."""
  scope = "bert/encoder/layer_%d/intermediate/" % layer

  def act(x):
    y = activation(x) if activation is not None else x
    if (tf.get_default_graph().get_name_scope() + "/").startswith(scope):
      y = modeling.gelu(y)
    return y
  return act


def _is_variable_read(op):
  return op.type in ("VariableV2", "VarHandleOp", "ReadVariableOp", "Const") or (
      op.type == "Identity" and op.inputs[0].op.type in ("VariableV2", "VarHandleOp"))


def scope_output(graph, scope):
  """The tensor that leaves a scope of the forward graph: the last made of the floating
  tensors made inside `scope` that an op outside it reads (variable reads left out).

  Raises:
    ValueError: no such tensor: the graph has no scope of that name.
  """
  prefix = scope + "/"
  inside = [op for op in graph.get_operations() if op.name.startswith(prefix)]
  names = set(op.name for op in inside)
  leaving = [t for op in inside if not _is_variable_read(op) for t in op.outputs
             if t.dtype.is_floating and any(c.name not in names for c in t.consumers())]
  if not leaving:
    raise ValueError("the graph has no output of scope %s: the model's scope names are not "
                     "Google BERT's" % scope)
  return leaving[-1]


def logits_of(graph, scope):
  """The logits of a head: the input of the log-softmax in `scope`."""
  for op in graph.get_operations():
    if op.type == "LogSoftmax" and op.name.startswith(scope + "/"):
      return op.inputs[0]
  raise ValueError("the graph has no log-softmax in scope %s" % scope)


def forward_points(bert_config):
  """The forward table's rows, in the order of the forward pass: list of (name, what,
  depth, rows), rows saying which rows of the tensor are compared: "positions" (of a
  [batch, seq, ...] tensor, the real tokens), "real" (the first rows, as many as the
  real tokens: an encoder layer that skips the padding) or "all"."""
  layers = bert_config.num_hidden_layers
  points = [("bert/embeddings/LayerNorm", "embeddings", 0, "positions")]
  for i in range(layers):
    # The last layer is computed at the [CLS] token and the masked positions only.
    rows = "all" if i == layers - 1 else "real"
    points.append(("bert/encoder/layer_%d/attention/output/LayerNorm" % i,
                   "layer %d attention output" % i, 2 * i + 1, rows))
    points.append(("bert/encoder/layer_%d/output/LayerNorm" % i,
                   "layer %d feed-forward output" % i, 2 * i + 2, rows))
  head = 2 * layers + 1
  points += [("bert/pooler/dense", "pooled [CLS]", head, "all"),
             ("cls/predictions/transform/LayerNorm", "masked-LM transform", head, "all"),
             ("cls/predictions/logits", "masked-LM logits", head + 1, "all"),
             ("cls/seq_relationship/logits", "next-sentence logits", head + 1, "all"),
             ("mlm_loss", "masked-LM loss", head + 1, "all"),
             ("nsp_loss", "next-sentence loss", head + 1, "all"),
             ("total_loss", "total loss", head + 1, "all")]
  return points


def gradient_groups(bert_config):
  """The variable groups, in the order the backward pass reaches them: list of (name,
  what, variable name prefixes, depth)."""
  layers = bert_config.num_hidden_layers
  total = 2 * layers + 2  # the losses' forward depth
  groups = [("cls/seq_relationship", "next-sentence head", ("cls/seq_relationship/",),
             total + 1),
            ("cls/predictions", "masked-LM head", ("cls/predictions/",), total + 1),
            ("bert/pooler", "pooler", ("bert/pooler/",), total + 1)]
  for i in reversed(range(layers)):
    scope = "bert/encoder/layer_%d/" % i
    groups.append((scope + "{intermediate,output}", "layer %d feed-forward" % i,
                   (scope + "intermediate/", scope + "output/"), 2 * total - (2 * i + 1)))
    groups.append((scope + "attention", "layer %d attention" % i, (scope + "attention/",),
                   2 * total - 2 * i))
  groups.append(("bert/embeddings", "embeddings", ("bert/embeddings/",), 2 * total))
  return groups


class Side(object):
  """One graph of the comparison: the model on a fed batch with its forward points and
  its gradients, fetched in float32.

  Args:
    bert_config: BertConfig (its hidden_act may be a function: faulty_activation).
    batch: dict name -> numpy array (for the placeholders' shapes and types).
    dtype: compute type.
    attention_per_sequence: pretraining.build_model's.
    loss_scale: the gradients are those of the total loss times this, divided by it
      (float16's loss scaling; 1 for the other types).
    seed: graph-level seed of the variables' initializers.
  """

  def __init__(self, bert_config, batch, dtype, attention_per_sequence=False,
               loss_scale=1.0, seed=DEFAULT_SEED):
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(seed)
      self.placeholders = {name: tf.placeholder(tf.as_dtype(value.dtype), value.shape,
                                                name=name)
                           for name, value in batch.items()}
      outputs = pretraining.build_model(bert_config, self.placeholders, False, dtype,
                                        attention_per_sequence)
      tensors = {}
      for name, _, _, _ in forward_points(bert_config):
        if name in outputs:
          tensors[name] = outputs[name]
        elif name.endswith("/logits"):
          tensors[name] = logits_of(self.graph, name[:-len("/logits")])
        else:
          tensors[name] = scope_output(self.graph, name)
      self.variables = tf.trainable_variables()
      scaled = outputs["total_loss"] * loss_scale
      grads = tf.gradients(scaled, self.variables)
      self.fetches = {name: tf.cast(t, tf.float32) for name, t in tensors.items()}
      for var, grad in zip(self.variables, grads):
        if grad is not None:
          self.fetches["grad:" + checkpoints.variable_name(var)] = (
              tf.cast(tf.convert_to_tensor(grad), tf.float32) / loss_scale)
      self.saver = tf.train.Saver(self.variables)
      self.init = tf.global_variables_initializer()

  def run(self, config, batch, weights=None, checkpoint=None, log=print):
    """Runs the batch once.

    Args:
      config: tf.ConfigProto of the session (its device, threads, XLA).
      batch: dict name -> numpy array.
      weights: dict variable name -> numpy array, or None: then from `checkpoint`, or
        the initializers' (the graph's seed).
      checkpoint: a checkpoint prefix (checkpoints.resolve_checkpoint).

    Returns:
      (values, weights): dict name -> float64 numpy array of the fetches, and the
      weights the batch ran with.
    """
    with tf.Session(graph=self.graph, config=config) as sess:
      sess.run(self.init)
      if weights is not None:
        for var in self.variables:
          var.load(weights[checkpoints.variable_name(var)], sess)
      elif checkpoint:
        checkpoints.restore_model_weights(sess, checkpoint, self.variables, log=log)
      feed = {self.placeholders[name]: value for name, value in batch.items()}
      values = sess.run(self.fetches, feed)
      used = dict(zip([checkpoints.variable_name(v) for v in self.variables],
                      sess.run(self.variables)))
    return {k: np.asarray(v, np.float64) for k, v in values.items()}, used


def relative_error(tested, reference):
  """||tested - reference|| / ||reference|| (2-norms); 0 when both are 0; NaN where the
  tested values are not finite."""
  tested, reference = np.ravel(tested), np.ravel(reference)
  if not np.all(np.isfinite(tested)):
    return float("nan")
  difference = np.linalg.norm(tested - reference)
  norm = np.linalg.norm(reference)
  if norm == 0:
    return 0.0 if difference == 0 else float("inf")
  return float(difference / norm)


def _compared_rows(value, rule, mask):
  if rule == "positions":
    return value[mask.astype(bool)]
  if rule == "real":
    return value[:int(mask.sum())]
  return value


def tolerance(section, depth, compute, bert_config):
  """The tolerance of a row (the module docstring derives it).

  Args:
    section: "forward" or "gradient".
    depth: the row's depth in matmuls.
    compute: the tested compute type's name, a key of UNIT_ROUNDOFF.
    bert_config: BertConfig (the length of its dot products).

  Returns:
    float.
  """
  low_precision_elementwise = compute in ("float16", "bfloat16") and (
      precision.elementwise_dtype(tf.as_dtype(compute)) != tf.float32)
  rounding = UNIT_ROUNDOFF[compute] * (ELEMENTWISE_ROUNDINGS if low_precision_elementwise
                                       else 1.0)
  longest = max(bert_config.hidden_size, bert_config.intermediate_size)
  accumulation = UNIT_ROUNDOFF["float32"] * math.sqrt(longest)
  factor = K_FORWARD if section == "forward" else K_GRADIENT
  return factor * math.sqrt(1 + depth) * (rounding + accumulation)


def compare_values(bert_config, tested, reference, mask, compute):
  """The table's rows from both sides' values.

  Args:
    bert_config: BertConfig.
    tested, reference: Side.run's values.
    mask: numpy int [batch_size, seq_length], the batch's input_mask.
    compute: the tested compute type's name (tested_compute).

  Returns:
    list of Row: the forward rows, then the gradient rows.
  """
  rows = []
  for name, what, depth, rule in forward_points(bert_config):
    error = relative_error(_compared_rows(tested[name], rule, mask),
                           _compared_rows(reference[name], rule, mask))
    rows.append(Row("forward", name, what, depth, error,
                    tolerance("forward", depth, compute, bert_config)))
  grads = sorted(k for k in reference if k.startswith("grad:"))
  for name, what, prefixes, depth in gradient_groups(bert_config):
    keys = [k for k in grads if k[len("grad:"):].startswith(prefixes)]
    error = relative_error(np.concatenate([np.ravel(tested[k]) for k in keys]),
                           np.concatenate([np.ravel(reference[k]) for k in keys]))
    rows.append(Row("gradient", name, what, depth, error,
                    tolerance("gradient", depth, compute, bert_config)))
  return rows


def first_failure(rows):
  """The first row outside its tolerance (forward rows first, then the gradients in the
  order the backward pass computes them), or None."""
  for row in rows:
    if not row_ok(row):
      return row
  return None


def tested_compute(device):
  """The name of the type the tested matmuls compute in (a key of UNIT_ROUNDOFF):
  device.dtype's, or "tf32" for float32 on a GPU where TensorFlow runs float32 matmuls
  in TF32 (TensorFlow 2.4 and later, on Ampere and newer GPUs, by default)."""
  name = device.dtype.name
  tf32 = getattr(tf.config.experimental, "tensor_float_32_execution_enabled",  # tf-compat: guarded
                 None)
  if name == "float32" and device.kind == "GPU" and tf32 is not None and tf32():
    return "tf32"
  return name


def check(bert_config, batch, device, config, init_checkpoint=None, seed=DEFAULT_SEED,
          use_xla=False, loss_scale=2.0 ** 15, fault_layer=-1, log=print):
  """Runs the batch on the tested device and type and on the CPU in float32, from the
  same weights.

  Args:
    bert_config: BertConfig.
    batch: dict name -> numpy array (synthetic_batch or read_batch).
    device: device_lib.Device under test.
    config: tf.ConfigProto of the tested session (pretraining.session_config); the
      reference's has its threads and no GPU.
    init_checkpoint: checkpoint prefix of the weights, or None: fresh ones from `seed`.
    seed: graph seed of the fresh weights.
    use_xla: whether the tested graph is compiled with XLA (decides its attention, as in
      a run; the session config turns XLA on).
    loss_scale: float16's loss scale for the gradients (other types: none).
    fault_layer: >= 0: faulty_activation in that encoder layer of the tested graph.
    log: function taking a line.

  Returns:
    (rows, compute): the table's rows (compare_values) and the name of the tested
    compute type (tested_compute).
  """
  reference_config = pretraining.session_config(config.intra_op_parallelism_threads,
                                                config.inter_op_parallelism_threads)
  reference = Side(bert_config, batch, tf.float32, seed=seed)
  reference_values, weights = reference.run(reference_config, batch,
                                            checkpoint=init_checkpoint, log=log)
  tested_config = bert_config
  if fault_layer >= 0:
    tested_config = modeling.BertConfig.from_dict(bert_config.to_dict())
    tested_config.hidden_act = faulty_activation(
        modeling.get_activation(bert_config.hidden_act), fault_layer)
  seq_length = batch["input_ids"].shape[1]
  tested = Side(tested_config, batch, device.dtype,
                pretraining.attends_per_sequence(seq_length, device.dtype,
                                                 device.kind == "CPU", use_xla),
                loss_scale if device.dtype == tf.float16 else 1.0)
  tested_values, _ = tested.run(config, batch, weights=weights)
  compute = tested_compute(device)
  return (compare_values(bert_config, tested_values, reference_values, batch["input_mask"],
                         compute), compute)



def format_table(rows):
  """The table as lines: the forward rows, then the gradients, each with its relative
  error, tolerance and the error's share of it."""
  width = max(len(row.name) for row in rows)
  what = max(len(row.what) for row in rows)
  lines = ["%-*s  %-*s  %5s  %9s  %9s  %5s" % (width, "", what, "", "depth", "rel.error",
                                            "tolerance", "share")]
  for section, title in (("forward", "forward pass, in its order:"),
                         ("gradient", "gradients of the total loss, in the order the "
                                      "backward pass computes them:")):
    lines.append(title)
    for row in rows:
      if row.section != section:
        continue
      share = ("%4.0f%%" % (100.0 * row.error / row.tolerance) if not np.isnan(row.error)
               else "not finite")
      lines.append("%-*s  %-*s  %5d  %9.2e  %9.2e  %5s%s" % (
          width, row.name, what, row.what, row.depth, row.error, row.tolerance, share,
          "" if row_ok(row) else "  <- outside its tolerance"))
  return lines


# Gradient rows that a small batch's next-sentence losses feed alone.
NEXT_SENTENCE_ROWS = ("cls/seq_relationship", "bert/pooler")


def verdict(rows):
  """(exit status, the closing line)."""
  failed = first_failure(rows)
  if failed is None:
    worst = max(rows, key=lambda row: row.error / row.tolerance)
    return 0, ("PASS: every layer and gradient group within its tolerance (the largest "
               "share: %.0f%%, %s)" % (100.0 * worst.error / worst.tolerance, worst.name))
  if np.isnan(failed.error):
    return 1, ("FAIL: %s (%s) is the first that is not finite (NaN or Inf)%s"
               % (failed.name, failed.what, "; a float16 gradient overflows at this loss "
                  "scale: try a lower --init_loss_scale" if failed.section == "gradient"
                  else ""))
  hint = ""
  if failed.section == "gradient" and failed.name in NEXT_SENTENCE_ROWS:
    # Untrained weights predict about 0.5 for every pair: the pairs' gradients cancel in
    # the sum, and what is left is small beside the rounding of each.
    hint = ("; an untrained model's next-sentence gradients can cancel out over a small "
            "batch, leaving little to compare: check with --train_batch_size=8 or more, or "
            "a trained --init_checkpoint")
  return 1, ("FAIL: %s (%s) is the first outside its tolerance: relative error %.2e > %.2e%s%s"
             % (failed.name, failed.what, failed.error, failed.tolerance,
                "; the rows before it are within theirs" if rows.index(failed) else "", hint))


def inputs_from_flags():
  """The checks a run makes on the same flags, then the config, the batch and the
  checkpoint prefix (None: fresh weights).

  Raises:
    ValueError: with the one-line message the user sees.
  """
  if not FLAGS.bert_config_file:
    raise ValueError("--bert_config_file is required; pass --bert_config_file=PATH/bert_config.json")
  bert_config = modeling.BertConfig.from_json_file(FLAGS.bert_config_file)
  for name in ("train_batch_size", "max_seq_length", "max_predictions_per_seq"):
    if getattr(FLAGS, name) < 1:
      raise ValueError("--%s=%d must be at least 1" % (name, getattr(FLAGS, name)))
  if FLAGS.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError("--max_seq_length=%d is above max_position_embeddings=%d of %s; lower "
                     "--max_seq_length or use a config with more positions"
                     % (FLAGS.max_seq_length, bert_config.max_position_embeddings,
                        FLAGS.bert_config_file))
  if FLAGS.max_predictions_per_seq > FLAGS.max_seq_length:
    raise ValueError("--max_predictions_per_seq=%d is above --max_seq_length=%d; lower it"
                     % (FLAGS.max_predictions_per_seq, FLAGS.max_seq_length))
  if not 1 <= FLAGS.init_loss_scale <= config.FLOAT32_MAX:
    raise ValueError("--init_loss_scale=%g must be at least 1 and finite"
                     % FLAGS.init_loss_scale)
  if not -1 <= FLAGS.inject_fault_layer < bert_config.num_hidden_layers:
    raise ValueError("--inject_fault_layer=%d: the model has layers 0 to %d; pass one of "
                     "them (-1: none)" % (FLAGS.inject_fault_layer,
                                          bert_config.num_hidden_layers - 1))
  init_checkpoint = None
  if FLAGS.init_checkpoint:
    init_checkpoint = checkpoints.resolve_checkpoint(FLAGS.init_checkpoint)
    checkpoints.check_config(init_checkpoint, bert_config,
                             "--bert_config_file=%s" % FLAGS.bert_config_file)
  seed = DEFAULT_SEED if FLAGS.seed is None else FLAGS.seed
  if FLAGS.input_files_dir:
    files = input_pipeline.list_record_files(FLAGS.input_files_dir, "--input_files_dir")
    try:
      packed = input_pipeline.training_layout(files[:1], FLAGS.max_seq_length,
                                              FLAGS.max_predictions_per_seq)[1] is not None
    except ValueError:  # packs of other lengths
      packed = True
    if packed:
      raise ValueError("%s holds packed records, but conformance compares a batch of "
                       "unpacked ones; pass the folder pack_records packed (its --input)"
                       % files[0])
    input_pipeline.check_record_files(files[:1], FLAGS.max_seq_length,
                                      FLAGS.max_predictions_per_seq,
                                      vocab_size=bert_config.vocab_size)
    batch = read_batch(files, FLAGS.train_batch_size, FLAGS.max_seq_length,
                       FLAGS.max_predictions_per_seq, bert_config.vocab_size)
    source = "the first %d records of %s" % (len(batch["input_ids"]), FLAGS.input_files_dir)
  else:
    batch = synthetic_batch(FLAGS.train_batch_size, FLAGS.max_seq_length,
                            FLAGS.max_predictions_per_seq, bert_config.vocab_size, seed)
    source = "a synthetic batch (seed %d; --input_files_dir reads records)" % seed
  return bert_config, batch, source, init_checkpoint, seed


def main(argv):
  if len(argv) > 1:
    errors.unexpected_arguments("conformance", argv[1:])
  tf.logging.set_verbosity(tf.logging.ERROR)
  tf.disable_v2_behavior()
  errors.take_stop_signals()
  try:
    return check_from_flags()
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM's errors.Terminated
    return errors.stopped_by_signal("conformance", e, "it writes nothing (the demo's cache "
                                    "keeps what it finished); run the same command again")
  except (ValueError, workdir.PrepareError) as e:
    errors.print_error("conformance", e)
    return 2
  except (EnvironmentError, tf.errors.OpError) as e:
    if not errors.is_file_error(e):
      raise
    errors.print_error("conformance", errors.os_error_message(e))
    return 2


def check_from_flags():
  """main's work: the device and inputs from the flags, both graphs, the table; returns
  the exit status (verdict's)."""
  log = lambda line: print("conformance: " + line)
  config.apply_presets()
  if config.is_demo():  # the demo's model and records, as its run trains them
    paths = demo.prepare(FLAGS.demo_cache_dir)
    for name in ("bert_config_file", "init_checkpoint", "input_files_dir"):
      if not FLAGS[name].present:
        setattr(FLAGS, name, paths[name])
  # As a run decides it: --use_fp16 and --manual_fp16 are --amp, --amp_dtype implies it.
  device = device_lib.detect_device(
      FLAGS.device, FLAGS.amp or FLAGS.use_fp16 or FLAGS.manual_fp16 or
      FLAGS.amp_dtype != "auto", FLAGS.amp_dtype)
  bert_config, batch, source, init_checkpoint, seed = inputs_from_flags()
  gpu = 0 if device.kind == "GPU" else None
  session_config = pretraining.session_config(FLAGS.intra_op_threads or os.cpu_count() or 1,
                                              FLAGS.inter_op_threads or 2, gpu, FLAGS.use_xla)
  name = device_lib.gpu_name(device.gpus[0], session_config) if gpu is not None else ""
  where = device_lib.device_line(device, ranks_lib.Ranks(), name)
  mask = batch["input_mask"]
  log("tested: %s%s; reference: the CPU, compute float32" % (
      where, ", XLA" if FLAGS.use_xla else ""))
  log("batch: %s: %d x %d, %d real tokens, %d predictions" % (
      source, mask.shape[0], mask.shape[1], int(mask.sum()),
      int(batch["masked_lm_weights"].sum())))
  log("weights: %s" % (init_checkpoint or "fresh (seed %d; --init_checkpoint loads a "
                                          "checkpoint)" % seed))
  if FLAGS.inject_fault_layer >= 0:
    log("injected fault: a second GELU after layer %d's feed-forward activation, in the "
        "tested graph only" % FLAGS.inject_fault_layer)
  rows, compute = check(bert_config, batch, device, session_config, init_checkpoint, seed,
                        FLAGS.use_xla, FLAGS.init_loss_scale, FLAGS.inject_fault_layer,
                        log=log)
  log("relative error = ||tested - reference|| / ||reference|| over the real tokens; "
      "tolerance from compute %s%s (bert_pretrain/conformance.py says how)" % (compute, ", loss scale %g" % FLAGS.init_loss_scale
                       if device.dtype == tf.float16 else ""))
  for line in format_table(rows):
    print(line)
  status, line = verdict(rows)
  log(line)
  return status


if __name__ == "__main__":
  run_pretraining.enable_cpu_xla(sys.argv)
  errors.run_main("conformance", main)
