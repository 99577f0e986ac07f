"""The BERT model, in TensorFlow 1.x graph code (its pretraining heads: heads.py).

Variable names and shapes are Google BERT's (bert/embeddings/word_embeddings,
bert/encoder/layer_0/attention/self/query/kernel, ..., cls/predictions/output_bias,
cls/seq_relationship/output_weights), so Google BERT checkpoints and the MLPerf
checkpoint model.ckpt-28252 load by name. The public API is Google's: BertConfig,
BertModel and its getters, get_assignment_map_from_checkpoint, and the functions the
model is made of (embedding_lookup, attention_layer, transformer_model, layer_norm, ...).

Variables are made with tf.get_variable and plain ops (no tf.layers, no Keras), which
works on TensorFlow 1.15 and on 2.x through tf.compat.v1. They are always float32;
with compute_type=tf.bfloat16 or tf.float16 a custom getter hands the layers a cast
copy, so the math runs in low precision while the master weights stay float32
(precision.py, which also holds the gradients written out by hand). Beside this file:
unpadded.py, the encoder on the real tokens only (BertModel's drop_padding);
dropout.py, dropout masks a resumed run can draw again; shapes.py, shapes, rows at
positions and the attention masks of packed rows.
"""

import collections
import copy
import math
import re

import tensorflow.compat.v1 as tf

from bert_pretrain.model import bert_config
from bert_pretrain.model import dropout as dropout_lib
from bert_pretrain.model import precision
from bert_pretrain.model import shapes

# Google's modeling.BertConfig, kept in a module of its own.
BertConfig = bert_config.BertConfig


# Google's helpers, under the names its modeling.py gives them.
get_shape_list = shapes.get_shape_list
assert_rank = shapes.assert_rank


class BertModel(object):
  """BERT: Bidirectional Encoder Representations from Transformers.

  Example:

  ```python
  input_ids = tf.constant([[31, 51, 99], [15, 5, 0]])
  input_mask = tf.constant([[1, 1, 1], [1, 1, 0]])
  token_type_ids = tf.constant([[0, 0, 1], [0, 2, 0]])
  config = modeling.BertConfig(vocab_size=32000, hidden_size=512,
    num_hidden_layers=8, num_attention_heads=8, intermediate_size=1024)
  model = modeling.BertModel(config=config, is_training=True,
    input_ids=input_ids, input_mask=input_mask, token_type_ids=token_type_ids)
  pooled_output = model.get_pooled_output()
  ```
  """

  def __init__(self,
               config,
               is_training,
               input_ids,
               input_mask=None,
               token_type_ids=None,
               use_one_hot_embeddings=False,
               scope=None,
               compute_type=tf.float32,
               masked_lm_positions=None,
               drop_padding=False,
               attention_per_sequence=False,
               dropout_seeds=None,
               packed=False,
               position_ids=None,
               cls_positions=None):
    """Constructor for BertModel.

    Args:
      config: `BertConfig` instance.
      is_training: bool. True applies dropout; False is the evaluation model.
      input_ids: int32 or int64 Tensor of shape [batch_size, seq_length].
      input_mask: (optional) int Tensor of shape [batch_size, seq_length]; 1 for real
        tokens, 0 for padding.
      token_type_ids: (optional) int Tensor of shape [batch_size, seq_length].
      use_one_hot_embeddings: bool. Look embeddings up with a one-hot matmul (faster on
        TPUs) instead of tf.gather.
      scope: (optional) variable scope. Defaults to "bert".
      compute_type: tf.float32, tf.float16 or tf.bfloat16: the type the layers compute
        in. Variables stay float32; outputs are returned in compute_type.
      masked_lm_positions: (optional) int Tensor of shape [batch_size,
        num_positions]. When given, the last layer is computed at the [CLS] tokens
        (cls_positions) and at these positions only, which is all that the pretraining
        heads read: its keys and values still come from every position, so these
        outputs are the full model's. get_sequence_output() then holds those
        num_sequences + num_positions rows of each row of the batch,
        get_masked_positions_output() the last num_positions.
      drop_padding: bool. The encoder's dense layers, layer norms and feed-forward run
        on the real tokens only (input_mask 1; unpadded.transformer_model), the
        attention on every position (or see attention_per_sequence): the same outputs
        at the real tokens for fewer FLOPs. At padding positions the encoder's outputs
        are other rows' values; a sequence without real tokens (input_mask all 0) is not
        computed at all.
      attention_per_sequence: bool. With drop_padding, the attention too runs on the
        real tokens only, sequence by sequence (unpadded.transformer_model's): faster
        on a CPU at sequence 512 (pretraining.attends_per_sequence).
      dropout_seeds: (optional) DropoutSeeds: every dropout mask is then a function
        of its seed, its site in the model and its position (a resumed run draws the
        masks of the uninterrupted one). None: masks from stateful random ops, which a
        new process draws anew.
      packed: bool. Rows of packed sequences (records.py): input_mask holds each
        token's sequence index (1, 2, ...; 0 on padding); attention stays within each.
      position_ids: (optional) int Tensor [batch_size, seq_length], each token's
        position in its sequence (a packed record's `positions`); default 0, 1, ...
      cls_positions: (optional) int Tensor [batch_size, num_sequences], each
        sequence's [CLS] position (next_sentence_positions); default [0].

    Raises:
      ValueError: The config is invalid or one of the input tensor shapes is invalid.
    """
    config = copy.deepcopy(config)
    if not is_training:
      config.hidden_dropout_prob = 0.0
      config.attention_probs_dropout_prob = 0.0

    (batch_size, seq_length) = check_inputs(config, input_ids, packed and (
        input_mask, position_ids, cls_positions))
    if input_mask is None:
      input_mask = tf.ones(shape=[batch_size, seq_length], dtype=tf.int32)
    if token_type_ids is None:
      token_type_ids = tf.zeros(shape=[batch_size, seq_length], dtype=tf.int32)

    # A fixed name, not default_name: a second model in the graph (the evaluation
    # model) must find the same variables instead of making "bert_1".
    with tf.variable_scope(scope or "bert",
                           custom_getter=precision.get_custom_getter(compute_type)):
      (self.embedding_output, self.embedding_table) = embeddings(
          config, input_ids, token_type_ids, use_one_hot_embeddings, dropout_seeds,
          position_ids)
      # Lookups and the first layer norm run in float32; the encoder in compute_type.
      self.embedding_output = tf.cast(self.embedding_output, compute_type)
      if cls_positions is None:
        cls_positions = tf.zeros([batch_size, 1], tf.int32)
      cls_positions = tf.cast(cls_positions, tf.int32)
      if masked_lm_positions is not None:
        masked_lm_positions = tf.cast(masked_lm_positions, tf.int32)
      self.all_encoder_layers = encoder(config, self.embedding_output, input_ids, input_mask,
                                        masked_lm_positions, drop_padding,
                                        attention_per_sequence, dropout_seeds, packed,
                                        cls_positions)

      self.sequence_output = self.all_encoder_layers[-1]
      (first_token_tensor, self.masked_positions_output) = cls_and_masked_rows(
          self.sequence_output, cls_positions, masked_lm_positions is not None)
      # The "pooler" takes the hidden state of the first token ([CLS]) through a dense
      # tanh layer; the next-sentence head reads it.
      with tf.variable_scope("pooler"):
        self.pooled_output = dense_layer(
            first_token_tensor, config.hidden_size, "dense", activation=tf.tanh,
            initializer_range=config.initializer_range)

  def get_pooled_output(self):
    """float Tensor of shape [batch_size, hidden_size]: the pooled [CLS] state
    ([batch_size * num_sequences, hidden_size] with cls_positions)."""
    return self.pooled_output

  def get_sequence_output(self):
    """float Tensor of shape [batch_size, seq_length, hidden_size]: the final encoder
    layer ([batch_size, num_sequences + num_positions, hidden_size] with
    masked_lm_positions: the [CLS] tokens', then the masked positions'). With
    drop_padding, padding positions hold other rows' values."""
    return self.sequence_output

  def get_masked_positions_output(self):
    """float Tensor of shape [batch_size * num_positions, hidden_size]: the final
    encoder layer at masked_lm_positions, in their order (None without them)."""
    return self.masked_positions_output

  def get_all_encoder_layers(self):
    """List of float Tensors [batch_size, seq_length, hidden_size], one per layer (the
    last one as get_sequence_output's). With drop_padding, padding positions hold
    other rows' values."""
    return self.all_encoder_layers

  def get_embedding_output(self):
    """float Tensor of shape [batch_size, seq_length, hidden_size]: word + position +
    token type embeddings after layer norm and dropout, the input of the encoder."""
    return self.embedding_output

  def get_embedding_table(self):
    """float Tensor of shape [vocab_size, hidden_size]: the word embedding table."""
    return self.embedding_table


