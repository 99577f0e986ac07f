"""Dropout, and masks that are a function of the run's seed, the dropout site and the
micro-batch's place in the data order (DropoutSeeds), so that a resumed run draws the
masks of the uninterrupted one.
"""

import hashlib

import tensorflow.compat.v1 as tf

from bert_pretrain.model import kernels
from bert_pretrain.model import precision


class DropoutSeeds(object):
  """The seeds of a model's dropout masks, so that a mask is a function of the run's
  seed, the dropout site (its place in the model: layer, sublayer, sequence) and the
  micro-batch's position rather than of a random state that a new process draws anew.

  Each call of next() (one per dropout site, in the order the model is built) gives the
  stateless random ops' seed [key, position]: key mixes the run's seed and the site's
  number, position tells the micro-batches apart (pretraining.build_train_graph passes
  the place of the micro-batch's first record in the run's data order, which differs
  for every update, micro-batch and replica). Philox takes key as its key and position
  as the high half of its counter, so no two masks share random bits.

  Args:
    seed: Python int, the run's seed.
    position: int64 scalar Tensor.
  """

  def __init__(self, seed, position):
    self._seed = int(seed)
    self._position = tf.cast(position, tf.int64)
    self._site = 0

  def next(self):
    """int64 Tensor [2], the seed of the next dropout site's mask."""
    self._site += 1
    digest = hashlib.sha256(("%d/%d" % (self._seed, self._site)).encode()).hexdigest()
    key = int(digest[:15], 16)  # 60 bits: a non-negative int64
    return tf.stack([tf.constant(key, tf.int64), self._position])


def dropout(input_tensor, dropout_prob, seeds=None):
  """Applies dropout; a no-op when dropout_prob is None or 0.

  Kept values are scaled by 1 / (1 - dropout_prob), zeroed where keep_mask is False; where
  it is None, by tf.nn.dropout.

  Args:
    input_tensor: float Tensor.
    dropout_prob: Python float, the probability of dropping out a value.
    seeds: (optional) DropoutSeeds.

  Returns:
    A Tensor of the same shape and type as `input_tensor`, computed in
    elementwise_dtype of its type.
  """
  if dropout_prob is None or dropout_prob == 0.0:
    return input_tensor
  x = tf.cast(input_tensor, precision.elementwise_dtype(input_tensor.dtype))
  keep = keep_mask(tf.shape(x), dropout_prob, seeds)
  if keep is not None:
    output = tf.where_v2(keep, x * (1.0 / (1.0 - dropout_prob)), tf.zeros([], x.dtype))
  else:
    output = tf.nn.dropout(x, rate=dropout_prob)
  return tf.cast(output, input_tensor.dtype)


def keep_mask(shape, dropout_prob, seeds=None):
  """The mask dropout applies, False where it zeroes a value: with `seeds`, from stateless
  random ops seeded by seeds.next() (random_keep_mask), the same in every process.
  Without, where TensorFlow has the StatelessRandomUniformFullInt op (2.x),
  random_keep_mask's seeded by a stateful op.

  Returns:
    bool Tensor of `shape`; None where dropout_prob is None or not in (0, 1), and on
    TensorFlow 1.15 without `seeds`, where dropout is tf.nn.dropout.
  """
  if dropout_prob is None or not 0.0 < dropout_prob < 1.0 or (
      seeds is None and not hasattr(tf.raw_ops, "StatelessRandomUniformFullInt")):
    return None
  return random_keep_mask(shape, dropout_prob, seeds.next() if seeds is not None else None)


def random_keep_mask(shape, dropout_prob, seed=None):
  """A random bool mask, False with probability dropout_prob.

  Where TensorFlow has StatelessRandomUniformFullInt (2.x), each value takes 16 random
  bits, two from each 32-bit Philox draw (dropout_prob rounded to 1/65536): half the
  draws of tf.nn.dropout's float32 mask; where the fused kernels are built, the
  BertKeepMask kernel makes the same mask in one pass. TensorFlow 1.15 (reached only
  with `seed`) compares a float32 uniform draw.

  Args:
    shape: int32 Tensor [rank], the mask's shape.
    dropout_prob: Python float in (0, 1).
    seed: (optional) int Tensor [2], the stateless ops' seed; default: drawn by a
      stateful op (so a graph seed makes the masks repeat within one process).

  Returns:
    bool Tensor of `shape`.
  """
  with tf.name_scope("random_keep_mask"):
    if seed is None:
      seed = tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32)
    if not hasattr(tf.raw_ops, "StatelessRandomUniformFullInt"):
      return tf.random.stateless_uniform(shape, seed, dtype=tf.float32) >= dropout_prob
    threshold = int(round(dropout_prob * 65536))
    fused = kernels.load()
    if fused is not None:
      return fused.bert_keep_mask(tf.cast(shape, tf.int32), tf.cast(seed, tf.int64),
                                  threshold=threshold)
    size = tf.reduce_prod(shape)
    bits = tf.raw_ops.StatelessRandomUniformFullInt(  # tf-compat: guarded (dropout)
        shape=tf.reshape((size + 1) // 2, [1]), seed=seed, dtype=tf.uint32)
    halves = tf.reshape(tf.bitcast(bits, tf.uint16), [-1])[:size]
    return tf.reshape(halves >= threshold, shape)
