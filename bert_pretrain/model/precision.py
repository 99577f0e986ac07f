"""Compute types and the gradients written out by hand: what makes the model fast and
exact in low precision without changing its numbers.

- get_custom_getter: variables stay float32 (master weights); the layers get a cast copy
  in the compute type (bfloat16 or float16).
- elementwise_dtype: the type of the math between the matmuls.
- gelu, softmax, dropped_attention, normalize, dense_matmul / gradient_matmul,
  softmax_cross_entropy: the GELU, the attention's softmax (with its dropout and product),
  layer norm, the dense layers' products and the masked-LM loss with gradients that take
  fewer passes over the activations, or keep fewer of them for the backward pass, than
  TensorFlow derives (the measurements: docs/performance.md).
- fused_kernels, fused_dropout_add_normalize, bias_add, cast: in bfloat16 on a CPU, the
  GELU, the attention's softmax and dropout, each sublayer's dropout, residual and layer
  norm, the biases' gradients and the weights' casts run kernels.py's fused kernels where
  they are built; cast_source lets the optimizer read a gradient before its cast.
"""

import math

import tensorflow.compat.v1 as tf

from bert_pretrain.model import kernels


def get_custom_getter(compute_type):
  """Returns a variable getter that keeps variables float32 and casts them for use.

  Args:
    compute_type: the dtype the graph computes in.

  Returns:
    None for float32; otherwise a custom getter for tf.variable_scope.
  """
  if compute_type == tf.float32:
    return None

  def float32_variable_getter(getter, name, *args, **kwargs):
    requested_dtype = kwargs.get("dtype", tf.float32)
    if requested_dtype == compute_type:
      kwargs["dtype"] = tf.float32
    variable = getter(name, *args, **kwargs)
    if requested_dtype == compute_type and variable.dtype.base_dtype != compute_type:
      with tf.name_scope(name + "/"):  # beside its variable, not at the graph's root
        return cast(variable, compute_type)
    return variable

  return float32_variable_getter


def cast(x, dtype):
  """tf.cast(x, dtype). Between float32 and bfloat16, where the fused kernels are built,
  the kernels' BertToBfloat16 / BertToFloat, both ways: TensorFlow's bits (rounded to
  nearest even) at memory speed, where TensorFlow's Cast runs several times slower."""
  x = tf.convert_to_tensor(x)
  dtype = tf.as_dtype(dtype)
  fused = fused_kernels(tf.bfloat16)
  if {x.dtype.base_dtype, dtype} != {tf.float32, tf.bfloat16} or fused is None:
    return tf.cast(x, dtype)
  return fused.bert_to_bfloat16(x) if dtype == tf.bfloat16 else fused.bert_to_float(x)


def cast_source(x):
  """The bfloat16 Tensor that cast() made the float32 Tensor `x` from with a kernel, else
  None: a consumer that reads bfloat16 (the optimizer's kernels read the weights'
  gradients so) takes it instead, and the cast then never runs."""
  if isinstance(x, tf.Tensor) and x.op.type == "BertToFloat":
    return x.op.inputs[0]
  return None


def _cast_gradient(grad, dtype):
  if isinstance(grad, tf.IndexedSlices):  # through a tf.gather (the embeddings' tables)
    return tf.IndexedSlices(cast(grad.values, dtype), grad.indices, grad.dense_shape)
  return cast(grad, dtype)


@tf.RegisterGradient("BertToBfloat16")
def _bert_to_bfloat16_grad(op, grad):
  del op
  return _cast_gradient(grad, tf.float32)


@tf.RegisterGradient("BertToFloat")
def _bert_to_float_grad(op, grad):
  del op
  return _cast_gradient(grad, tf.bfloat16)