def check_inputs(config, input_ids, packed_inputs=None):
  """BertModel's checks: the sequence fits the position table, a packed batch comes
  with its (input_mask, position_ids, cls_positions). Returns (batch_size, seq_length).

  Raises:
    ValueError: with what to change.
  """
  (batch_size, seq_length) = get_shape_list(input_ids, expected_rank=2)
  if isinstance(seq_length, int) and seq_length > config.max_position_embeddings:
    raise ValueError("sequence length %d is longer than max_position_embeddings %d; lower "
                     "--max_seq_length or use a config with more positions"
                     % (seq_length, config.max_position_embeddings))
  if packed_inputs and any(t is None for t in packed_inputs):
    raise ValueError("BertModel(packed=True) needs the packed record's input_mask, "
                     "position_ids (its positions) and cls_positions (its "
                     "next_sentence_positions)")
  return batch_size, seq_length


def cls_and_masked_rows(sequence_output, cls_positions, at_outputs):
  """The last layer's rows at the [CLS] tokens and at the masked positions.

  Args:
    sequence_output: float Tensor [batch_size, length, hidden_size]: every position,
      or (at_outputs) the num_sequences [CLS] rows then the masked positions' rows.
    cls_positions: int32 Tensor [batch_size, num_sequences].
    at_outputs: whether sequence_output holds the output positions only.

  Returns:
    (cls_rows, masked_rows): float Tensors [batch_size * num_sequences, hidden_size]
    and [batch_size * num_positions, hidden_size] (None unless at_outputs).
  """
  (_, length, hidden_size) = get_shape_list(sequence_output, expected_rank=3)
  num_sequences = get_shape_list(cls_positions, expected_rank=2)[1]
  rows = tf.reshape(sequence_output, [-1, hidden_size])
  if not at_outputs:
    return tf.gather(rows, shapes.flat_positions(cls_positions, length)), None
  return (tf.reshape(sequence_output[:, :num_sequences, :], [-1, hidden_size]),
          tf.reshape(sequence_output[:, num_sequences:, :], [-1, hidden_size]))


