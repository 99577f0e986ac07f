"""Optimizers, learning-rate schedule and the training ops of BERT pretraining.

- LAMB (layer-wise adaptive moments, the MLPerf optimizer) and Adam with decoupled
  weight decay (Google BERT's AdamWeightDecay); weight decay is not applied to LayerNorm
  and bias variables, and, as in MLPerf's reference LAMB, neither is LAMB's layer
  adaptation (their trust ratio is 1; NVIDIA's LAMB adapts every variable:
  adapt_every_variable). Their moment slots are named <variable>/adam_m and
  <variable>/adam_v as in Google BERT checkpoints. Each variable is updated in place,
  by our kernel BertLambApply (kernels.cc) where it is built, else by TensorFlow's
  fused kernels (ApplyAdam, ApplyGradientDescent).
- Linear warm-up from --start_warmup_step, then polynomial decay to 0; with accumulation
  the schedule counts micro-batches, as MLPerf's reference, or updates (NVIDIA's).
- Gradient clipping by global norm 1.0: by default each micro-batch's gradient on each
  replica, before accumulation and the all-reduce, as MLPerf's reference (and NVIDIA)
  do; or once, after accumulation and the all-reduce (CLIP_AFTER_ALLREDUCE). MLPerf's
  rules allow either order.
- Gradient accumulation: k micro-batches are summed in float32 accumulators and applied
  as one update of their mean (clipped after the all-reduce, k micro-batches of b give
  the update of one batch kb). The all-reduce across ranks (Horovod) happens once,
  after accumulation; it sums the ranks' gradients, as MLPerf's reference, or averages
  them (NVIDIA's).
- Dynamic loss scaling for float16: start 2^15, x2 after 1000 finite steps, a step
  with a non-finite gradient is skipped (weights, slots and global_step unchanged)
  and halves the scale.
"""

import re

import tensorflow.compat.v1 as tf

from bert_pretrain import config
from bert_pretrain.model import kernels
from bert_pretrain.model import precision
from bert_pretrain.training import checkpoints

EXCLUDE_FROM_WEIGHT_DECAY = ["LayerNorm", "layer_norm", "bias"]

# Where the gradients are clipped to their global norm (create_train_ops).
CLIPPING = config.CLIPPING
CLIP_PER_MICRO_BATCH, CLIP_AFTER_ALLREDUCE = CLIPPING
# The optimizer's defaults, written once in the settings (config.Optimizer).
_DEFAULTS = config.Optimizer()


def learning_rate_schedule(global_step, init_lr, num_train_steps, num_warmup_steps,
                           poly_power=1.0, start_warmup_step=0, micro_batches=1):
  """The learning rate at `global_step`: linear warm-up, then polynomial decay to 0.

  Args:
    global_step: int64 scalar Tensor, the number of updates done so far.
    init_lr: peak learning rate, reached at the end of warm-up.
    num_train_steps: the step at which the decay reaches 0.
    num_warmup_steps: length of the linear warm-up (0: none).
    poly_power: power of the polynomial decay (1.0 is linear).
    start_warmup_step: the warm-up starts at this step (MLPerf's start_warmup_step).
    micro_batches: the schedule counts micro-batches, this many an update, as MLPerf's
      reference does with accumulation: its step counts are scaled by micro_batches and
      update u takes the value at its last micro-batch, u * micro_batches +
      micro_batches - 1. With 1, the schedule counts updates.

  Returns:
    float32 scalar Tensor.
  """
  if micro_batches > 1:
    global_step = global_step * micro_batches + (micro_batches - 1)
    (num_train_steps, num_warmup_steps, start_warmup_step) = (
        n * micro_batches for n in (num_train_steps, num_warmup_steps, start_warmup_step))
  step = tf.cast(global_step, tf.float32)
  decay_fraction = 1.0 - tf.minimum(step, float(num_train_steps)) / float(max(num_train_steps, 1))
  decayed_lr = init_lr * tf.pow(decay_fraction, poly_power)
  if not num_warmup_steps:
    return decayed_lr
  warmup_step = step - float(start_warmup_step)
  # init_lr times the fraction done, in this order, rounds as the reference does.
  warmup_lr = init_lr * (tf.maximum(warmup_step, 0.0) / float(num_warmup_steps))
  return tf.where(warmup_step < float(num_warmup_steps), warmup_lr, decayed_lr)