def elementwise_dtype(compute_type):
  """The type the elementwise math (GELU, dropout, softmax, residual, layer norm)
  computes in when the matmuls compute in `compute_type`: float32 for bfloat16, else
  `compute_type`.

  bfloat16 is the CPU's mixed precision (--amp on a CPU), where TensorFlow's
  elementwise kernels run faster in float32, casts included. float16, the GPUs' type,
  keeps its own: a GPU's float16 elementwise kernels are as fast as its float32 ones and
  move half the bytes.
  """
  if compute_type == tf.bfloat16:
    return tf.float32
  return compute_type


# 0.5 * (1 + tanh(z)) is sigmoid(2z): GELU is v * sigmoid(v * (_GELU_A + _GELU_B * v^2)).
_GELU_A = 2 * math.sqrt(2 / math.pi)
_GELU_B = _GELU_A * 0.044715


def fused_kernels(compute_type):
  """kernels.load()'s op module where `compute_type` is bfloat16 and the kernels are
  built, else None (TensorFlow's ops compute)."""
  return kernels.load() if compute_type == tf.bfloat16 else None


def gelu(x):
  """Gaussian Error Linear Unit, the tanh approximation BERT was trained with:
  0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))), in elementwise_dtype(x.dtype),
  computed as x * sigmoid(2 * sqrt(2 / pi) * (x + 0.044715 * x^3)), the same function
  in fewer passes over x, without 1 + tanh's cancellation below x = -3.

  Its gradient is written out: upstream * slope, the slope s + x * s * (1 - s) * d/dx of
  the sigmoid's argument (s the sigmoid), rounded to x's type. TensorFlow's own
  derivation keeps four float32 tensors of x's size for the backward pass (x, x^2, the
  tanh, the cdf), the largest part of a layer's activations.

  In bfloat16, where the fused kernels are built (kernels.py), each pass is one kernel
  that keeps only x; elsewhere TensorFlow's ops compute the same formula.

  Args:
    x: float Tensor.

  Returns:
    Tensor of the shape and type of `x`.
  """
  fused = fused_kernels(x.dtype)
  if fused is not None:
    return _fused_gelu(x, fused)
  return _gelu_ops(x)


def _fused_gelu(x, fused):
  """gelu(x) for bfloat16 x by the kernels' BertGelu and BertGeluGrad."""
  @tf.custom_gradient
  def fused_gelu(x):
    return fused.bert_gelu(x), lambda upstream: fused.bert_gelu_grad(x, upstream)

  return fused_gelu(x)


@tf.custom_gradient
def _gelu_ops(x):
  """gelu(x) by TensorFlow's ops, the slope from the sigmoid: SigmoidGrad is its middle
  product."""
  v = tf.cast(x, elementwise_dtype(x.dtype))
  square = tf.square(v)
  s = tf.sigmoid(v * (_GELU_A + _GELU_B * square))

  def grad(upstream):
    # In x's type: the gradient leaves in it.
    (w, w_square) = (v, square)
    if v.dtype == tf.float16:
      # Past |x| = 10 the sigmoid's slope is 0 in float16; clipped there, the inner slope
      # stays finite (from |x| = 68 it overflowed, and inf x 0 made the gradient NaN).
      w = tf.clip_by_value(v, -10.0, 10.0)
      w_square = tf.square(w)
    inner_slope = w * (_GELU_A + (3 * _GELU_B) * w_square)
    slope = tf.cast(s + tf.raw_ops.SigmoidGrad(y=s, dy=inner_slope), x.dtype)
    return upstream * slope

  return tf.cast(v * s, x.dtype), grad


def softmax(logits, kept_dtype):
  """tf.nn.softmax over the last axis, its output kept for the backward pass in
  `kept_dtype`: the attention's matmul type, half float32's bytes under bfloat16, where
  the gradient is cast to it anyway on its way to the matmuls.

  Args:
    logits: float Tensor [..., width].
    kept_dtype: the type the probabilities are kept in between the passes.

  Returns:
    Tensor of the shape and type of `logits`.
  """
  @tf.custom_gradient
  def softmax_keeping_a_copy(x):
    probs = tf.nn.softmax(x)
    kept = tf.cast(probs, kept_dtype)

    def grad(upstream):
      # In the backward pass: a float32 copy made earlier would stay in memory until then.
      with tf.control_dependencies([upstream]):
        p = tf.cast(kept, probs.dtype)
      return p * (upstream - tf.reduce_sum(upstream * p, -1, keepdims=True))

    return probs, grad

  return softmax_keeping_a_copy(logits)