def embeddings(config, input_ids, token_type_ids, use_one_hot_embeddings=False,
               dropout_seeds=None, position_ids=None):
  """BERT's embeddings (scope "embeddings"): word + token type + position, layer norm
  and dropout, in float32.

  Args:
    config: BertConfig.
    input_ids: int Tensor [batch_size, seq_length].
    token_type_ids: int Tensor [batch_size, seq_length].
    use_one_hot_embeddings: bool, a one-hot matmul instead of tf.gather.
    dropout_seeds: (optional) DropoutSeeds.
    position_ids: (optional) int Tensor [batch_size, seq_length]; default 0, 1, ...

  Returns:
    (output, table): float32 Tensors [batch_size, seq_length, hidden_size] and
    [vocab_size, hidden_size].
  """
  with tf.variable_scope("embeddings"):
    (output, table) = embedding_lookup(
        input_ids=input_ids,
        vocab_size=config.vocab_size,
        embedding_size=config.hidden_size,
        initializer_range=config.initializer_range,
        word_embedding_name="word_embeddings",
        use_one_hot_embeddings=use_one_hot_embeddings)

    # Add positional embeddings and token type embeddings, then layer
    # normalize and perform dropout.
    output = embedding_postprocessor(
        input_tensor=output,
        use_token_type=True,
        token_type_ids=token_type_ids,
        token_type_vocab_size=config.type_vocab_size,
        token_type_embedding_name="token_type_embeddings",
        use_position_embeddings=True,
        position_embedding_name="position_embeddings",
        initializer_range=config.initializer_range,
        max_position_embeddings=config.max_position_embeddings,
        dropout_prob=config.hidden_dropout_prob,
        dropout_seeds=dropout_seeds,
        position_ids=position_ids)
  return output, table


def encoder(config, embedding_output, input_ids, input_mask, masked_lm_positions=None,
            drop_padding=False, attention_per_sequence=False, dropout_seeds=None,
            packed=False, cls_positions=None):
  """BERT's encoder (scope "encoder"): the plain transformer_model, or with drop_padding
  the unpadded one (unpadded.transformer_model); BertModel's arguments of those names.

  Args:
    config: BertConfig.
    embedding_output: float Tensor [batch_size, seq_length, hidden_size] in the compute
      type.
    input_ids: int Tensor [batch_size, seq_length].
    input_mask: int Tensor [batch_size, seq_length].
    masked_lm_positions: (optional) int32 Tensor [batch_size, num_positions].
    drop_padding, attention_per_sequence, dropout_seeds, packed: as BertModel's.
    cls_positions: (optional) int32 Tensor [batch_size, num_sequences]; default [0].

  Returns:
    List of float Tensors, one per layer: [batch_size, seq_length, hidden_size], or
    [batch_size, num_sequences + num_positions, hidden_size] with masked_lm_positions.
  """
  with tf.variable_scope("encoder"):
    if packed:
      attention_mask = shapes.create_attention_mask_from_sequence_ids(input_mask,
                                                               embedding_output.dtype)
    else:
      attention_mask = create_attention_mask_from_input_mask(
          input_ids, input_mask, embedding_output.dtype)
    if cls_positions is None:
      cls_positions = tf.zeros_like(input_mask[:, :1], tf.int32)
    output_positions = None
    if masked_lm_positions is not None:
      output_positions = tf.concat([cls_positions, masked_lm_positions], axis=1)
    layers = dict(
        input_tensor=embedding_output,
        attention_mask=attention_mask,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        intermediate_act_fn=get_activation(config.hidden_act),
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        initializer_range=config.initializer_range,
        do_return_all_layers=True,
        output_positions=output_positions,
        dropout_seeds=dropout_seeds)
    if drop_padding:
      # Imported here: the fast path builds on this module's layers.
      from bert_pretrain.model import unpadded  # pylint: disable=g-import-not-at-top
      return unpadded.transformer_model(
          input_mask=input_mask, attention_per_sequence=attention_per_sequence,
          max_sequences=cls_positions.shape.as_list()[1] if packed else 1, **layers)
    return transformer_model(**layers)


gelu = precision.gelu  # Google's modeling.gelu


ACTIVATIONS = dict(zip(bert_config.ACTIVATION_NAMES, (gelu, tf.nn.relu, tf.tanh, None)))


def get_activation(activation_string):
  """Maps bert_config.json's hidden_act string to a Python function.

  Args:
    activation_string: "gelu", "relu", "tanh" or "linear" (case insensitive), or None.

  Returns:
    The activation function, or None for "linear" / None.

  Raises:
    ValueError: the string is not a known activation.
  """
  if activation_string is None or not isinstance(activation_string, str):
    return activation_string
  act = activation_string.lower()
  if act not in ACTIVATIONS:
    raise ValueError("Unsupported activation %r; use one of %s" % (act, sorted(ACTIVATIONS)))
  return ACTIVATIONS[act]


def get_assignment_map_from_checkpoint(tvars, init_checkpoint):
  """Maps the graph's variables to the checkpoint variables of the same name and shape.

  Args:
    tvars: list of tf.Variable to look for.
    init_checkpoint: checkpoint prefix (as tf.train.latest_checkpoint returns it).

  Returns:
    (assignment_map, initialized_variable_names): an OrderedDict checkpoint name ->
    graph variable name, and a dict of the graph names found (plus name + ":0").

  Raises:
    ValueError: a variable of the checkpoint has another shape than the graph's; the
      message names the variable and both shapes.
  """
  name_to_variable = collections.OrderedDict()
  for var in tvars:
    name = var.name
    m = re.match("^(.*):\\d+$", name)
    if m is not None:
      name = m.group(1)
    name_to_variable[name] = var

  assignment_map = collections.OrderedDict()
  initialized_variable_names = {}
  for (name, shape) in tf.train.list_variables(init_checkpoint):
    if name not in name_to_variable:
      continue
    graph_shape = name_to_variable[name].shape.as_list()
    if list(shape) != graph_shape:
      raise ValueError("checkpoint %s: variable %s has shape %s but the model needs %s; use a "
                       "--bert_config_file that matches the checkpoint"
                       % (init_checkpoint, name, list(shape), graph_shape))
    assignment_map[name] = name
    initialized_variable_names[name] = 1
    initialized_variable_names[name + ":0"] = 1

  return (assignment_map, initialized_variable_names)