class _WeightDecayOptimizer(tf.train.Optimizer):
  """Common part of LAMB and AdamWeightDecay: slots, weight-decay exclusions and the
  update of every variable.

  Each variable is updated in place, not by a chain of elementwise ops, each of which
  reads and writes the whole tensor (docs/performance.md has the profile): by
  BertLambApply (kernels.cc: the moments, the direction, the norms and the weights in
  two passes) where it is built, else by TensorFlow's fused training kernels (ApplyAdam,
  ApplyGradientDescent: one pass over the weights and moments each).
  Under a tf.distribute strategy, or where an update may be skipped (`applied`), the
  same math runs as plain ops and assignments, which a strategy can mirror and a
  select can undo.
  """

  def __init__(self, learning_rate, weight_decay_rate, beta_1, beta_2, epsilon,
               exclude_from_weight_decay=None, name="WeightDecayOptimizer"):
    super(_WeightDecayOptimizer, self).__init__(False, name)
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = exclude_from_weight_decay

  def create_slots(self, variables):
    """Creates the moment slots <variable>/adam_m and <variable>/adam_v (zeros).

    apply_gradients creates them too; create_train_ops calls this first so that the
    slots exist outside the tf.cond that skips an overflowing update (a variable made
    inside a cond branch cannot be initialized).

    Returns:
      list of (m, v) float32 variables, one pair per variable.
    """
    slots = []
    # As apply_gradients decides, for all the variables at once.
    scratch = not tf.distribute.has_strategy() and _lamb_kernel(variables) is None
    with tf.variable_scope(tf.get_variable_scope(), reuse=tf.AUTO_REUSE):
      for param in variables:
        slots.append(tuple(
            tf.get_variable(name=checkpoints.variable_name(param) + suffix,
                            shape=param.shape.as_list(), dtype=tf.float32, trainable=False,
                            initializer=tf.zeros_initializer())
            for suffix in ("/adam_m", "/adam_v")))
        if scratch:
          self._create_scratch(param)  # TensorFlow's fused kernels need it
    return slots

  def _create_scratch(self, param):
    """(LAMB) a variable for the update direction, which the fused update needs."""
    del param

  def apply_gradients(self, grads_and_vars, global_step=None, name=None, applied=None,
                      grad_scale=None):
    """Applies grad_scale times the gradients; returns the group of update ops.

    Args:
      grads_and_vars: list of (gradient, variable); None gradients are skipped.
      global_step: int64 variable, the number of updates applied so far (LAMB's bias
        correction); it is not incremented here (create_train_ops does).
      name: unused, for the tf.train.Optimizer signature.
      applied: (optional) bool scalar Tensor; where false, the variables and slots keep
        their values (a skipped update, without tf.cond).
      grad_scale: (optional) float32 scalar Tensor the gradients are multiplied by (the
        clipping's factor): in BertLambApply's pass over them, else by a product first.
    """
    del name
    pairs = [(g, p) for (g, p) in grads_and_vars if g is not None and p is not None]
    fused = applied is None and not tf.distribute.has_strategy()
    kernel = _lamb_kernel([p for _, p in pairs]) if fused else None
    if kernel is None:
      pairs = list(zip(_scaled([g for g, _ in pairs], grad_scale), [p for _, p in pairs]))
    slots = self.create_slots([p for _, p in pairs])
    # The scalars are made once and shared by every variable's update.
    with tf.name_scope("hyperparameters"):
      step = tf.cast(global_step, tf.float32) + 1.0
      # 1 - beta in float32, as the fused kernel computes it (0.00099998713 for 0.999).
      scalars = dict(self._scalars(step),
                     one_minus_beta_1=1.0 - tf.constant(self.beta_1, tf.float32),
                     one_minus_beta_2=1.0 - tf.constant(self.beta_2, tf.float32))
      if kernel is not None:
        hyper = tf.stack([tf.cast(x, tf.float32) for x in (
            self.learning_rate, 1.0 if grad_scale is None else grad_scale,
            scalars["one_minus_beta_1"], scalars["one_minus_beta_2"],
            scalars["direction_scale"], scalars["direction_epsilon"])])
    updates = []
    for (grad, param), (m, v) in zip(pairs, slots):
      decay = self._do_use_weight_decay(checkpoints.variable_name(param))
      if kernel is not None:
        half = precision.cast_source(grad)  # read in bfloat16, without the cast's pass
        grad = grad if half is None else half
        updates.append(kernel(param, m, v, grad, hyper, adapt=self._adapts(param),
                              weight_decay=self.weight_decay_rate if decay else 0.0))
        continue
      if fused:
        updates.append(self._fused_update(grad, param, m, v, decay, scalars))
        continue
      next_m = m + (grad - m) * scalars["one_minus_beta_1"]
      next_v = v + (tf.square(grad) - v) * scalars["one_minus_beta_2"]
      update = next_m * scalars["direction_scale"] / (
          tf.sqrt(next_v) + scalars["direction_epsilon"])
      if decay:
        update += self.weight_decay_rate * param
      next_param = param - self._step_size(param, update) * update
      if applied is not None:
        (next_param, next_m, next_v) = [tf.where(applied, new, old) for new, old in
                                        ((next_param, param), (next_m, m), (next_v, v))]
      updates.extend([param.assign(next_param), m.assign(next_m), v.assign(next_v)])
    return tf.group(*updates)

  def _scalars(self, step):
    """The scalars of the Adam direction at update `step` (float32, 1-based), by name:
    direction = next_m * direction_scale / (sqrt(next_v) + direction_epsilon), which is
    m_hat / (sqrt(v_hat) + epsilon) with LAMB's bias correction, next_m / (sqrt(next_v)
    + epsilon) without it; beta_1_power, beta_2_power for TensorFlow's ApplyAdam."""
    raise NotImplementedError()

  def _fused_update(self, grad, param, m, v, decay, scalars):
    raise NotImplementedError()

  def _step_size(self, param, update):
    raise NotImplementedError()

  def _adapts(self, param):
    """Whether `param`'s step is scaled by a trust ratio (LAMB's layer adaptation)."""
    del param
    return False

  def _do_use_weight_decay(self, param_name):
    """Whether to use L2 weight decay for `param_name`."""
    if not self.weight_decay_rate:
      return False
    for r in self.exclude_from_weight_decay or []:
      if re.search(r, param_name) is not None:
        return False
    return True