def dropped_attention(scores, value, keep, dropout_prob, adder=None):
  """matmul(dropout(softmax(scores + adder)), value), the attention's context, with its gradient
  written out: the backward pass keeps the probabilities in value's type and the keep
  mask, and makes the dropped probabilities again from them instead of keeping them too
  (one tensor of the probabilities' size less for each layer).

  The dropped probabilities come from the kept copy in both passes, so the forward
  pass's product and the backward pass's agree. In bfloat16, where the fused kernels
  are built (kernels.py), the mask, softmax and dropout are one kernel each way, reading
  the scores in their own type; elsewhere TensorFlow's ops compute them in
  elementwise_dtype.

  Args:
    scores: float Tensor [B, N, F, T], the attention scores, in value's type or
      elementwise_dtype of it.
    value: float Tensor [B, N, T, H].
    keep: bool Tensor [B, N, F, T], False where dropout zeroes a probability.
    dropout_prob: Python float in (0, 1).
    adder: (optional) Tensor [B, 1, 1 or F, T] in elementwise_dtype, the mask's: -10000
      where a position is hidden, else 0.

  Returns:
    Tensor [B, N, F, H] in value's type.
  """
  scale = 1.0 / (1.0 - dropout_prob)
  fused = fused_kernels(value.dtype)
  if fused is not None:
    return _fused_dropped_attention(scores, value, keep, scale, fused, adder)
  scores = tf.cast(scores, elementwise_dtype(value.dtype))
  if adder is not None:
    scores += adder

  def drop(kept):
    x = tf.cast(kept, scores.dtype) * scale
    return tf.cast(tf.where_v2(keep, x, tf.zeros([], x.dtype)), value.dtype)

  @tf.custom_gradient
  def attention(x, v):
    kept = tf.cast(tf.nn.softmax(x), v.dtype)

    def grad(upstream):
      # Made in the backward pass: a copy made earlier would stay in memory until then.
      with tf.control_dependencies([upstream]):
        dropped = drop(tf.identity(kept))
        p = tf.cast(kept, x.dtype)
      grad_v = tf.matmul(dropped, upstream, transpose_a=True)
      grad_dropped = tf.cast(tf.matmul(upstream, v, transpose_b=True), x.dtype)
      grad_p = tf.where_v2(keep, grad_dropped * scale, tf.zeros([], x.dtype))
      return p * (grad_p - tf.reduce_sum(grad_p * p, -1, keepdims=True)), grad_v

    return tf.matmul(drop(kept), v), grad

  return attention(scores, value)


def _fused_dropped_attention(scores, value, keep, scale, fused, adder):
  """dropped_attention for bfloat16 `value` by the kernels' BertAttentionProbs (softmax
  and dropout; BertMaskedAttentionProbs with the mask), BertDropout and
  BertAttentionProbsGrad."""
  @tf.custom_gradient
  def attention(x, v):
    if adder is None:
      kept, dropped = fused.bert_attention_probs(x, keep, scale=scale)
    else:
      kept, dropped = fused.bert_masked_attention_probs(x, keep, adder, scale=scale)

    def grad(upstream):
      with tf.control_dependencies([upstream]):
        dropped = fused.bert_dropout(kept, keep, scale=scale)
      grad_v = tf.matmul(dropped, upstream, transpose_a=True)
      grad_dropped = tf.matmul(upstream, v, transpose_b=True)
      return fused.bert_attention_probs_grad(kept, keep, grad_dropped, scale=scale,
                                             T=x.dtype), grad_v

    return tf.matmul(dropped, v), grad

  return attention(scores, value)


