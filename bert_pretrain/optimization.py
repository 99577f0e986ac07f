"""Optimizers, learning-rate schedule and the training ops of BERT pretraining.

- LAMB (layer-wise adaptive moments, the MLPerf optimizer) and Adam with decoupled
  weight decay (Google BERT's AdamWeightDecay); weight decay is not applied to LayerNorm
  and bias variables. Their moment slots are named <variable>/adam_m and
  <variable>/adam_v as in Google BERT checkpoints.
- Linear warm-up from --start_warmup_step, then polynomial decay to 0.
- Gradient clipping by global norm 1.0.
- Gradient accumulation: k micro-batches are summed in float32 accumulators and applied
  as one update of their mean, so k micro-batches of b give the update of one batch kb.
  The all-reduce across ranks (Horovod) happens once, after accumulation.
- Dynamic loss scaling for float16: start 2^15, x2 after 1000 finite steps, a step
  with a non-finite gradient is skipped (weights, slots and global_step unchanged)
  and halves the scale.
"""

import re

import tensorflow.compat.v1 as tf

from bert_pretrain import checkpoints

EXCLUDE_FROM_WEIGHT_DECAY = ["LayerNorm", "layer_norm", "bias"]


def learning_rate_schedule(global_step, init_lr, num_train_steps, num_warmup_steps,
                           poly_power=1.0, start_warmup_step=0):
  """The learning rate at `global_step`: linear warm-up, then polynomial decay to 0.

  Args:
    global_step: int64 scalar Tensor, the number of updates done so far.
    init_lr: peak learning rate, reached at the end of warm-up.
    num_train_steps: the step at which the decay reaches 0.
    num_warmup_steps: length of the linear warm-up (0: none).
    poly_power: power of the polynomial decay (1.0 is linear).
    start_warmup_step: the warm-up starts at this step (MLPerf's start_warmup_step).

  Returns:
    float32 scalar Tensor.
  """
  step = tf.cast(global_step, tf.float32)
  decay_fraction = 1.0 - tf.minimum(step, float(num_train_steps)) / float(max(num_train_steps, 1))
  decayed_lr = init_lr * tf.pow(decay_fraction, poly_power)
  if not num_warmup_steps:
    return decayed_lr
  warmup_step = step - float(start_warmup_step)
  warmup_lr = init_lr * tf.maximum(warmup_step, 0.0) / float(num_warmup_steps)
  return tf.where(warmup_step < float(num_warmup_steps), warmup_lr, decayed_lr)


class _WeightDecayOptimizer(tf.train.Optimizer):
  """Common part of LAMB and AdamWeightDecay: slots and weight-decay exclusions."""

  def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999,
               epsilon=1e-6, exclude_from_weight_decay=None, name="WeightDecayOptimizer"):
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
    for param in variables:
      with tf.variable_scope(tf.get_variable_scope(), reuse=tf.AUTO_REUSE):
        slots.append(tuple(
            tf.get_variable(name=checkpoints.variable_name(param) + suffix,
                            shape=param.shape.as_list(), dtype=tf.float32, trainable=False,
                            initializer=tf.zeros_initializer())
            for suffix in ("/adam_m", "/adam_v")))
    return slots

  def apply_gradients(self, grads_and_vars, global_step=None, name=None, applied=None):
    """Applies the gradients; returns the group of assign ops.

    Args:
      grads_and_vars: list of (gradient, variable); None gradients are skipped.
      global_step: int64 variable, the number of updates applied so far (LAMB's bias
        correction); it is not incremented here (create_train_ops does).
      name: unused, for the tf.train.Optimizer signature.
      applied: (optional) bool scalar Tensor; where false, the variables and slots keep
        their values (a skipped update, without tf.cond).
    """
    del name
    step = tf.cast(global_step, tf.float32) + 1.0
    pairs = [(g, p) for (g, p) in grads_and_vars if g is not None and p is not None]
    assignments = []
    for (grad, param), (m, v) in zip(pairs, self.create_slots([p for _, p in pairs])):
      next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
      next_v = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(grad)
      update = self._update_direction(next_m, next_v, step)
      if self._do_use_weight_decay(checkpoints.variable_name(param)):
        update += self.weight_decay_rate * param
      next_param = param - self._step_size(param, update) * update
      if applied is not None:
        (next_param, next_m, next_v) = [tf.where(applied, new, old) for new, old in
                                        ((next_param, param), (next_m, m), (next_v, v))]
      assignments.extend([param.assign(next_param), m.assign(next_m), v.assign(next_v)])
    return tf.group(*assignments)

  def _update_direction(self, next_m, next_v, step):
    raise NotImplementedError()

  def _step_size(self, param, update):
    raise NotImplementedError()

  def _do_use_weight_decay(self, param_name):
    """Whether to use L2 weight decay for `param_name`."""
    if not self.weight_decay_rate:
      return False
    for r in self.exclude_from_weight_decay or []:
      if re.search(r, param_name) is not None:
        return False
    return True