def _is_resource(variable):
  return variable.op.type == "VarHandleOp"


def _lamb_kernel(variables):
  """kernels.cc's BertLambApply where it can update all of `variables` in place (it
  takes reference variables, as disable_v2_behavior makes them), else None."""
  ops = kernels.load()
  if ops is None or not hasattr(ops, "bert_lamb_apply") or any(
      _is_resource(v) for v in variables):
    return None
  return ops.bert_lamb_apply


def _apply_adam(var, m, v, grad, lr, scalars, epsilon, beta_1, beta_2):
  """TensorFlow's ApplyAdam, in place and in one pass: m and v take `grad`, then
  var -= lr * sqrt(1 - beta_2_power) / (1 - beta_1_power) * m / (sqrt(v) + epsilon).
  Returns the op (for a ref variable, var's updated value)."""
  args = dict(beta1_power=scalars["beta_1_power"], beta2_power=scalars["beta_2_power"],
              lr=lr, beta1=beta_1, beta2=beta_2, epsilon=epsilon, grad=grad)
  if _is_resource(var):
    return tf.raw_ops.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle, **args)
  return tf.raw_ops.ApplyAdam(var=var, m=m, v=v, **args)


def _apply_gradient_descent(var, alpha, delta):
  """var -= alpha * delta, in place and in one pass (TensorFlow's ApplyGradientDescent)."""
  if _is_resource(var):
    return tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=alpha, delta=delta)
  return tf.raw_ops.ApplyGradientDescent(var=var, alpha=alpha, delta=delta)


def _value_after(op, var):
  """var's value after `op` (one of the fused kernels above) updated it."""
  if _is_resource(var):
    with tf.control_dependencies([op]):
      return var.read_value()
  return op