@tf.custom_gradient
def normalize(x, gamma, beta):
  """(x - mean) / sqrt(variance + 1e-12) * gamma + beta, the statistics over the last axis.

  Its gradient is written out: for x_hat, the normalized x, and g = upstream * gamma,
  dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sqrt(variance + 1e-12), means over the
  last axis: fewer passes over the activations than TensorFlow derives from the forward
  ops.

  Args:
    x: float32 Tensor [..., width].
    gamma, beta: float32 Tensors [width].

  Returns:
    float32 Tensor of the shape of `x`.
  """
  mean, variance = tf.nn.moments(x, axes=[-1], keep_dims=True)
  inverse_std = tf.rsqrt(variance + 1e-12)
  x_hat = (x - mean) * inverse_std
  rows = list(range(x.shape.ndims - 1))

  def grad(upstream):
    g = upstream * gamma
    dx = inverse_std * (g - tf.reduce_mean(g, -1, keepdims=True)
                        - x_hat * tf.reduce_mean(g * x_hat, -1, keepdims=True))
    return dx, tf.reduce_sum(upstream * x_hat, rows), tf.reduce_sum(upstream, rows)

  return x_hat * gamma + beta, grad


def fused_dropout_add_normalize(x, residual, keep, dropout_prob, gamma, beta, fused):
  """normalize(dropout(x) + residual, gamma, beta) in one kernel each way (the kernels'
  BertDropoutAddLayerNorm and its Grad), the same float32 math as TensorFlow's ops, and
  the result in bfloat16 too for the next matmul: the kernel writes both, and the
  backward pass adds that copy's gradient in its own pass (no cast either way).

  The backward pass keeps x_hat and 1 / std per row, as normalize's does, and the mask.

  Args:
    x: bfloat16 Tensor [..., width], the sublayer's output projection.
    residual: float32 Tensor of x's shape.
    keep: bool Tensor of x's shape, False where dropout zeroes a value.
    dropout_prob: Python float in [0, 1).
    gamma, beta: float32 Tensors [width].
    fused: fused_kernels(tf.bfloat16), not None.

  Returns:
    (float32 Tensor of x's shape, the same rounded to bfloat16).
  """
  scale = 1.0 / (1.0 - dropout_prob)

  @tf.custom_gradient
  def dropout_add_normalize(x, residual, gamma, beta):
    y, x_hat, inverse_std, y_half = fused.bert_dropout_add_layer_norm(
        x, residual, keep, gamma, beta, scale=scale)

    def grad(upstream, upstream_half):
      # TensorFlow 1.15 passes None for the gradient of an output nothing reads.
      if upstream is None:
        upstream = tf.zeros_like(y)
      if upstream_half is None:
        upstream_half = tf.zeros_like(y_half)
      d_residual, dx, d_gamma, d_beta = fused.bert_dropout_add_layer_norm_grad(
          upstream, x_hat, inverse_std, gamma, keep, upstream_half, scale=scale)
      return dx, d_residual, d_gamma, d_beta

    return (y, y_half), grad

  return dropout_add_normalize(x, residual, gamma, beta)


def bias_add(value, bias):
  """tf.nn.bias_add(value, bias). In bfloat16, where the fused kernels are built
  (kernels.py), BertBiasAdd and, for the bias's gradient, BertBiasAddGrad. TensorFlow's
  oneDNN build fuses a bfloat16 MatMul + BiasAdd into one product slower than its plain
  matmul and a separate sum at most of BERT's shapes; its bfloat16 BiasAddGrad is several
  times slower and, over thousands of rows, far less exact than float32 sums rounded once
  (docs/performance.md).

  Args:
    value: float Tensor [..., units].
    bias: float Tensor [units] of value's type.

  Returns:
    Tensor of value's shape and type.
  """
  fused = fused_kernels(value.dtype)
  if fused is None:
    return tf.nn.bias_add(value, bias)
  return fused.bert_bias_add(value, bias)


