"""The encoder on the real tokens only: BERT's dense layers, layer norms and feed-forward
skip the padding, and on a CPU the attention too, sequence by sequence.

The same outputs as modeling.transformer_model at the real tokens, the same variables,
for fewer FLOPs by the share of padding (about half of Wikipedia's tokens at sequence
512). BertModel(drop_padding=True) uses it; pretraining.attends_per_sequence says when
the attention per sequence pays.

  rows:           the real tokens of the batch first, in order, rounded up to a multiple
                  of row_multiple (unpadded_rows); every position maps to a row
  attention:      over every position (the rows gathered back, the padding hidden by the
                  mask), or per sequence over its own real tokens (attention_layer's
                  to_lengths: no mask, no work at the padding)
"""

import warnings

import tensorflow.compat.v1 as tf

from bert_pretrain.model import modeling
from bert_pretrain.model import shapes

# TensorFlow 1.15 warns each time the gradient of a gather of rows below is made dense;
# it is an activation's size, as in 2.x, which says nothing.
warnings.filterwarnings("ignore", message="Converting sparse IndexedSlices to a dense "
                        "Tensor of unknown shape")


def transformer_model(input_tensor,
                      attention_mask,
                      input_mask,
                      hidden_size=768,
                      num_hidden_layers=12,
                      num_attention_heads=12,
                      intermediate_size=3072,
                      intermediate_act_fn=modeling.gelu,
                      hidden_dropout_prob=0.1,
                      attention_probs_dropout_prob=0.1,
                      initializer_range=0.02,
                      do_return_all_layers=False,
                      output_positions=None,
                      row_multiple=None,
                      attention_per_sequence=False,
                      dropout_seeds=None,
                      max_sequences=1):
  """modeling.transformer_model on the real tokens of input_mask only.

  Args:
    input_tensor, attention_mask, hidden_size ... output_positions, dropout_seeds: as
      modeling.transformer_model's. attention_mask must hide every position where
      input_mask is 0 (the -10000 before the softmax gives it a weight of exactly 0),
      and output_positions must be real tokens.
    input_mask: int Tensor [batch_size, seq_length], 1 for real tokens; in packed rows
      (max_sequences > 1) the index of each token's sequence, 1..max_sequences.
    row_multiple: the rows are rounded up to a multiple of this, so that the matmuls
      see few shapes (None: default_row_multiple(batch_size * seq_length)).
    attention_per_sequence: the attention too runs on the real tokens only, each
      sequence's own rows one batched matmul with no mask (FLOPs down to the mean
      square of each sequence's share of real tokens, for a few more ops a sequence
      and a shape per length); attention_mask is then read only in the last layer of
      packed rows with output_positions. Needs a batch_size known at graph time.
    max_sequences: int, the sequences a row holds at most (1: unpacked rows).

  Returns:
    As modeling.transformer_model's; padding positions hold other rows' values.

  Raises:
    ValueError: attention_mask is missing, or a shape is invalid.
  """
  if attention_mask is None:
    raise ValueError("transformer_model: input_mask (skip the padding) needs the "
                     "attention_mask that hides it; pass create_attention_mask_from_"
                     "input_mask's")
  (batch_size, seq_length, compute_type, prev_output) = modeling.encoder_input(
      input_tensor, hidden_size, num_attention_heads)
  if row_multiple is None:
    row_multiple = default_row_multiple(batch_size * seq_length)
  # `rows` maps each position to its row, `position_rows` each row to its position.
  (position_rows, rows) = unpadded_rows(input_mask, row_multiple)
  prev_output = tf.gather(prev_output, position_rows)
  # Sequence by sequence needs the number of sequences when the graph is built.
  per_sequence = attention_per_sequence and isinstance(batch_size, int)
  # The rows hold the sequences in this order, row by row.
  lengths = (tf.reshape(sequence_lengths(input_mask, max_sequences), [-1])
             if per_sequence else None)

  all_layer_outputs = []
  matmul_input = None  # prev_output in compute_type, once a layer has made it
  for layer_idx in range(num_hidden_layers):
    with tf.variable_scope("layer_%d" % layer_idx):
      query_input, from_seq_length = prev_output, seq_length
      last_at_outputs = output_positions is not None and layer_idx == num_hidden_layers - 1
      mask, sequences = attention_mask, batch_size
      if last_at_outputs:
        positions = shapes.flat_positions(output_positions, seq_length)
        query_input = tf.gather(prev_output, tf.gather(rows, positions))
        from_seq_length = output_positions.shape.as_list()[1]
        mask = shapes.attention_mask_at(attention_mask, output_positions)
      elif per_sequence:
        sequences = batch_size * max_sequences
      # A packed row's output queries belong to several sequences: the mask sorts them.
      within = per_sequence and not (last_at_outputs and max_sequences > 1)

      def self_attention(queries, values, from_seq_length=from_seq_length,
                         last_at_outputs=last_at_outputs, mask=mask, sequences=sequences,
                         within=within):
        context = attention_layer(
            from_tensor=queries, to_tensor=values, attention_mask=mask,
            num_attention_heads=num_attention_heads,
            size_per_head=hidden_size // num_attention_heads,
            attention_probs_dropout_prob=attention_probs_dropout_prob,
            initializer_range=initializer_range, batch_size=sequences,
            from_seq_length=from_seq_length, to_seq_length=seq_length,
            to_rows=None if within else rows, to_lengths=lengths if within else None,
            dropout_seeds=dropout_seeds)
        if not last_at_outputs and not within:
          context = tf.gather(context, position_rows)  # back to the real tokens' rows
        return context

      prev_output, matmul_input = modeling.transformer_layer(
          prev_output, query_input, self_attention, compute_type, hidden_size,
          intermediate_size, intermediate_act_fn, hidden_dropout_prob, initializer_range,
          dropout_seeds, matmul_input)
      layer_output = prev_output if last_at_outputs else tf.gather(prev_output, rows)
      all_layer_outputs.append(tf.reshape(tf.cast(layer_output, compute_type),
                                          [batch_size, from_seq_length, hidden_size]))
  return all_layer_outputs if do_return_all_layers else all_layer_outputs[-1]