class AdamWeightDecayOptimizer(_WeightDecayOptimizer):
  """Adam with decoupled weight decay and no bias correction, as Google BERT trains:
  param -= lr * (next_m / (sqrt(next_v) + epsilon) + weight_decay_rate * param)."""

  def __init__(self, learning_rate, **kwargs):
    kwargs.setdefault("name", "AdamWeightDecayOptimizer")
    super(AdamWeightDecayOptimizer, self).__init__(learning_rate, **kwargs)

  def _scalars(self, step):
    del step
    return {"direction_scale": tf.constant(1.0), "direction_epsilon": self.epsilon,
            # Powers of 0: ApplyAdam's bias correction factor is 1.
            "beta_1_power": tf.constant(0.0), "beta_2_power": tf.constant(0.0)}

  def _fused_update(self, grad, param, m, v, decay, scalars):
    target = param
    decayed = []
    if decay:
      # The decay first, from the weights before the update: param *= 1 - lr * decay
      # rate. In place: not before the gradient, which the forward pass's reads of the
      # weights precede.
      with tf.control_dependencies([grad]):
        decayed = [_apply_gradient_descent(
            param, self.learning_rate * self.weight_decay_rate, param)]
      target = param if _is_resource(param) else decayed[0]
    with tf.control_dependencies(decayed):
      return _apply_adam(target, m, v, grad, self.learning_rate, scalars, self.epsilon,
                         self.beta_1, self.beta_2)

  def _step_size(self, param, update):
    del param, update
    return self.learning_rate


class LAMBOptimizer(_WeightDecayOptimizer):
  """LAMB (You et al., 2019), the MLPerf BERT optimizer.

  The Adam direction (with bias correction) plus weight decay is scaled per variable by
  the trust ratio ||param|| / ||update||, so every layer moves by a similar fraction of
  its weights whatever its gradient scale.

  Variables whose name matches exclude_from_layer_adaptation keep a trust ratio of 1
  (MLPerf's reference passes the weight-decay exclusions: LayerNorm and bias).

  Without our kernel, TensorFlow's fused kernels write the update into a scratch
  variable <variable>/lamb_update (a local variable, not saved: one more float32 copy of
  the weights in memory), take its norm, then move the weights; BertLambApply recomputes
  the update in its second pass instead.
  """

  def __init__(self, learning_rate, exclude_from_layer_adaptation=None, **kwargs):
    kwargs.setdefault("name", "LAMBOptimizer")
    super(LAMBOptimizer, self).__init__(learning_rate, **kwargs)
    self.exclude_from_layer_adaptation = exclude_from_layer_adaptation or []

  def _create_scratch(self, param):
    # Written by every update before it is read: no initializer needs to run.
    with tf.variable_scope(tf.get_variable_scope(), reuse=tf.AUTO_REUSE):
      return tf.get_variable(name=checkpoints.variable_name(param) + "/lamb_update",
                             shape=param.shape.as_list(), dtype=tf.float32, trainable=False,
                             initializer=tf.zeros_initializer(),
                             collections=[tf.GraphKeys.LOCAL_VARIABLES])

  def _scalars(self, step):
    beta_1_power = tf.pow(tf.constant(self.beta_1), step)
    beta_2_power = tf.pow(tf.constant(self.beta_2), step)
    v_correction = tf.sqrt(1.0 - beta_2_power)
    # m_hat / (sqrt(v_hat) + eps) = next_m * (sqrt(1 - b2^t) / (1 - b1^t))
    #                                / (sqrt(next_v) + eps * sqrt(1 - b2^t))
    return {"direction_scale": v_correction / (1.0 - beta_1_power),
            "direction_epsilon": self.epsilon * v_correction,
            "beta_1_power": beta_1_power, "beta_2_power": beta_2_power}

  def _fused_update(self, grad, param, m, v, decay, scalars):
    scratch = self._create_scratch(param)
    start = self.weight_decay_rate * param if decay else tf.zeros_like(param)
    started = scratch.assign(start)
    target = scratch if _is_resource(scratch) else started
    with tf.control_dependencies([started]):
      # scratch += the Adam direction (ApplyAdam with a learning rate of -1).
      moved = _apply_adam(target, m, v, grad, -1.0, scalars, scalars["direction_epsilon"],
                          self.beta_1, self.beta_2)
    update = _value_after(moved, scratch)
    return _apply_gradient_descent(param, self._step_size(param, update), update)

  def _adapts(self, param):
    return not any(re.search(r, checkpoints.variable_name(param))
                   for r in self.exclude_from_layer_adaptation)

  def _step_size(self, param, update):
    if not self._adapts(param):
      return self.learning_rate
    param_norm = tf.sqrt(2.0 * tf.nn.l2_loss(param))
    update_norm = tf.sqrt(2.0 * tf.nn.l2_loss(update))
    # 1 where either norm is 0 (a zero-initialized bias, or no gradient yet).
    trust_ratio = tf.where(tf.greater(param_norm, 0.0),
                           tf.where(tf.greater(update_norm, 0.0),
                                    param_norm / update_norm, 1.0), 1.0)
    return trust_ratio * self.learning_rate


