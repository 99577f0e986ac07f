"""Shapes and positions of the model's tensors, and the attention masks of packed rows.

get_shape_list and assert_rank are Google's (modeling.py keeps their names); the rest
gathers rows at positions of a flattened batch, and masks attention within the
sequences of a packed row.
"""

import tensorflow.compat.v1 as tf


def get_shape_list(tensor, expected_rank=None, name=None):
  """Returns a list of the shape of tensor, preferring static dimensions.

  Args:
    tensor: A tf.Tensor object to find the shape of.
    expected_rank: (optional) int or list of ints. The expected rank of `tensor`.
    name: Optional name of the tensor for the error message.

  Returns:
    A list of dimensions: Python ints where static, scalar int32 Tensors where dynamic.

  Raises:
    ValueError: the tensor's rank is not the expected one.
  """
  if name is None:
    name = tensor.name

  if expected_rank is not None:
    assert_rank(tensor, expected_rank, name)

  shape = tensor.shape.as_list()

  non_static_indexes = []
  for (index, dim) in enumerate(shape):
    if dim is None:
      non_static_indexes.append(index)

  if not non_static_indexes:
    return shape

  dyn_shape = tf.shape(tensor)
  for index in non_static_indexes:
    shape[index] = dyn_shape[index]
  return shape


def assert_rank(tensor, expected_rank, name=None):
  """Raises a ValueError if the tensor rank is not of the expected rank.

  Args:
    tensor: A tf.Tensor to check the rank of.
    expected_rank: Python integer or list of integers, expected rank.
    name: Optional name of the tensor for the error message.

  Raises:
    ValueError: If the expected shape doesn't match the actual shape.
  """
  if name is None:
    name = tensor.name

  expected_rank_dict = {}
  if isinstance(expected_rank, int):
    expected_rank_dict[expected_rank] = True
  else:
    for x in expected_rank:
      expected_rank_dict[x] = True

  actual_rank = tensor.shape.ndims
  if actual_rank not in expected_rank_dict:
    scope_name = tf.get_variable_scope().name
    raise ValueError(
        "For the tensor `%s` in scope `%s`, the actual rank "
        "`%d` (shape = %s) is not equal to the expected rank `%s`" %
        (name, scope_name, actual_rank, str(tensor.shape), str(expected_rank)))


def flat_positions(positions, seq_length):
  """int32 Tensor [batch_size * num_positions]: positions [batch_size, num_positions]
  of each sequence as rows of the flattened [batch_size * seq_length] batch."""
  positions = tf.cast(positions, tf.int32)
  flat_offsets = tf.expand_dims(tf.range(tf.shape(positions)[0]) * seq_length, 1)
  return tf.reshape(positions + flat_offsets, [-1])


def create_attention_mask_from_sequence_ids(sequence_ids, dtype=tf.float32):
  """The attention mask of packed rows: each token attends to its own sequence's.

  Args:
    sequence_ids: int Tensor [batch_size, seq_length], the index of each token's
      sequence (1, 2, ...; 0 on padding), a packed record's input_mask.
    dtype: type of the returned mask.

  Returns:
    Tensor of shape [batch_size, seq_length, seq_length]: 1 where from and to belong to
    the same sequence (a block-diagonal mask; padding rows attend to nothing).
  """
  to_ids = tf.expand_dims(sequence_ids, 1)
  same = tf.logical_and(tf.equal(tf.expand_dims(sequence_ids, 2), to_ids),
                        tf.not_equal(to_ids, 0))
  return tf.cast(same, dtype)


def attention_mask_at(attention_mask, positions):
  """The rows of an attention mask for the queries at `positions` only.

  Args:
    attention_mask: Tensor [batch_size, 1 or seq_length, to_seq_length], or None.
    positions: int32 Tensor [batch_size, num_positions].

  Returns:
    Tensor [batch_size, num_positions, to_seq_length]; a mask that all rows share
    ([batch_size, 1, to_seq_length]) or None as it is.
  """
  if attention_mask is None or attention_mask.shape.as_list()[1] == 1:
    return attention_mask
  (batch_size, from_length, to_length) = get_shape_list(attention_mask, expected_rank=3)
  rows = tf.gather(tf.reshape(attention_mask, [-1, to_length]),
                   flat_positions(positions, from_length))
  return tf.reshape(rows, [batch_size, -1, to_length])