class AdamWeightDecayOptimizer(_WeightDecayOptimizer):
  """Adam with decoupled weight decay and no bias correction, as Google BERT trains."""

  def __init__(self, learning_rate, **kwargs):
    kwargs.setdefault("name", "AdamWeightDecayOptimizer")
    super(AdamWeightDecayOptimizer, self).__init__(learning_rate, **kwargs)

  def _update_direction(self, next_m, next_v, step):
    del step
    return next_m / (tf.sqrt(next_v) + self.epsilon)

  def _step_size(self, param, update):
    del param, update
    return self.learning_rate


class LAMBOptimizer(_WeightDecayOptimizer):
  """LAMB (You et al., 2019), the MLPerf BERT optimizer.

  The Adam direction (with bias correction) plus weight decay is scaled per variable by
  the trust ratio ||param|| / ||update||, so every layer moves by a similar fraction of
  its weights whatever its gradient scale.
  """

  def __init__(self, learning_rate, **kwargs):
    kwargs.setdefault("name", "LAMBOptimizer")
    super(LAMBOptimizer, self).__init__(learning_rate, **kwargs)

  def _update_direction(self, next_m, next_v, step):
    m_hat = next_m / (1.0 - tf.pow(self.beta_1, step))
    v_hat = next_v / (1.0 - tf.pow(self.beta_2, step))
    return m_hat / (tf.sqrt(v_hat) + self.epsilon)

  def _step_size(self, param, update):
    param_norm = tf.norm(param)
    update_norm = tf.norm(update)
    trust_ratio = tf.where(tf.greater(param_norm, 0.0),
                           tf.where(tf.greater(update_norm, 0.0),
                                    param_norm / update_norm, 1.0), 1.0)
    return trust_ratio * self.learning_rate


class DynamicLossScale(object):
  """Dynamic loss scaling state for float16 training (variables in the graph)."""

  def __init__(self, initial_scale=2.0 ** 15, growth_interval=1000):
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


def create_optimizer(optimizer_name, learning_rate, weight_decay_rate=0.01, beta_1=0.9,
                     beta_2=0.999, epsilon=1e-6):
  """Returns the LAMBOptimizer ("lamb") or AdamWeightDecayOptimizer ("adam")."""
  kwargs = dict(weight_decay_rate=weight_decay_rate, beta_1=beta_1, beta_2=beta_2,
                epsilon=epsilon, exclude_from_weight_decay=EXCLUDE_FROM_WEIGHT_DECAY)
  if optimizer_name == "lamb":
    return LAMBOptimizer(learning_rate, **kwargs)
  if optimizer_name == "adam":
    return AdamWeightDecayOptimizer(learning_rate, **kwargs)
  raise ValueError("unknown optimizer %r; use --optimizer=lamb or --optimizer=adam"
                   % optimizer_name)