def layer_norm(input_tensor, name=None):
  """Layer normalization over the last axis, with variables `name`/beta and `name`/gamma.

  The statistics are computed in float32 whatever the input type, since a low-precision
  variance loses the small differences that layer norm divides by. The gradient is
  normalize's, written out.
  """
  with tf.variable_scope(name, default_name="LayerNorm"):
    gamma, beta = layer_norm_variables(input_tensor.shape.as_list()[-1])
    normalized = precision.normalize(tf.cast(input_tensor, tf.float32), gamma, beta)
    return tf.cast(normalized, input_tensor.dtype)


def layer_norm_variables(width):
  """Layer norm's variables beta and gamma [width] in the current scope, as float32
  Tensors (gamma, beta)."""
  beta = tf.get_variable("beta", shape=[width], initializer=tf.zeros_initializer())
  gamma = tf.get_variable("gamma", shape=[width], initializer=tf.ones_initializer())
  return tf.convert_to_tensor(gamma), tf.convert_to_tensor(beta)


def dropout_add_layer_norm(input_tensor, residual, dropout_prob, name=None, seeds=None):
  """The end of a Transformer sublayer: layer_norm(dropout(input_tensor) + residual).

  Args:
    input_tensor: float Tensor [rows, width], the sublayer's output projection.
    residual: float Tensor [rows, width], the sublayer's input.
    dropout_prob: float, the dropout probability of `input_tensor`.
    name: (optional) variable scope of the layer norm (default "LayerNorm").
    seeds: (optional) DropoutSeeds of the mask (see dropout).

  Returns:
    (output, matmul_input): float Tensors [rows, width], the output in the type of
    `residual`, computed in elementwise_dtype of `input_tensor`'s type, and the same in
    `input_tensor`'s type (the next dense layer's input). For a bfloat16 input, a float32
    residual and a dropout mask (training, with `seeds` on TensorFlow 1.15) both come from
    precision.fused_dropout_add_normalize where the kernels are built.
  """
  fused = precision.fused_kernels(input_tensor.dtype)
  if fused is not None and residual.dtype == tf.float32:
    keep = dropout_lib.keep_mask(tf.shape(input_tensor), dropout_prob, seeds)
    if keep is not None:
      with tf.variable_scope(name, default_name="LayerNorm"):
        gamma, beta = layer_norm_variables(input_tensor.shape.as_list()[-1])
        return precision.fused_dropout_add_normalize(input_tensor, residual, keep,
                                                     dropout_prob, gamma, beta, fused)
  compute_type = precision.elementwise_dtype(input_tensor.dtype)
  summed = (dropout_lib.dropout(tf.cast(input_tensor, compute_type), dropout_prob, seeds)
            + tf.cast(residual, compute_type))
  output = tf.cast(layer_norm(summed, name), residual.dtype)
  return output, tf.cast(output, input_tensor.dtype)


def layer_norm_and_dropout(input_tensor, dropout_prob, name=None, seeds=None):
  """Runs layer normalization followed by dropout (seeds: see dropout)."""
  output_tensor = layer_norm(input_tensor, name)
  output_tensor = dropout_lib.dropout(output_tensor, dropout_prob, seeds)
  return output_tensor


def create_initializer(initializer_range=0.02):
  """Creates a `truncated_normal_initializer` with the given range."""
  return tf.truncated_normal_initializer(stddev=initializer_range)


def dense_layer(input_tensor, units, name, activation=None, initializer_range=0.02):
  """A fully connected layer with variables `name`/kernel and `name`/bias.

  Args:
    input_tensor: float Tensor of shape [..., input_width].
    units: output width.
    name: variable scope of the layer ("dense", "query", ...).
    activation: (optional) activation function applied to the output.
    initializer_range: stddev of the kernel initializer.

  Returns:
    float Tensor of shape [..., units], in the type of `input_tensor`. Its gradient's
    two products are gradient_matmul's.
  """
  with tf.variable_scope(name):
    kernel, bias = dense_variables(input_tensor.shape.as_list()[-1], units,
                                   input_tensor.dtype, initializer_range)
    output = precision.bias_add(precision.dense_matmul(input_tensor, kernel), bias)
    if activation is not None:
      output = activation(output)
    return output


def dense_variables(input_width, units, dtype, initializer_range=0.02):
  """The variables kernel [input_width, units] and bias [units] of the current scope."""
  kernel = tf.get_variable("kernel", [input_width, units], dtype=dtype,
                           initializer=create_initializer(initializer_range))
  bias = tf.get_variable("bias", [units], dtype=dtype, initializer=tf.zeros_initializer())
  return kernel, bias


