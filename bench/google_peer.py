"""Google's own BERT training step, the benchmark's second peer (bench/benchmark.py).

google-research/bert as PyPI packages it, `bert-tensorflow==1.0.4` (its modeling.py,
optimization.py and run_pretraining.py under the package `bert`), used as it is:

  - modeling.BertModel;
  - run_pretraining.get_masked_lm_output and get_next_sentence_output, the masked-LM and
    next-sentence heads of Google's model_fn (imported from the package's
    run_pretraining.py; importing it defines its absl flags, which nothing here reads);
  - optimization.create_optimizer: AdamWeightDecayOptimizer, gradients clipped to global
    norm 1.0, the learning rate decaying linearly from LEARNING_RATE, no warm-up;

in a tf.compat.v1 Session, one batch held in memory and fed to placeholders. "amp" is
grappler's auto-mixed-precision rewrite, on a CPU oneDNN's bfloat16 one
(RewriterConfig.auto_mixed_precision_onednn_bfloat16, TensorFlow 2.9 and later): the graph
is built in float32 and the rewrite runs what it allows in bfloat16.

The one change: modeling.py imports `tensorflow.contrib.layers` for layer_norm, and
TensorFlow 2 has no contrib. install_contrib_shim() registers a module of that name
before modeling.py is imported, with layer_norm only, written after contrib's (same
variables LayerNorm/beta and LayerNorm/gamma, same epsilon 1e-12). Under TensorFlow 1.x the
real contrib is used.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import importlib.util
import os
import sys
import types

import numpy as np

PACKAGE = "bert-tensorflow==1.0.4"
HINT = ("Google's peer (google-research/bert's code) skipped: install it with "
        "`pip install %s`" % PACKAGE)
MODULES = ("modeling.py", "optimization.py", "run_pretraining.py")


def available():
  """Whether the package `bert` is google-research/bert's (bert-tensorflow)."""
  spec = importlib.util.find_spec("bert")
  if spec is None or not spec.submodule_search_locations:
    return False
  folder = list(spec.submodule_search_locations)[0]
  return all(os.path.exists(os.path.join(folder, name)) for name in MODULES)


def layer_norm(inputs, begin_norm_axis=1, begin_params_axis=-1, scope=None, reuse=None,
               trainable=True):
  """tf.contrib.layers.layer_norm (TensorFlow 1.15), the arguments modeling.py uses.

  Normalizes `inputs` over the axes from begin_norm_axis on, then scales by gamma and
  shifts by beta, both of the shape of inputs' axes from begin_params_axis on, in the
  variable scope `scope` (default "LayerNorm"): the variables are <scope>/beta (zeros)
  and <scope>/gamma (ones), in the global, model and trainable collections, and the
  variance epsilon is 1e-12 (1e-3 for float16), as contrib's.

  Args:
    inputs: float Tensor of known rank, at least 2.
    begin_norm_axis: first axis to normalize over; negative counts from the end.
    begin_params_axis: first axis of beta and gamma's shape; negative counts from the end.
    scope: (optional) variable scope name.
    reuse: (optional) reuse the scope's variables.
    trainable: whether beta and gamma are trainable.

  Returns:
    Tensor of the shape and dtype of inputs.

  Raises:
    ValueError: inputs' rank is unknown, or an axis is out of range.
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  with tf.variable_scope(scope, "LayerNorm", [inputs], reuse=reuse):
    inputs = tf.convert_to_tensor(inputs)
    shape = inputs.shape
    rank = shape.ndims
    if rank is None:
      raise ValueError("Inputs %s has undefined rank." % inputs.name)
    dtype = inputs.dtype.base_dtype
    if begin_norm_axis < 0:
      begin_norm_axis = rank + begin_norm_axis
    if begin_params_axis >= rank or begin_norm_axis >= rank:
      raise ValueError("begin_params_axis (%d) and begin_norm_axis (%d) must be < rank(inputs)"
                       " (%d)" % (begin_params_axis, begin_norm_axis, rank))
    params_shape = shape[begin_params_axis:]
    if not params_shape.is_fully_defined():
      raise ValueError("Inputs %s: shape[begin_params_axis:] is not fully defined: %s" % (
          inputs.name, params_shape))
    collections = [tf.GraphKeys.GLOBAL_VARIABLES, tf.GraphKeys.MODEL_VARIABLES]
    beta = tf.get_variable("beta", shape=params_shape, dtype=dtype,
                           initializer=tf.zeros_initializer(), collections=collections,
                           trainable=trainable)
    gamma = tf.get_variable("gamma", shape=params_shape, dtype=dtype,
                            initializer=tf.ones_initializer(), collections=collections,
                            trainable=trainable)
    mean, variance = tf.nn.moments(inputs, list(range(begin_norm_axis, rank)),
                                   keep_dims=True)
    epsilon = 1e-12 if dtype != tf.float16 else 1e-3
    outputs = tf.nn.batch_normalization(inputs, mean, variance, offset=beta, scale=gamma,
                                        variance_epsilon=epsilon)
    outputs.set_shape(shape)
    return outputs


def install_contrib_shim():
  """Registers `tensorflow.contrib.layers` with layer_norm when TensorFlow has no contrib.

  Returns:
    True if the shim is registered (TensorFlow 2), False under TensorFlow 1.x, whose own
    contrib modeling.py then imports.
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  if tf.__version__.startswith("1."):
    return False
  if getattr(sys.modules.get("tensorflow.contrib"), "IS_BENCH_SHIM", False):
    return True
  contrib = types.ModuleType("tensorflow.contrib")
  contrib.IS_BENCH_SHIM = True
  layers = types.ModuleType("tensorflow.contrib.layers")
  layers.layer_norm = layer_norm
  contrib.layers = layers
  sys.modules["tensorflow.contrib"] = contrib
  sys.modules["tensorflow.contrib.layers"] = layers
  return True