def attention_layer(from_tensor, to_tensor, attention_mask=None, num_attention_heads=1,
                    size_per_head=512, attention_probs_dropout_prob=0.0,
                    initializer_range=0.02, batch_size=None, from_seq_length=None,
                    to_seq_length=None, to_rows=None, to_lengths=None, dropout_seeds=None):
  """modeling.attention_layer where `to_tensor` holds only some positions' rows.

  Args:
    from_tensor ... to_seq_length, dropout_seeds: as modeling.attention_layer's.
    to_rows: (optional) int32 Tensor [batch_size * to_seq_length]: the row of
      `to_tensor` that holds each position, when `to_tensor` holds only some positions
      (unpadded_rows: the real tokens). The others read any row, which attention_mask
      must hide. When from_tensor is to_tensor it holds the same rows, and the output
      has a row for every position all the same.
    to_lengths: (optional) int32 Tensor [batch_size], in place of to_rows and
      attention_mask: `to_tensor` holds the real tokens of the sequences one after the
      other ([R, to_width], sequence b's to_lengths[b] rows after those of sequence
      b - 1; rows after the last sequence's are not read), and each sequence's queries
      attend to its own rows only, one batched matmul a sequence: no work at the
      padding. from_tensor is to_tensor (the output then has its R rows, those after
      the sequences' zero), or holds from_seq_length rows a sequence ([batch_size *
      from_seq_length, from_width]). batch_size must be a Python int.

  Returns:
    float Tensor [batch_size * from_seq_length (or R), num_attention_heads * size_per_head].

  Raises:
    ValueError: the tensors are not rank 2, the lengths are not given, or to_lengths
      comes with to_rows or without a Python int batch_size.
  """
  modeling.check_attention_inputs(from_tensor, to_tensor, batch_size, from_seq_length,
                                  to_seq_length)
  if to_lengths is not None and (to_rows is not None or not isinstance(batch_size, int)):
    raise ValueError("attention_layer: to_lengths takes a Python int batch_size and no "
                     "to_rows; pass one of to_rows and to_lengths")
  projected = modeling.project_attention(from_tensor, to_tensor, num_attention_heads,
                                         size_per_head, initializer_range=initializer_range)
  queries, keys_values = projected.queries, projected.keys_values
  if to_lengths is None:
    if to_rows is not None:
      keys_values = tf.gather(keys_values, to_rows)
      queries = keys_values if projected.self_attention else queries
    return modeling.attention_context(projected, queries, keys_values, batch_size,
                                      from_seq_length, to_seq_length, attention_mask,
                                      attention_probs_dropout_prob, dropout_seeds)
  return _within_sequences(projected, batch_size, from_seq_length, to_lengths,
                           attention_probs_dropout_prob, dropout_seeds)