class DynamicLossScale(object):
  """Dynamic loss scaling state for float16 training (variables in the graph)."""

  def __init__(self, initial_scale=_DEFAULTS.init_loss_scale, growth_interval=1000):
    with tf.variable_scope("loss_scale"):
      self.scale = tf.get_variable("scale", initializer=float(initial_scale), trainable=False)
      self.good_steps = tf.get_variable("good_steps", shape=[], dtype=tf.int64,
                                        initializer=tf.zeros_initializer(), trainable=False)
      self.skipped_steps = tf.get_variable("skipped_steps", shape=[], dtype=tf.int64,
                                           initializer=tf.zeros_initializer(), trainable=False)
    self.growth_interval = growth_interval

  def update(self, all_finite):
    """Returns the op that grows, keeps or halves the scale after a step."""
    grow = tf.logical_and(all_finite, self.good_steps + 1 >= self.growth_interval)
    new_scale = tf.where(grow, self.scale * 2.0,
                         tf.where(all_finite, self.scale, tf.maximum(self.scale * 0.5, 1.0)))
    new_good_steps = tf.where(tf.logical_and(all_finite, tf.logical_not(grow)),
                              self.good_steps + 1, tf.zeros_like(self.good_steps))
    new_skipped = self.skipped_steps + tf.cast(tf.logical_not(all_finite), tf.int64)
    return tf.group(self.scale.assign(new_scale), self.good_steps.assign(new_good_steps),
                    self.skipped_steps.assign(new_skipped))


def create_optimizer(optimizer_name, learning_rate,
                     weight_decay_rate=_DEFAULTS.weight_decay_rate, beta_1=_DEFAULTS.beta_1,
                     beta_2=_DEFAULTS.beta_2, epsilon=_DEFAULTS.epsilon,
                     adapt_every_variable=_DEFAULTS.lamb_adapt_layernorm_and_bias):
  """Returns the LAMBOptimizer ("lamb") or AdamWeightDecayOptimizer ("adam").

  adapt_every_variable: (LAMB) the trust ratio for LayerNorm and bias variables too, as
  NVIDIA's LAMB does; by default they keep a ratio of 1, as in MLPerf's reference.
  """
  kwargs = dict(weight_decay_rate=weight_decay_rate, beta_1=beta_1, beta_2=beta_2,
                epsilon=epsilon, exclude_from_weight_decay=EXCLUDE_FROM_WEIGHT_DECAY)
  if optimizer_name == "lamb":
    excluded = None if adapt_every_variable else EXCLUDE_FROM_WEIGHT_DECAY
    return LAMBOptimizer(learning_rate, exclude_from_layer_adaptation=excluded, **kwargs)
  if optimizer_name == "adam":
    return AdamWeightDecayOptimizer(learning_rate, **kwargs)
  raise ValueError("unknown optimizer %r; use --optimizer=lamb or --optimizer=adam"
                   % optimizer_name)