def embedding_lookup(input_ids,
                     vocab_size,
                     embedding_size=128,
                     initializer_range=0.02,
                     word_embedding_name="word_embeddings",
                     use_one_hot_embeddings=False):
  """Looks up word embeddings for an id tensor.

  Args:
    input_ids: int Tensor of shape [batch_size, seq_length] containing word ids.
    vocab_size: int. Size of the embedding vocabulary.
    embedding_size: int. Width of the word embeddings.
    initializer_range: float. Embedding initialization range.
    word_embedding_name: string. Name of the embedding table.
    use_one_hot_embeddings: bool. If True, use a one-hot matmul for the lookup.

  Returns:
    float Tensor of shape [batch_size, seq_length, embedding_size], and the embedding
    table of shape [vocab_size, embedding_size].
  """
  embedding_table = tf.get_variable(
      name=word_embedding_name,
      shape=[vocab_size, embedding_size],
      initializer=create_initializer(initializer_range))

  if use_one_hot_embeddings:
    one_hot_input_ids = tf.one_hot(input_ids, depth=vocab_size,
                                   dtype=embedding_table.dtype.base_dtype)
    output = tf.tensordot(one_hot_input_ids, embedding_table, axes=1)
  else:
    output = tf.gather(embedding_table, input_ids)
  return (output, embedding_table)


def embedding_postprocessor(input_tensor,
                            use_token_type=False,
                            token_type_ids=None,
                            token_type_vocab_size=16,
                            token_type_embedding_name="token_type_embeddings",
                            use_position_embeddings=True,
                            position_embedding_name="position_embeddings",
                            initializer_range=0.02,
                            max_position_embeddings=512,
                            dropout_prob=0.1,
                            dropout_seeds=None,
                            position_ids=None):
  """Adds token type and position embeddings to the word embeddings, then layer norm
  and dropout.

  Args:
    input_tensor: float Tensor of shape [batch_size, seq_length, embedding_size].
    use_token_type: bool. Whether to add embeddings for `token_type_ids`.
    token_type_ids: (optional) int Tensor of shape [batch_size, seq_length].
    token_type_vocab_size: int. The vocabulary size of `token_type_ids`.
    token_type_embedding_name: string. The name of the token type embedding table.
    use_position_embeddings: bool. Whether to add position embeddings.
    position_embedding_name: string. The name of the position embedding table.
    initializer_range: float. Range of the weight initialization.
    max_position_embeddings: int. Rows of the position table; seq_length must not exceed it.
    dropout_prob: float. Dropout probability applied to the final output tensor.
    dropout_seeds: (optional) DropoutSeeds of its mask (see dropout).
    position_ids: (optional) int Tensor [batch_size, seq_length], each token's position
      (packed rows restart at each sequence); default 0, 1, ..., seq_length - 1.

  Returns:
    float Tensor with the same shape as `input_tensor`.
  """
  input_shape = get_shape_list(input_tensor, expected_rank=3)
  seq_length = input_shape[1]
  width = input_shape[2]

  output = input_tensor
  if use_token_type:
    if token_type_ids is None:
      raise ValueError("`token_type_ids` must be specified if `use_token_type` is True.")
    token_type_table = tf.get_variable(
        name=token_type_embedding_name,
        shape=[token_type_vocab_size, width],
        initializer=create_initializer(initializer_range))
    # The type vocabulary is tiny, so a one-hot matmul is faster than a gather.
    one_hot_ids = tf.one_hot(token_type_ids, depth=token_type_vocab_size,
                             dtype=token_type_table.dtype.base_dtype)
    output += tf.tensordot(one_hot_ids, token_type_table, axes=1)

  if use_position_embeddings:
    full_position_embeddings = tf.get_variable(
        name=position_embedding_name,
        shape=[max_position_embeddings, width],
        initializer=create_initializer(initializer_range))
    if position_ids is None:
      # Positions 0..seq_length-1: a slice is the lookup.
      position_embeddings = tf.slice(full_position_embeddings, [0, 0], [seq_length, -1])
      output += tf.expand_dims(position_embeddings, 0)
    else:
      output += tf.gather(full_position_embeddings, position_ids)

  output = layer_norm_and_dropout(output, dropout_prob, seeds=dropout_seeds)
  return output


def create_attention_mask_from_input_mask(from_tensor, to_mask, dtype=tf.float32):
  """Creates the 3D attention mask [batch_size, from_seq_length, to_seq_length].

  Args:
    from_tensor: Tensor of shape [batch_size, from_seq_length, ...].
    to_mask: int Tensor of shape [batch_size, to_seq_length].
    dtype: type of the returned mask.

  Returns:
    Tensor of shape [batch_size, 1, to_seq_length]: 1 where a position may be attended
    to. It broadcasts over the from positions, which all share the same mask.
  """
  del from_tensor  # Kept for Google's signature; every query row shares one mask.
  return tf.cast(tf.expand_dims(to_mask, 1), dtype)


def attention_layer(from_tensor,
                    to_tensor,
                    attention_mask=None,
                    num_attention_heads=1,
                    size_per_head=512,
                    query_act=None,
                    key_act=None,
                    value_act=None,
                    attention_probs_dropout_prob=0.0,
                    initializer_range=0.02,
                    batch_size=None,
                    from_seq_length=None,
                    to_seq_length=None,
                    dropout_seeds=None):
  """Multi-headed attention from `from_tensor` to `to_tensor`.

  The query, key and value projections of the flattened [batch_size * seq_length,
  width] input are one matmul (projected_rows; two when from_tensor is not to_tensor),
  reshaped to [batch_size, num_heads, seq_length, size_per_head] so that all heads' dot
  products are one batched matmul, scaled by 1/sqrt(size_per_head) (through the query
  kernel), masked (masked positions get -10000 before the softmax) and softmaxed; the
  probabilities weight the values, and the heads are concatenated back to
  [batch_size * from_seq_length, num_heads * size].

  Args:
    from_tensor: float Tensor of shape [batch_size * from_seq_length, from_width].
    to_tensor: float Tensor of shape [batch_size * to_seq_length, to_width].
    attention_mask: (optional) Tensor of shape [batch_size, 1 or from_seq_length,
      to_seq_length], 1 where attention is allowed, 0 where not.
    num_attention_heads: int. Number of attention heads.
    size_per_head: int. Size of each attention head.
    query_act: (optional) Activation function for the query transform.
    key_act: (optional) Activation function for the key transform.
    value_act: (optional) Activation function for the value transform.
    attention_probs_dropout_prob: (optional) float. Dropout on the attention probabilities.
    initializer_range: float. Range of the weight initializer.
    batch_size: int. Batch size of the flattened inputs.
    from_seq_length: int. Sequence length of `from_tensor`.
    to_seq_length: int. Sequence length of `to_tensor`.
    dropout_seeds: (optional) DropoutSeeds of the probabilities' masks (see dropout).

  Returns:
    float Tensor of shape [batch_size * from_seq_length, num_attention_heads * size_per_head].

  Raises:
    ValueError: the tensors are not rank 2 or the lengths are not given.
  """
  check_attention_inputs(from_tensor, to_tensor, batch_size, from_seq_length, to_seq_length)
  projected = project_attention(from_tensor, to_tensor, num_attention_heads, size_per_head,
                                query_act, key_act, value_act, initializer_range)
  return attention_context(projected, projected.queries, projected.keys_values, batch_size,
                           from_seq_length, to_seq_length, attention_mask,
                           attention_probs_dropout_prob, dropout_seeds)