@tf.RegisterGradient("BertBiasAdd")
def _bert_bias_add_grad(op, grad):
  del op  # the sum's gradient reads neither input
  grad = tf.convert_to_tensor(grad)  # TensorFlow 1.15 may pass IndexedSlices (a gather)
  return grad, kernels.load().bert_bias_add_grad(grad)


def dense_matmul(input_tensor, kernel):
  """input_tensor [..., input_width] @ kernel [input_width, units], with the gradient
  of _dense_layer_matmul_grad."""
  with tf.get_default_graph().gradient_override_map({"MatMul": "DenseLayerMatMul"}):
    if input_tensor.shape.ndims == 2:
      return tf.matmul(input_tensor, kernel)
    return tf.tensordot(input_tensor, kernel, axes=1)


@tf.RegisterGradient("DenseLayerMatMul")
def _dense_layer_matmul_grad(op, grad):
  """The gradient of dense_layer's y = x @ kernel: (grad @ kernel^T, x^T @ grad), each
  product made by gradient_matmul."""
  (x, kernel) = op.inputs
  if op.get_attr("transpose_a") or op.get_attr("transpose_b"):
    raise ValueError("dense_layer's gradient expects an untransposed MatMul")
  # Through a tf.gather of the output (unpadded_rows), TensorFlow 1.15 passes the
  # gradient on as IndexedSlices.
  grad = tf.convert_to_tensor(grad)
  return (gradient_matmul(grad, kernel, transpose_b=True),
          gradient_matmul(x, grad, transpose_a=True))


def gradient_matmul(a, b, transpose_a=False, transpose_b=False):
  """a @ b (either transposed) for a gradient, by the op that computes it faster.

  A float32 product whose result has at most half as many columns as the dimension it
  sums over (the gradient of the feed-forward input from its 4x wider output, and of a
  kernel from its batch_size * seq_length rows) is a BatchMatMulV2, which TensorFlow's
  oneDNN build runs with a faster kernel than MatMul at those shapes; others stay MatMul.
  A dimension unknown when the graph is built counts as small. Both ops compute the same
  product.

  Args:
    a: float Tensor [m, k] ([k, m] if transpose_a).
    b: float Tensor [k, n] ([n, k] if transpose_b).
    transpose_a, transpose_b: bool.

  Returns:
    float Tensor [m, n].
  """
  columns = b.shape.as_list()[0 if transpose_b else 1]
  depth = a.shape.as_list()[0 if transpose_a else 1]
  if a.dtype == tf.float32 and columns and depth and 2 * columns <= depth:
    return tf.raw_ops.BatchMatMulV2(x=a, y=b, adj_x=transpose_a, adj_y=transpose_b)
  return tf.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)


@tf.custom_gradient
def softmax_cross_entropy(logits, labels):
  """-log softmax(logits)[label] per row, with the gradient softmax - one_hot(label).

  The same numbers as tf.nn.sparse_softmax_cross_entropy_with_logits with one softmax
  (oneDNN's, on a CPU) and the log-sum-exp taken from it: the largest probability is
  exp(max_logit) / sum_exp, never below 1 / vocab_size, so its log is well conditioned.

  Args:
    logits: float32 Tensor [num_rows, vocab_size].
    labels: int32 Tensor [num_rows].

  Returns:
    float32 Tensor [num_rows].
  """
  probs = tf.nn.softmax(logits)
  rows = tf.range(tf.shape(logits)[0])
  label_logits = tf.gather_nd(logits, tf.stack([rows, labels], axis=1))
  log_sum_exp = tf.reduce_max(logits, axis=-1) - tf.log(tf.reduce_max(probs, axis=-1))
  loss = log_sum_exp - label_logits

  def grad(upstream):
    one_hot = tf.one_hot(labels, tf.shape(logits)[1], dtype=probs.dtype)
    return (probs - one_hot) * tf.expand_dims(upstream, -1), None

  return loss, grad