def create_train_ops(loss, optimizer, global_step, num_accumulation_steps=1,
                     allreduce_fn=None, loss_scale=None, clip_norm=1.0,
                     pre_accumulation_fn=None, clipping=_DEFAULTS.gradient_clipping):
  """Builds the ops of one training step.

  Args:
    loss: float32 scalar Tensor, the loss of one micro-batch.
    optimizer: an optimizer from create_optimizer.
    global_step: int64 variable, incremented once per update applied. An update that
      loss scaling skips (a non-finite gradient) does not count: global_step and with
      it the learning-rate schedule stay where they were, as in NVIDIA's recipe.
    num_accumulation_steps: micro-batches per update (k).
    allreduce_fn: (optional) function list of gradients -> list of gradients summed
      (or averaged) over the ranks; applied once per update, after accumulation.
    loss_scale: (optional) DynamicLossScale, for float16 compute.
    clip_norm: gradients are clipped to this global norm before the update.
    pre_accumulation_fn: (optional) like allreduce_fn, but applied to every
      micro-batch's gradients before they are accumulated.
    clipping: CLIP_PER_MICRO_BATCH (MLPerf's reference): each micro-batch's gradient on
      this replica, before accumulation and the all-reduce; CLIP_AFTER_ALLREDUCE: the
      mean gradient of the update, after accumulation and the all-reduce.

  Returns:
    (accumulate_op, update_op): run accumulate_op k-1 times, then update_op once.
    accumulate_op is None when k == 1. Each consumes one micro-batch. update_op
    averages the k gradients, all-reduces, applies them and increments global_step
    (with loss scaling: only if they are finite; the scale is updated either way).
    Read global_step after it to know whether the update was applied.
  """
  if clipping not in CLIPPING:
    raise ValueError("unknown gradient clipping %r; use one of %s" % (clipping, CLIPPING))
  tvars = tf.trainable_variables()
  scaled_loss = loss * loss_scale.scale if loss_scale is not None else loss
  grads = tf.gradients(scaled_loss, tvars)
  grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, tvars)]
  grads = [tf.cast(g, tf.float32) for g in grads]
  all_finite = None
  # The micro-batch's gradient is factor * grads; the next pass over each gradient
  # (accumulate_op's, or the update's) applies the factor instead of a product of its own.
  factor = None
  if clipping == CLIP_PER_MICRO_BATCH:
    with tf.name_scope("clip_micro_batch"):
      (factor, all_finite) = _clip_factor(grads, clip_norm, loss_scale)
  if pre_accumulation_fn is not None or (num_accumulation_steps == 1 and allreduce_fn):
    (grads, factor) = (_scaled(grads, factor), None)
  if pre_accumulation_fn is not None:
    grads = pre_accumulation_fn(grads)

  (accumulate_op, accumulators) = (None, [])
  if num_accumulation_steps > 1:
    (accumulate_op, accumulators, grads) = _accumulation(tvars, grads, factor,
                                                         num_accumulation_steps)
    factor = None

  if allreduce_fn is not None:
    grads = allreduce_fn(grads)

  def apply_update(grads, grad_scale, applied=None):
    apply_op = optimizer.apply_gradients(list(zip(grads, tvars)), global_step=global_step,
                                         applied=applied, grad_scale=grad_scale)
    with tf.control_dependencies([apply_op]):
      step = 1 if applied is None else tf.cast(applied, tf.int64)
      return tf.identity(global_step.assign_add(step))

  with tf.name_scope("optimizer"):
    if clipping == CLIP_AFTER_ALLREDUCE:
      (factor, all_finite) = _clip_factor(grads, clip_norm, loss_scale)
    elif loss_scale is not None and (
        num_accumulation_steps > 1 or allreduce_fn or pre_accumulation_fn):
      # A micro-batch that overflowed (here or on another rank) left NaN in the sum.
      all_finite = tf.is_finite(tf.global_norm(grads))
    if loss_scale is None:
      new_step = apply_update(grads, factor)
    else:
      optimizer.create_slots(tvars)
      if tf.distribute.has_strategy():
        # A tf.distribute strategy's assignments (merge_call) inside tf.cond leave the
        # cond's context on the graph (TensorFlow 1.15 and 2.15): select instead.
        new_step = apply_update(grads, factor, applied=all_finite)
      else:
        # A step that overflowed runs no update at all, so it costs no pass over the
        # weights.
        new_step = tf.cond(all_finite, lambda: apply_update(grads, factor),
                           lambda: tf.identity(global_step))
  # After the update has read them: the loss scale and the accumulators move on, also
  # when the update was skipped.
  with tf.control_dependencies([new_step]):
    after_update = [tf.no_op()]
    if loss_scale is not None:
      after_update.append(loss_scale.update(all_finite))
    after_update.extend(a.assign(tf.zeros_like(a)) for a in accumulators)
    update_op = tf.group(*after_update)
  return accumulate_op, update_op