def _within_sequences(projected, batch_size, from_seq_length, to_lengths, dropout_prob,
                      seeds):
  """attention_layer's to_lengths: sequence after sequence, at its real tokens only, no
  mask."""
  queries, keys_values = projected.queries, projected.keys_values
  with tf.name_scope("within_sequences"):
    real = tf.reduce_sum(to_lengths)
    if keys_values.dtype == tf.bfloat16 and tf.__version__.startswith("1."):
      # TensorFlow 1.15 gives an unused bfloat16 part of a split no gradient, which
      # the split's gradient (a concat) cannot take: split the real rows only.
      sequences = tf.split(keys_values[:real], to_lengths, num=batch_size)
    else:
      # The rows after the sequences are a part of their own, unused (its gradient
      # zeros): slicing the real rows off first would cost the slice's gradient, a pass
      # that copies into zeros.
      after = tf.shape(keys_values)[:1] - real
      sequences = tf.split(keys_values, tf.concat([to_lengths, after], 0),
                           num=batch_size + 1)[:batch_size]
    query_groups = (sequences if projected.self_attention
                    else tf.split(queries, batch_size, axis=0))
    # One sequence a group: its length of queries (all of its rows, or from_seq_length).
    from_length = -1 if projected.self_attention else from_seq_length
    contexts = [modeling.attention_context(projected, query_rows, key_value_rows, 1,
                                           from_length, -1, None, dropout_prob, seeds)
                for query_rows, key_value_rows in zip(query_groups, sequences)]
    context_layer = tf.concat(contexts, axis=0)
    if projected.self_attention:
      context_layer = tf.pad(context_layer, [[0, tf.shape(keys_values)[0] - real], [0, 0]])
    return context_layer


def sequence_lengths(input_mask, max_sequences=1):
  """int32 Tensor [batch_size, max_sequences]: the real tokens of each sequence slot of
  each row (a packed row's empty slots hold none). input_mask: as transformer_model's."""
  if max_sequences == 1:
    return tf.reduce_sum(tf.cast(tf.not_equal(input_mask, 0), tf.int32), axis=1,
                         keepdims=True)
  slots = tf.one_hot(tf.cast(input_mask, tf.int32), max_sequences + 1, dtype=tf.int32)
  return tf.reduce_sum(slots[:, :, 1:], axis=1)


def default_row_multiple(positions):
  """The multiple that transformer_model rounds its rows up to by default: the smallest
  multiple of 16 that gives a batch of `positions` (batch_size * seq_length) at most 64
  shapes: 16 up to 1024 positions, 32 up to 2048, 64 up to 4096, 128 at 8192.
  """
  return ((positions + 63) // 64 + 15) // 16 * 16


def unpadded_rows(input_mask, row_multiple=1):
  """The rows of a batch that the layers compute when they skip the padding.

  The real tokens come first, in order, then as many padding positions as round their
  number up to a multiple of `row_multiple` (at most every position). Each padding
  position not among them is mapped to the last row computed. Attention must hide the
  padding: a sequence without real tokens would attend to other sequences' rows.

  Args:
    input_mask: int Tensor [batch_size, seq_length], 1 for real tokens.
    row_multiple: int.

  Returns:
    (position_rows, rows): int32 Tensors, position_rows [R] the flat position
    (b * seq_length + s) of each row computed, rows [batch_size * seq_length] the row
    of each position.
  """
  with tf.name_scope("unpadded_rows"):
    real = tf.reshape(tf.not_equal(input_mask, 0), [-1])
    # int32 row numbers: where() gives int64 ones, which gather on a CPU takes alike.
    order = tf.cast(tf.concat([tf.where(real)[:, 0], tf.where(tf.logical_not(real))[:, 0]],
                              axis=0), tf.int32)
    total = tf.size(real)
    count = tf.reduce_sum(tf.cast(real, tf.int32))
    # At least one row, should a batch be all padding.
    count = tf.minimum(tf.maximum((count + row_multiple - 1) // row_multiple * row_multiple,
                                  1), total)
    position_rows = order[:count]
    rows = tf.minimum(tf.invert_permutation(order), count - 1)
    return position_rows, rows