def rewrite_options_field(tf):
  """The RewriterConfig field of the oneDNN bfloat16 auto-mixed-precision rewrite."""
  fields = tf.ConfigProto().graph_options.rewrite_options.DESCRIPTOR.fields_by_name
  for name in ("auto_mixed_precision_onednn_bfloat16", "auto_mixed_precision_mkl"):
    if name in fields:
      return name
  return None


def random_batch(batch_size, seq_length, predictions, vocab_size, seed=0):
  """One batch of Google's pretraining features, name -> numpy array: random token ids,
  `predictions` distinct masked positions a sequence (never position 0, [CLS]) whose
  labels are the tokens there, two segments, random next-sentence labels."""
  rng = np.random.RandomState(seed)
  input_ids = rng.randint(5, vocab_size, size=(batch_size, seq_length)).astype(np.int32)
  segment_ids = np.zeros((batch_size, seq_length), np.int32)
  segment_ids[:, seq_length // 2:] = 1
  positions = np.stack([np.sort(rng.permutation(seq_length - 1)[:predictions] + 1)
                        for _ in range(batch_size)]).astype(np.int32)
  return {
      "input_ids": input_ids,
      "input_mask": np.ones((batch_size, seq_length), np.int32),
      "segment_ids": segment_ids,
      "masked_lm_positions": positions,
      "masked_lm_ids": np.take_along_axis(input_ids, positions, axis=1),
      "masked_lm_weights": np.ones((batch_size, predictions), np.float32),
      "next_sentence_labels": rng.randint(0, 2, size=(batch_size, 1)).astype(np.int32),
  }


class GoogleStep(object):
  """One graph and session of Google's training step; calling it runs one step.

  Built as run_pretraining.py's model_fn builds it for training (BertModel, the two
  heads, total loss = masked-LM + next-sentence, optimization.create_optimizer), fed
  one batch held in memory.
  """

  def __init__(self, config_dict, batch_size, seq_length, predictions, learning_rate,
               intra_threads, inter_threads, amp, num_train_steps=1000000):
    import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
    tf.disable_v2_behavior()
    self.shim = install_contrib_shim()
    from bert import modeling  # pylint: disable=g-import-not-at-top
    from bert import optimization  # pylint: disable=g-import-not-at-top
    from bert import run_pretraining  # pylint: disable=g-import-not-at-top
    batch = random_batch(batch_size, seq_length, predictions, config_dict["vocab_size"])
    self.graph = tf.Graph()
    with self.graph.as_default():
      features = {name: tf.placeholder(tf.as_dtype(value.dtype), value.shape, name=name)
                  for name, value in batch.items()}
      bert_config = modeling.BertConfig.from_dict(config_dict)
      model = modeling.BertModel(
          config=bert_config, is_training=True, input_ids=features["input_ids"],
          input_mask=features["input_mask"], token_type_ids=features["segment_ids"],
          use_one_hot_embeddings=False)
      masked_lm_loss, _, _ = run_pretraining.get_masked_lm_output(
          bert_config, model.get_sequence_output(), model.get_embedding_table(),
          features["masked_lm_positions"], features["masked_lm_ids"],
          features["masked_lm_weights"])
      next_sentence_loss, _, _ = run_pretraining.get_next_sentence_output(
          bert_config, model.get_pooled_output(), features["next_sentence_labels"])
      total_loss = masked_lm_loss + next_sentence_loss
      train_op = optimization.create_optimizer(
          total_loss, learning_rate, num_train_steps, None, False)
      self.fetches = [train_op, total_loss]
      init = tf.global_variables_initializer()
      self.graph.finalize()
    self.feed_dict = {features[name]: value for name, value in batch.items()}
    config = tf.ConfigProto(intra_op_parallelism_threads=intra_threads,
                            inter_op_parallelism_threads=inter_threads,
                            allow_soft_placement=True)
    self.rewrite = None
    if amp:
      self.rewrite = rewrite_options_field(tf)
      if self.rewrite is None:
        raise ValueError("amp: this TensorFlow (%s) has no oneDNN bfloat16 auto-mixed-"
                         "precision rewrite; use TensorFlow 2.9 or later, or fp32"
                         % tf.__version__)
      setattr(config.graph_options.rewrite_options, self.rewrite,
              type(config.graph_options.rewrite_options).ON)
    self.tf = tf
    self.session = tf.Session(graph=self.graph, config=config)
    self.session.run(init)
    self.loss = None

  def __call__(self):
    self.loss = float(self.session.run(self.fetches, feed_dict=self.feed_dict)[1])

  def bfloat16_ops(self):
    """Runs one step with the partition graphs returned and counts the ops that compute
    in bfloat16 (a "T" of bfloat16) in the graph the session really ran: 0 without a
    rewrite, most of the model's math with one."""
    tf = self.tf
    options = tf.RunOptions(output_partition_graphs=True)
    metadata = tf.RunMetadata()
    self.loss = float(self.session.run(self.fetches, feed_dict=self.feed_dict,
                                       options=options, run_metadata=metadata)[1])
    count = 0
    for graph in metadata.partition_graphs:
      for node in graph.node:
        if "T" in node.attr and node.attr["T"].type == tf.bfloat16.as_datatype_enum:
          count += 1
    return count