def check_attention_inputs(from_tensor, to_tensor, batch_size, from_seq_length,
                           to_seq_length):
  """Raises ValueError unless the inputs are rank 2 and their lengths are given."""
  get_shape_list(from_tensor, expected_rank=2)
  get_shape_list(to_tensor, expected_rank=2)
  if batch_size is None or from_seq_length is None or to_seq_length is None:
    raise ValueError("batch_size, from_seq_length and to_seq_length must be given for "
                     "rank 2 inputs")


# The projections of an attention layer (project_attention): the query rows and the key
# and value rows (one Tensor when the layer attends to its own input), the projected_rows
# lists of each, and the heads.
ProjectedAttention = collections.namedtuple("ProjectedAttention", [
    "queries", "keys_values", "query", "to_projections", "self_attention",
    "num_attention_heads", "size_per_head"])


def project_attention(from_tensor, to_tensor, num_attention_heads, size_per_head,
                      query_act=None, key_act=None, value_act=None, initializer_range=0.02):
  """The query, key and value projections of an attention layer's inputs (variables
  query/, key/, value/), as one matmul when from_tensor is to_tensor.

  Returns:
    ProjectedAttention: queries float [from rows, N * H] (or, when from_tensor is
    to_tensor, keys_values itself), keys_values float [to rows, 2 or 3 x N * H].
  """
  scale = 1.0 / math.sqrt(float(size_per_head))
  query = [("query", query_act, scale)]
  key_value = [("key", key_act, 1.0), ("value", value_act, 1.0)]
  units = num_attention_heads * size_per_head
  if from_tensor is to_tensor:
    # One matmul for the three projections; `queries` and `keys_values` are one Tensor.
    queries = keys_values = projected_rows(from_tensor, query + key_value, units,
                                           initializer_range)
    return ProjectedAttention(queries, keys_values, query, query + key_value, True,
                              num_attention_heads, size_per_head)
  queries = projected_rows(from_tensor, query, units, initializer_range)
  keys_values = projected_rows(to_tensor, key_value, units, initializer_range)
  return ProjectedAttention(queries, keys_values, query, key_value, False,
                            num_attention_heads, size_per_head)


def attention_context(projected, query_rows, key_value_rows, batch, from_length, to_length,
                      mask, dropout_prob, seeds=None):
  """The attention of `batch` sequences over projected rows (project_attention's, or
  rows taken from them).

  Returns:
    float Tensor [batch * from_length, N * H].
  """
  heads = (projected.num_attention_heads, projected.size_per_head)
  # `query_layer` = [B, N, F, H], `key_layer`, `value_layer` = [B, N, T, H]
  split = split_heads(key_value_rows, batch, to_length, projected.to_projections, *heads)
  if projected.self_attention:
    query_layer, key_layer, value_layer = split
  else:
    key_layer, value_layer = split
    (query_layer,) = split_heads(query_rows, batch, from_length, projected.query, *heads)
  context_layer = attend(query_layer, key_layer, value_layer, mask, dropout_prob, seeds)
  # `context_layer` = [B, N, F, H] -> [B, F, N, H] -> [B*F, N*H]
  context_layer = tf.transpose(context_layer, [0, 2, 1, 3])
  return tf.reshape(context_layer, [-1, heads[0] * heads[1]])


def attend(query_layer, key_layer, value_layer, attention_mask, dropout_prob, seeds=None):
  """softmax(query key^T + mask) value, with dropout on the probabilities.

  Args:
    query_layer: float Tensor [B, N, F, H], scaled by 1/sqrt(H).
    key_layer, value_layer: float Tensors [B, N, T, H].
    attention_mask: (optional) Tensor [B, 1 or F, T], 1 where attention is allowed.
    dropout_prob: float.
    seeds: (optional) DropoutSeeds of the mask (see dropout).

  Returns:
    float Tensor [B, N, F, H], in the type of the inputs.
  """
  # `attention_scores` = [B, N, F, T]
  attention_scores = tf.matmul(query_layer, key_layer, transpose_b=True)

  # The mask, softmax and dropout compute in float32 when the matmuls are bfloat16
  # (dropped_attention adds the mask itself: its fused kernel reads bfloat16 scores).
  compute_type = attention_scores.dtype
  adder = None
  if attention_mask is not None:
    # `attention_mask` = [B, 1, 1 or F, T]
    attention_mask = tf.expand_dims(attention_mask, axis=[1])
    adder = (1.0 - tf.cast(attention_mask, precision.elementwise_dtype(compute_type))) * -10000.0

  keep = dropout_lib.keep_mask(tf.shape(attention_scores), dropout_prob, seeds)
  if keep is not None:
    return precision.dropped_attention(attention_scores, value_layer, keep, dropout_prob,
                                       adder)
  attention_scores = tf.cast(attention_scores, precision.elementwise_dtype(compute_type))
  if adder is not None:
    attention_scores += adder
  attention_probs = precision.softmax(attention_scores, compute_type)
  attention_probs = dropout_lib.dropout(attention_probs, dropout_prob, seeds)
  attention_probs = tf.cast(attention_probs, compute_type)
  return tf.matmul(attention_probs, value_layer)