def create_train_ops(loss, optimizer, global_step, num_accumulation_steps=1,
                     allreduce_fn=None, loss_scale=None, clip_norm=1.0,
                     pre_accumulation_fn=None, compile_optimizer=False):
  """Builds the ops of one training step.

  Args:
    loss: float32 scalar Tensor, the loss of one micro-batch.
    optimizer: an optimizer from create_optimizer.
    global_step: int64 variable, incremented once per update applied. An update that
      loss scaling skips (a non-finite gradient) does not count: global_step and with
      it the learning-rate schedule stay where they were, as in NVIDIA's recipe.
    num_accumulation_steps: micro-batches per update (k).
    allreduce_fn: (optional) function list of gradients -> list of gradients averaged
      over the ranks (Horovod); applied once per update, after accumulation.
    loss_scale: (optional) DynamicLossScale, for float16 compute.
    clip_norm: gradients are clipped to this global norm before the update.
    pre_accumulation_fn: (optional) like allreduce_fn, but applied to every
      micro-batch's gradients before they are accumulated.
    compile_optimizer: compile the clipping and update math with XLA, which fuses the
      optimizer's many elementwise passes over the weights into a few loops.

  Returns:
    (accumulate_op, update_op): run accumulate_op k-1 times, then update_op once.
    accumulate_op is None when k == 1. Each consumes one micro-batch. update_op
    averages the k gradients, all-reduces, clips, applies them and increments
    global_step (with loss scaling: only if they are finite; the scale is updated
    either way). Read global_step after it to know whether the update was applied.
  """
  tvars = tf.trainable_variables()
  scaled_loss = loss * loss_scale.scale if loss_scale is not None else loss
  grads = tf.gradients(scaled_loss, tvars)
  grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, tvars)]
  grads = [tf.cast(g, tf.float32) for g in grads]
  if pre_accumulation_fn is not None:
    grads = pre_accumulation_fn(grads)

  accumulate_op = None
  if num_accumulation_steps > 1:
    # ON_READ: under a tf.distribute strategy each replica sums its own gradients.
    with tf.variable_scope("gradient_accumulation"):
      accumulators = [tf.get_variable(checkpoints.variable_name(v).replace("/", "_"),
                                      shape=v.shape.as_list(), dtype=tf.float32,
                                      trainable=False, initializer=tf.zeros_initializer(),
                                      collections=[tf.GraphKeys.LOCAL_VARIABLES],
                                      synchronization=tf.VariableSynchronization.ON_READ,
                                      aggregation=tf.VariableAggregation.SUM)
                      for v in tvars]
    accumulate_op = tf.group(*[a.assign_add(g) for a, g in zip(accumulators, grads)])
    # The last micro-batch is added in the update itself, then the sum is averaged.
    grads = [(a + g) / float(num_accumulation_steps) for a, g in zip(accumulators, grads)]

  if allreduce_fn is not None:
    grads = allreduce_fn(grads)

  def apply_update(grads, applied=None):
    apply_op = optimizer.apply_gradients(list(zip(grads, tvars)), global_step=global_step,
                                         applied=applied)
    with tf.control_dependencies([apply_op]):
      step = 1 if applied is None else tf.cast(applied, tf.int64)
      return tf.identity(global_step.assign_add(step))

  with tf.name_scope("optimizer"), tf.xla.experimental.jit_scope(compile_ops=compile_optimizer):
    if loss_scale is None:
      (grads, _) = tf.clip_by_global_norm(grads, clip_norm=clip_norm)
      new_step = apply_update(grads)
    else:
      # One pass over the scaled gradients gives their norm, which is finite only if
      # every gradient is; unscaling is folded into the clipping factor. A step that
      # overflowed runs no update at all (tf.cond), so it costs no pass over the weights.
      optimizer.create_slots(tvars)
      scaled_norm = tf.global_norm(grads)
      all_finite = tf.is_finite(scaled_norm)
      norm = scaled_norm / loss_scale.scale
      factor = clip_norm / tf.maximum(norm, clip_norm) / loss_scale.scale
      if tf.distribute.has_strategy():
        # A tf.distribute strategy's assignments (merge_call) inside tf.cond leave the
        # cond's context on the graph (TensorFlow 1.15 and 2.15): select instead.
        new_step = apply_update([g * factor for g in grads], applied=all_finite)
      else:
        new_step = tf.cond(all_finite, lambda: apply_update([g * factor for g in grads]),
                           lambda: tf.identity(global_step))
  # After the update has read them: the loss scale and the accumulators move on, also
  # when the update was skipped.
  with tf.control_dependencies([new_step]):
    after_update = [tf.no_op()]
    if loss_scale is not None:
      after_update.append(loss_scale.update(all_finite))
    if num_accumulation_steps > 1:
      after_update.extend(a.assign(tf.zeros_like(a)) for a in accumulators)
    update_op = tf.group(*after_update)
  return accumulate_op, update_op