def _accumulation(tvars, grads, factor, num_accumulation_steps):
  """The float32 accumulators of tvars' gradients and the op that adds a micro-batch's
  factor * grads (grads when factor is None) to them.

  Returns:
    (accumulate_op, accumulators, mean): mean is the update's mean gradient, the
    accumulators' sum with this micro-batch's gradients added.
  """
  # ON_READ: under a tf.distribute strategy each replica sums its own gradients.
  with tf.variable_scope("gradient_accumulation"):
    accumulators = [tf.get_variable(checkpoints.variable_name(v).replace("/", "_"),
                                    shape=v.shape.as_list(), dtype=tf.float32,
                                    trainable=False, initializer=tf.zeros_initializer(),
                                    collections=[tf.GraphKeys.LOCAL_VARIABLES],
                                    synchronization=tf.VariableSynchronization.ON_READ,
                                    aggregation=tf.VariableAggregation.SUM)
                    for v in tvars]
  (accumulate_ops, mean) = ([], [])
  (scale, alpha) = (1.0, None) if factor is None else (factor, -factor)
  for a, g in zip(accumulators, grads):
    # The last micro-batch is added in the update itself, then the sum is averaged.
    half = precision.cast_source(g)
    if half is not None and not _is_resource(a) and not tf.distribute.has_strategy():
      # A gradient the backward pass computed in bfloat16 is added as it is, in place:
      # the same bits as the ops below take from its float32 cast.
      fused = kernels.load()
      (accumulate, last) = (fused.bert_accumulate(a, half, scale),
                            fused.bert_accumulate(a, half, scale))
    elif factor is None:
      (accumulate, last) = (a.assign_add(g), a + g)
    else:
      # a += factor * g in one pass over a and g.
      (accumulate, last) = (_apply_gradient_descent(a, alpha, g), a + g * factor)
    accumulate_ops.append(accumulate)
    mean.append(last / float(num_accumulation_steps))
  return tf.group(*accumulate_ops), accumulators, mean


def _clip_factor(grads, clip_norm, loss_scale=None):
  """The factor that clips the gradients to the global norm clip_norm and divides them
  by the loss scale; without one, as tf.clip_by_global_norm computes it.

  One pass over the scaled gradients gives their norm, which is finite only if every
  gradient is; the factor is NaN where it is not, so that a sum of the gradients stays
  non-finite.

  Returns:
    (float32 scalar Tensor, all_finite): all_finite is a bool scalar Tensor with a loss
    scale, None without one.
  """
  scaled_norm = _global_norm(grads)
  if loss_scale is None:
    factor = clip_norm * tf.minimum(1.0 / scaled_norm, tf.constant(1.0) / clip_norm)
    return factor + (scaled_norm - scaled_norm), None
  all_finite = tf.is_finite(scaled_norm)
  norm = scaled_norm / loss_scale.scale
  factor = clip_norm / tf.maximum(norm, clip_norm) / loss_scale.scale
  return tf.where(all_finite, factor, tf.constant(float("nan"))), all_finite


def _global_norm(grads):
  """tf.global_norm(grads), dense Tensors. A gradient cast from bfloat16 by a kernel
  (precision.cast_source) is read before the cast, its squares summed by BertSquareSum:
  half the bytes, and an update that reads it so too never runs the cast."""
  half_squares = []
  for grad in grads:
    half = precision.cast_source(grad)
    half_squares.append(tf.nn.l2_loss(grad) if half is None else
                        0.5 * kernels.load().bert_square_sum(half))
  # As tf.global_norm adds them.
  return tf.sqrt(tf.reduce_sum(tf.stack(half_squares)) * 2.0)


def _scaled(grads, factor):
  """grads * factor; grads when factor is None."""
  return grads if factor is None else [g * factor for g in grads]