def projected_rows(input_tensor, projections, units, initializer_range):
  """Dense projections of one input (query, key, value) as one matmul.

  All projections' kernels side by side; their variables stay Google's (`name`/kernel,
  `name`/bias). A scale (the query's 1/sqrt(size_per_head)) multiplies the kernel and
  bias when the projection has no activation: the [width, width] kernel rather than
  the [rows, width] output; split_heads applies the activations.

  Args:
    input_tensor: float Tensor [rows, width].
    projections: list of (name, activation or None, scale).
    units: int, the width of each projection (num_heads * size_per_head).
    initializer_range: stddev of the kernel initializer.

  Returns:
    float Tensor [rows, len(projections) * units].
  """
  width = input_tensor.shape.as_list()[-1]
  kernels, biases = [], []
  for name, activation, scale in projections:
    with tf.variable_scope(name):
      kernel, bias = dense_variables(width, units, input_tensor.dtype, initializer_range)
      if activation is None and scale != 1.0:
        kernel, bias = kernel * scale, bias * scale
    kernels.append(kernel)
    biases.append(bias)
  with tf.name_scope("_".join(name for name, _, _ in projections)):
    if len(projections) > 1:
      kernel, bias = tf.concat(kernels, axis=1), tf.concat(biases, axis=0)
    return precision.bias_add(precision.dense_matmul(input_tensor, kernel), bias)


def split_heads(rows, batch_size, seq_length, projections, num_heads, size_per_head):
  """projected_rows' output split into attention heads, one Tensor per projection.

  Args:
    rows: float Tensor [batch_size * seq_length, len(projections) * num_heads *
      size_per_head].
    batch_size: int; seq_length: int, or -1 for rows / batch_size.
    projections: projected_rows' list of (name, activation or None, scale).
    num_heads, size_per_head: ints.

  Returns:
    list of float Tensors [batch_size, num_heads, seq_length, size_per_head].
  """
  rows = tf.reshape(rows, [batch_size, seq_length, len(projections), num_heads,
                           size_per_head])
  # Splitting the first axis is free: each part is a slice of the one buffer.
  heads = tf.split(tf.transpose(rows, [2, 0, 3, 1, 4]), len(projections), axis=0)
  outputs = []
  for (_, activation, scale), head in zip(projections, heads):
    head = tf.squeeze(head, axis=0)
    if activation is not None:
      head = activation(head)
      if scale != 1.0:
        head *= scale
    outputs.append(head)
  return outputs


def transformer_model(input_tensor,
                      attention_mask=None,
                      hidden_size=768,
                      num_hidden_layers=12,
                      num_attention_heads=12,
                      intermediate_size=3072,
                      intermediate_act_fn=gelu,
                      hidden_dropout_prob=0.1,
                      attention_probs_dropout_prob=0.1,
                      initializer_range=0.02,
                      do_return_all_layers=False,
                      output_positions=None,
                      dropout_seeds=None):
  """The Transformer encoder of "Attention is All You Need" as BERT uses it (post-LN).

  Every position of every sequence is computed; unpadded.transformer_model computes the
  real tokens only, with the same outputs there.

  Args:
    input_tensor: float Tensor of shape [batch_size, seq_length, hidden_size].
    attention_mask: (optional) Tensor of shape [batch_size, 1 or seq_length, seq_length],
      1 where attention is allowed.
    hidden_size: int. Hidden size of the Transformer.
    num_hidden_layers: int. Number of layers (blocks) in the Transformer.
    num_attention_heads: int. Number of attention heads in the Transformer.
    intermediate_size: int. The size of the "intermediate" (a.k.a., feed forward) layer.
    intermediate_act_fn: function. The non-linear activation of the intermediate layer.
    hidden_dropout_prob: float. Dropout probability for the hidden layers.
    attention_probs_dropout_prob: float. Dropout probability of the attention probabilities.
    initializer_range: float. Range of the initializer (stddev of truncated normal).
    do_return_all_layers: Whether to also return all layers or just the final layer.
    output_positions: (optional) int32 Tensor of shape [batch_size, num_outputs]: the
      positions of each sequence at which the final layer is computed. Its keys and
      values come from every position, its queries, output projection, feed-forward
      and layer norms run at these only (the pretraining heads read no others).
    dropout_seeds: (optional) DropoutSeeds of every dropout mask, drawn in the order
      of the layers (see dropout).

  Returns:
    float Tensor of shape [batch_size, seq_length, hidden_size], the final hidden layer,
    or the list of all layers' outputs when do_return_all_layers, in the type of
    `input_tensor`. With output_positions the final layer's is [batch_size,
    num_outputs, hidden_size].

  Raises:
    ValueError: A Tensor shape or parameter is invalid.
  """
  (batch_size, seq_length, compute_type, prev_output) = encoder_input(
      input_tensor, hidden_size, num_attention_heads)
  all_layer_outputs = []
  matmul_input = None  # prev_output in compute_type, once a layer has made it
  for layer_idx in range(num_hidden_layers):
    with tf.variable_scope("layer_%d" % layer_idx):
      # The queries and all after them: every row, or in the last layer [B*F, H] at
      # output_positions only.
      query_input, from_seq_length, mask = prev_output, seq_length, attention_mask
      if output_positions is not None and layer_idx == num_hidden_layers - 1:
        query_input = tf.gather(prev_output, shapes.flat_positions(output_positions, seq_length))
        from_seq_length = output_positions.shape.as_list()[1]
        mask = shapes.attention_mask_at(attention_mask, output_positions)

      def self_attention(queries, values, from_seq_length=from_seq_length, mask=mask):
        return attention_layer(
            from_tensor=queries, to_tensor=values, attention_mask=mask,
            num_attention_heads=num_attention_heads,
            size_per_head=hidden_size // num_attention_heads,
            attention_probs_dropout_prob=attention_probs_dropout_prob,
            initializer_range=initializer_range, batch_size=batch_size,
            from_seq_length=from_seq_length, to_seq_length=seq_length,
            dropout_seeds=dropout_seeds)

      prev_output, matmul_input = transformer_layer(
          prev_output, query_input, self_attention, compute_type, hidden_size,
          intermediate_size, intermediate_act_fn, hidden_dropout_prob, initializer_range,
          dropout_seeds, matmul_input)
      all_layer_outputs.append(tf.reshape(matmul_input,
                                          [batch_size, from_seq_length, hidden_size]))
  if do_return_all_layers:
    return all_layer_outputs
  return all_layer_outputs[-1]


def encoder_input(input_tensor, hidden_size, num_attention_heads):
  """Checks an encoder's input and flattens it.

  Returns:
    (batch_size, seq_length, compute_type, rows): rows float [batch_size * seq_length,
    hidden_size] in elementwise_dtype(compute_type): the residual stream (each layer
    norm's output, the next sublayer's residual) is float32 when the matmuls, which get
    a cast, are bfloat16.

  Raises:
    ValueError: the hidden size is not a multiple of the heads or not the input's width.
  """
  if hidden_size % num_attention_heads != 0:
    raise ValueError(
        "The hidden size (%d) is not a multiple of the number of attention "
        "heads (%d)" % (hidden_size, num_attention_heads))
  (batch_size, seq_length, input_width) = get_shape_list(input_tensor, expected_rank=3)
  # The residual additions need the input to be as wide as the hidden layers.
  if input_width != hidden_size:
    raise ValueError("The width of the input tensor (%d) != hidden size (%d)" %
                     (input_width, hidden_size))
  # The 2D [batch_size * seq_length, width] form throughout: reshapes between 2D and 3D
  # are not free, and the dense layers are plain matmuls on it.
  compute_type = input_tensor.dtype
  rows = tf.cast(tf.reshape(input_tensor, [-1, input_width]),
                 precision.elementwise_dtype(compute_type))
  return batch_size, seq_length, compute_type, rows


def transformer_layer(layer_input, query_input, self_attention, compute_type, hidden_size,
                      intermediate_size, intermediate_act_fn, hidden_dropout_prob,
                      initializer_range, dropout_seeds=None, matmul_input=None):
  """One Transformer block (variables attention/self, attention/output, intermediate,
  output of the current layer_N scope): self-attention, its output projection, dropout,
  the residual and layer norm; the feed-forward, dropout, the residual and layer norm.

  Args:
    layer_input: float Tensor [rows, hidden_size], the residual stream.
    query_input: float Tensor [query rows, hidden_size]: layer_input, or the rows of it
      that the block is computed at (its keys and values come from layer_input).
    self_attention: function (queries, values) -> float Tensor [query rows, hidden_size]:
      the attention of the rows, given in compute_type (queries is values when
      query_input is layer_input).
    compute_type: the matmuls' type.
    hidden_size, intermediate_size, intermediate_act_fn, hidden_dropout_prob,
    initializer_range, dropout_seeds: as transformer_model's.
    matmul_input: (optional) layer_input in compute_type, where the caller has it (the
      last layer's second output); else a cast of it.

  Returns:
    (output, matmul_input): float Tensors [query rows, hidden_size], the block's output
    in the type of layer_input and the same in compute_type (the next block's
    matmul_input).
  """
  if matmul_input is None:
    matmul_input = tf.cast(layer_input, compute_type)
  query_matmul_input = (matmul_input if query_input is layer_input
                        else tf.cast(query_input, compute_type))
  with tf.variable_scope("attention"):
    with tf.variable_scope("self"):
      attention_output = self_attention(query_matmul_input, matmul_input)
    # Project back to hidden_size, then add the residual and normalize.
    with tf.variable_scope("output"):
      attention_output = dense_layer(attention_output, hidden_size, "dense",
                                     initializer_range=initializer_range)
      attention_output, attention_matmul_input = dropout_add_layer_norm(
          attention_output, query_input, hidden_dropout_prob, seeds=dropout_seeds)
  # The activation is only applied to the "intermediate" hidden layer.
  with tf.variable_scope("intermediate"):
    intermediate_output = dense_layer(attention_matmul_input, intermediate_size, "dense",
                                      intermediate_act_fn, initializer_range)
  # Down-project back to `hidden_size` then add the residual.
  with tf.variable_scope("output"):
    layer_output = dense_layer(intermediate_output, hidden_size, "dense",
                               initializer_range=initializer_range)
    return dropout_add_layer_norm(layer_output, attention_output, hidden_dropout_prob,
                                  seeds=dropout_seeds)
