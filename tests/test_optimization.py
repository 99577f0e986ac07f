"""Optimizers, schedule, accumulation and loss scaling, checked against numpy."""

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain.model import kernels, modeling, precision
from bert_pretrain.training import optimization
from bert_pretrain.training import pretraining

# The three ways a variable is updated: our kernel (in place, where it is built), then
# TensorFlow's fused kernels (in place, where ours is not), then plain ops and
# assignments (under a tf.distribute strategy, or where an update may be skipped).
UPDATES = ("BertLambApply", "TensorFlow's kernels", "plain ops")


@pytest.fixture(params=UPDATES)
def update_path(request, monkeypatch):
  """Each of UPDATES in turn: our kernel not loaded for TensorFlow's, else built as
  init_tf.sh builds it (the plain ops' path must leave it aside)."""
  if request.param == UPDATES[1]:
    monkeypatch.setattr(kernels, "_loaded", {kernels.library_path(): "off"})
  else:
    kernels.build()
    assert kernels.load() is not None, kernels.why_unavailable()
  return request.param


def schedule_values(steps, **kwargs):
  with tf.Graph().as_default():
    step = tf.placeholder(tf.int64, [])
    lr = optimization.learning_rate_schedule(step, **kwargs)
    with tf.Session() as sess:
      return [float(sess.run(lr, {step: s})) for s in steps]


def test_warmup_then_polynomial_decay():
  got = schedule_values([0, 5, 10, 55, 100, 150], init_lr=1.0, num_train_steps=100,
                        num_warmup_steps=10)
  np.testing.assert_allclose(got, [0.0, 0.5, 0.9, 0.45, 0.0, 0.0], atol=1e-6)
  got = schedule_values([50], init_lr=1.0, num_train_steps=100, num_warmup_steps=0,
                        poly_power=2.0)
  np.testing.assert_allclose(got, [0.25], atol=1e-6)
  # MLPerf's start_warmup_step shifts the warm-up: nothing before it.
  got = schedule_values([0, 10, 15], init_lr=1.0, num_train_steps=100, num_warmup_steps=10,
                        start_warmup_step=10)
  np.testing.assert_allclose(got, [0.0, 0.0, 0.5], atol=1e-6)


def reference_schedule_values(steps, init_lr, num_train_steps, num_warmup_steps, poly_power,
                              start_warmup_step):
  """The learning rate as MLPerf's reference computes it (optimization.create_optimizer):
  TensorFlow's polynomial_decay, then the warm-up from integer steps, blended by a 0/1
  float."""
  with tf.Graph().as_default():
    step = tf.placeholder(tf.int64, [])
    decayed = tf.train.polynomial_decay(tf.constant(init_lr, tf.float32), step,
                                        num_train_steps, end_learning_rate=0.0,
                                        power=poly_power, cycle=False)
    done = tf.cast(tf.cast(step, tf.int32) - start_warmup_step, tf.float32)
    warmup = init_lr * (done / tf.cast(num_warmup_steps, tf.float32))
    is_warmup = tf.cast(done < num_warmup_steps, tf.float32)
    lr = (1.0 - is_warmup) * decayed + is_warmup * warmup
    with tf.Session() as sess:
      return [float(sess.run(lr, {step: s})) for s in steps]


# MLPerf's reference convergence points (learning rate, updates, warm-up, start_warmup_step).
RCP_SCHEDULES = ((0.00288293, 600, 287, -76), (0.0033, 600, 290, -100),
                 (0.002, 1141, 100, 0), (1e-4, 107538, 1562, 0))


@pytest.mark.parametrize("init_lr,updates,warmup,start", RCP_SCHEDULES)
def test_the_schedule_equals_the_references_bit_for_bit(init_lr, updates, warmup, start):
  steps = sorted(set(range(0, 2 * warmup + 5)) | set(range(updates - 5, updates + 3)) |
                 set(range(0, updates, max(1, updates // 200))))
  ours = schedule_values(steps, init_lr=init_lr, num_train_steps=updates,
                         num_warmup_steps=warmup, start_warmup_step=start)
  assert ours == reference_schedule_values(steps, init_lr, updates, warmup, 1.0, start)


@pytest.mark.parametrize("init_lr,updates,warmup,start", RCP_SCHEDULES[:3])
def test_with_accumulation_the_schedule_steps_per_micro_batch_as_the_reference(
    init_lr, updates, warmup, start):
  """The reference with k micro-batches an update counts micro-batches, its step counts
  scaled by k, and update u reads the value at its last micro-batch, u * k + k - 1."""
  k = 4
  updates_seen = list(range(0, 2 * warmup + 5)) + list(range(updates - 5, updates + 1))
  ours = schedule_values(updates_seen, init_lr=init_lr, num_train_steps=updates,
                         num_warmup_steps=warmup, start_warmup_step=start, micro_batches=k)
  reference = reference_schedule_values([u * k + k - 1 for u in updates_seen], init_lr,
                                        updates * k, warmup * k, 1.0, start * k)
  assert ours == reference
  # Not the schedule of updates: the first update of the warm-up already moves.
  per_update = schedule_values(updates_seen, init_lr=init_lr, num_train_steps=updates,
                               num_warmup_steps=warmup, start_warmup_step=start)
  assert ours != per_update


# 1 - beta in float32, as TensorFlow's fused ApplyAdam kernel computes it.
ONE_MINUS_B1 = float(np.float32(1) - np.float32(0.9))
ONE_MINUS_B2 = float(np.float32(1) - np.float32(0.999))


def numpy_lamb_step(w, g, m, v, step, lr, wd, b1=0.9, b2=0.999, eps=1e-6, adapt=True):
  """LAMB as MLPerf's reference writes it; adapt=False: trust ratio 1."""
  m = m + (g - m) * ONE_MINUS_B1
  v = v + (g * g - v) * ONE_MINUS_B2
  update = (m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps) + wd * w
  ratio = np.linalg.norm(w) / np.linalg.norm(update) if adapt else 1.0
  return w - lr * ratio * update, m, v


# A variable of each class: (name, initial value, gradient). Kernels and embeddings take
# weight decay and the trust ratio; biases and LayerNorm's gamma and beta take neither in
# MLPerf's reference LAMB, while NVIDIA's LAMB gives every variable the trust ratio.
VARIABLES = (
    ("layer/kernel", [[0.5, -1.0], [2.0, 0.25]], [[0.1, 0.2], [-0.3, 0.05]]),
    ("embeddings/word_embeddings", [[0.02, -0.01], [0.03, 0.04]], [[0.5, -0.1], [0.0, 0.2]]),
    ("layer/bias", [0.3, -0.2], [0.1, 0.2]),
    ("layer/LayerNorm/gamma", [1.0, 0.9], [0.02, -0.05]),
    ("layer/LayerNorm/beta", [0.01, -0.02], [-0.4, 0.3]),
)
DECAYED = ("layer/kernel", "embeddings/word_embeddings")


def one_update(name, update_path, adapt_every_variable=False):
  """{variable name: value} after one update of VARIABLES (lr 0.1, weight decay 0.01),
  the way update_path (one of UPDATES) says."""
  with tf.Graph().as_default():
    pairs = [(tf.constant(np.array(g, np.float32)),
              tf.get_variable(n, initializer=np.array(w0, np.float32)))
             for n, w0, g in VARIABLES]
    step = tf.train.get_or_create_global_step()
    opt = optimization.create_optimizer(name, 0.1, weight_decay_rate=0.01,
                                        adapt_every_variable=adapt_every_variable)
    op = opt.apply_gradients(pairs, global_step=step,
                             applied=tf.constant(True) if update_path == UPDATES[2] else None)
    ops = {o.type for o in tf.get_default_graph().get_operations()}
    assert ("BertLambApply" in ops) == (update_path == UPDATES[0]), ops
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(op)
      values = sess.run({v.op.name: v for v in tf.global_variables()})
  return values


@pytest.mark.parametrize("name", ["lamb", "adam"])
def test_one_update_matches_numpy(name, update_path):
  """Our kernel, TensorFlow's fused kernels and the plain ops compute the same update,
  for every class of variable."""
  values = one_update(name, update_path)
  for var_name, w0, g in VARIABLES:
    w0, g = np.array(w0, np.float32), np.array(g, np.float32)
    wd = 0.01 if var_name in DECAYED else 0.0
    if name == "lamb":
      want, _, _ = numpy_lamb_step(w0, g, 0, 0, 1, 0.1, wd, adapt=var_name in DECAYED)
    else:
      m, v = ONE_MINUS_B1 * g, ONE_MINUS_B2 * g * g
      want = w0 - 0.1 * (m / (np.sqrt(v) + 1e-6) + wd * w0)
    np.testing.assert_allclose(values[var_name], want, rtol=1e-5, err_msg=var_name)
  # Slots are named as in Google BERT checkpoints.
  assert "layer/kernel/adam_m" in values and "layer/kernel/adam_v" in values


def test_lambs_scratch_copy_of_the_weights_exists_only_for_tensorflows_kernels(update_path):
  """BertLambApply recomputes the update instead of keeping it: only TensorFlow's fused
  kernels need the scratch variables <variable>/lamb_update (one more copy of the
  weights in memory)."""
  with tf.Graph().as_default():
    pairs = [(tf.constant(np.array(g, np.float32)),
              tf.get_variable(n, initializer=np.array(w0, np.float32)))
             for n, w0, g in VARIABLES]
    optimization.create_optimizer("lamb", 0.1).apply_gradients(
        pairs, global_step=tf.train.get_or_create_global_step(),
        applied=tf.constant(True) if update_path == UPDATES[2] else None)
    scratch = [v.op.name for v in tf.local_variables() if v.op.name.endswith("/lamb_update")]
  assert len(scratch) == (len(VARIABLES) if update_path == UPDATES[1] else 0), scratch


def test_lamb_adapts_layernorm_and_bias_only_when_asked(update_path):
  """adapt_every_variable (NVIDIA's LAMB): the trust ratio for every variable; by default
  (MLPerf's reference) LayerNorm and bias variables keep a ratio of 1, so the two differ
  there and agree on kernels and embeddings."""
  reference = one_update("lamb", update_path)
  every = one_update("lamb", update_path, adapt_every_variable=True)
  for var_name, w0, g in VARIABLES:
    w0, g = np.array(w0, np.float32), np.array(g, np.float32)
    wd = 0.01 if var_name in DECAYED else 0.0
    want, _, _ = numpy_lamb_step(w0, g, 0, 0, 1, 0.1, wd, adapt=True)
    np.testing.assert_allclose(every[var_name], want, rtol=1e-5, err_msg=var_name)
    if var_name in DECAYED:
      np.testing.assert_array_equal(every[var_name], reference[var_name])
    else:
      assert np.abs(every[var_name] - reference[var_name]).max() > 1e-3, var_name


CONFIG = modeling.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=32,
                             max_position_embeddings=16, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0)


def _batches(batch_size):
  rng = np.random.RandomState(3)
  n, seq, preds = 16, 8, 3
  data = {
      "input_ids": rng.randint(1, 50, [n, seq]).astype(np.int32),
      "input_mask": np.ones([n, seq], np.int32),
      "segment_ids": (np.arange(seq) >= 4).astype(np.int32)[None].repeat(n, 0),
      "masked_lm_positions": rng.randint(0, seq, [n, preds]).astype(np.int32),
      "masked_lm_ids": rng.randint(1, 50, [n, preds]).astype(np.int32),
      # Full weights: every micro-batch has the same number of predictions, so the mean
      # of micro-batch losses is the loss of the whole batch.
      "masked_lm_weights": np.ones([n, preds], np.float32),
      "next_sentence_labels": rng.randint(0, 2, [n, 1]).astype(np.int32),
  }
  dataset = tf.data.Dataset.from_tensor_slices(data).batch(batch_size).repeat()
  return tf.data.make_one_shot_iterator(dataset).get_next()


def train_weights(batch_size, accumulation, updates=3, optimizer="lamb",
                  clipping=optimization.CLIP_AFTER_ALLREDUCE, compute_type=tf.float32,
                  ran_ops=None):
  """(global step, {variable name: value}) after `updates` updates; ran_ops: (optional) a
  list that takes the names of the ops the last update ran."""
  with tf.Graph().as_default():
    tf.set_random_seed(7)
    outputs = pretraining.build_model(CONFIG, _batches(batch_size), True, compute_type)
    step = tf.train.get_or_create_global_step()
    opt = optimization.create_optimizer(optimizer, 1e-2)
    accumulate, update = optimization.create_train_ops(outputs["total_loss"], opt, step,
                                                       accumulation, clipping=clipping)
    with tf.Session() as sess:
      sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
      for update_index in range(updates):
        for op in [accumulate] * (accumulation - 1) + [update]:
          if ran_ops is None or update_index < updates - 1:
            sess.run(op)
            continue
          (options, metadata) = (tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                                 tf.RunMetadata())
          sess.run(op, options=options, run_metadata=metadata)
          # TensorFlow 1.15 lists some as "name:type" too.
          ran_ops.extend(node.node_name.split(":")[0]
                         for device in metadata.step_stats.dev_stats
                         for node in device.node_stats)
      return sess.run((step, {v.op.name: v for v in tf.trainable_variables()}))


@pytest.mark.parametrize("optimizer", ["lamb", "adam"])
def test_accumulation_equals_a_larger_batch(optimizer):
  """With the gradients clipped after accumulation (CLIP_AFTER_ALLREDUCE), k micro-batches
  of b update as one batch of k*b. (Clipped per micro-batch, as MLPerf's reference does,
  they do not: test_both_clipping_orders_match_numpy.)"""
  step_big, big = train_weights(8, 1, optimizer=optimizer)
  step_acc, acc = train_weights(4, 2, optimizer=optimizer)
  step_4, four = train_weights(2, 4, optimizer=optimizer)
  assert step_big == step_acc == step_4 == 3
  initial_distance = 0.0
  for name in big:
    np.testing.assert_allclose(acc[name], big[name], rtol=2e-4, atol=2e-5, err_msg=name)
    np.testing.assert_allclose(four[name], big[name], rtol=2e-4, atol=2e-5, err_msg=name)
  # And the updates did move the weights (a no-op would pass the comparison too).
  _, small_batch = train_weights(4, 1, optimizer=optimizer)
  initial_distance = max(np.abs(small_batch[n] - big[n]).max() for n in big)
  assert initial_distance > 1e-4


@pytest.mark.parametrize("update_path", UPDATES[:2], indirect=True)
@pytest.mark.parametrize("optimizer", ["lamb", "adam"])
def test_the_in_place_kernels_train_a_model_as_the_plain_ops_do(optimizer, update_path,
                                                                monkeypatch):
  """Three updates of a real model: the in-place kernels (ours, or TensorFlow's) against
  the plain ops (the path under a strategy, taken here by passing `applied`). An in-place
  update that ran before the forward pass had read the weights (Adam's decay once did)
  differs by 1e-5 or more, and differently from run to run. The paths' own rounding
  differs by up to about 1.2e-6 at Adam's learning rate of 1e-2 (TensorFlow 1.15)."""
  fused = train_weights(8, 1, optimizer=optimizer)[1]
  again = train_weights(8, 1, optimizer=optimizer)[1]
  apply_gradients = optimization._WeightDecayOptimizer.apply_gradients
  monkeypatch.setattr(optimization._WeightDecayOptimizer, "apply_gradients",
                      lambda self, pairs, global_step=None, applied=None, **kwargs:
                      apply_gradients(self, pairs, global_step, applied=tf.constant(True),
                                      **kwargs))
  plain = train_weights(8, 1, optimizer=optimizer)[1]
  for name in plain:
    np.testing.assert_array_equal(again[name], fused[name], err_msg=name)
    np.testing.assert_allclose(fused[name], plain[name], rtol=1e-6, atol=3e-6, err_msg=name)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_a_bfloat16_models_update_reads_the_weights_gradients_before_their_cast(
    monkeypatch, accumulation):
  """In bfloat16 the update's kernel (or the accumulators', and the update's last
  addition) and the global norm read every gradient the backward pass computed in
  bfloat16 as it is (precision.cast_source): those gradients' casts to float32 never
  run, and the weights come out as through the casts. The LayerNorm's weights and the
  embeddings' tables (read in float32, or twice) take float32 gradients."""
  kernels.build()
  assert kernels.load() is not None, kernels.why_unavailable()
  graphs = []
  create_train_ops = optimization.create_train_ops
  monkeypatch.setattr(optimization, "create_train_ops", lambda *args, **kwargs: (
      graphs.append(tf.get_default_graph()) or create_train_ops(*args, **kwargs)))
  ran = []
  per_micro_batch = optimization.CLIP_PER_MICRO_BATCH
  (step, read_in_bfloat16) = train_weights(8, accumulation, clipping=per_micro_batch,
                                           compute_type=tf.bfloat16, ran_ops=ran)
  halves = [(op, op.inputs[3]) for op in graphs[0].get_operations()
            if op.type == "BertLambApply" and op.inputs[3].dtype == tf.bfloat16]
  halves += [(op, op.inputs[1]) for op in graphs[0].get_operations()
             if op.type == "BertAccumulate"]
  want = {name for name in read_in_bfloat16 if "LayerNorm" not in name
          and not name.startswith("bert/embeddings/")}
  assert len(want) == 19 and len(halves) == (19 if accumulation == 1 else 38)
  if accumulation == 1:
    assert {op.inputs[0].op.name for op, _ in halves} == want
  skipped_casts = {consumer.name for _, half in halves for consumer in half.consumers()
                   if consumer.type == "BertToFloat"}
  assert len(skipped_casts) == 19 and not skipped_casts & set(ran)
  assert {op.name for op, _ in halves} <= set(ran)
  assert len({name for name in ran if name.startswith("clip_micro_batch/BertSquareSum")}) == 19

  monkeypatch.setattr(precision, "cast_source", lambda x: None)
  (step_cast, through_casts) = train_weights(8, accumulation, clipping=per_micro_batch,
                                             compute_type=tf.bfloat16)
  assert step == step_cast == 3
  for name in through_casts:
    np.testing.assert_allclose(read_in_bfloat16[name], through_casts[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)
  (_, float32) = train_weights(8, accumulation, clipping=per_micro_batch)
  assert max(np.abs(read_in_bfloat16[n] - float32[n]).max() for n in float32) > 1e-5


# Micro-batch inputs of a model whose gradient is known: loss = sum((w * x)^2), so
# d loss / d w = 2 w x^2. Their gradients' norms are above 1 and differ, so the clipping
# order matters.
CLIP_W0 = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
CLIP_INPUTS = np.array([[[1.0, 2.0], [0.5, 1.5]], [[3.0, 0.1], [0.2, 0.4]],
                        [[0.3, 0.6], [2.5, 1.0]], [[1.2, 0.9], [0.7, 2.2]],
                        [[0.4, 1.7], [1.1, 0.3]], [[2.1, 0.5], [0.9, 1.3]]], np.float32)


def numpy_clipped_lamb(clipping, accumulation, updates=3):
  """The weights and first moment after `updates` LAMB updates of the model above,
  micro-batches taken in order, gradients clipped to norm 1 per micro-batch or after
  averaging."""
  w, m, v = CLIP_W0.copy(), 0.0, 0.0
  inputs = iter(CLIP_INPUTS)
  for step in range(1, updates + 1):
    grads = [2.0 * w * next(inputs) ** 2 for _ in range(accumulation)]
    if clipping == optimization.CLIP_PER_MICRO_BATCH:
      grads = [g / max(np.linalg.norm(g), 1.0) for g in grads]
    g = np.mean(grads, axis=0)
    if clipping == optimization.CLIP_AFTER_ALLREDUCE:
      g = g / max(np.linalg.norm(g), 1.0)
    lr = 0.1 * (1.0 - (step - 1) / 10.0)  # the schedule's linear decay over 10 updates
    w, m, v = numpy_lamb_step(w, g, m, v, step, lr, 0.01)
  return w, m


def tf_clipped_lamb(clipping, accumulation, loss_scale=None, updates=3):
  with tf.Graph().as_default():
    x = tf.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensor_slices(CLIP_INPUTS)).get_next()
    w = tf.get_variable("layer/kernel", initializer=CLIP_W0)
    step = tf.train.get_or_create_global_step()
    lr = optimization.learning_rate_schedule(step, 0.1, num_train_steps=10,
                                             num_warmup_steps=0)
    scale = optimization.DynamicLossScale(loss_scale) if loss_scale else None
    accumulate, update = optimization.create_train_ops(
        tf.reduce_sum(tf.square(w * x)), optimization.create_optimizer("lamb", lr), step,
        accumulation, loss_scale=scale, clipping=clipping)
    with tf.Session() as sess:
      sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
      for _ in range(updates):
        for _ in range(accumulation - 1):
          sess.run(accumulate)
        sess.run(update)
      assert sess.run(step) == updates
      return sess.run((w, tf.global_variables("layer/kernel/adam_m")[0]))


@pytest.mark.parametrize("update_path", UPDATES[:2], indirect=True)
@pytest.mark.parametrize("accumulation", [1, 2])
def test_both_clipping_orders_match_numpy(accumulation, update_path):
  """Clipping each micro-batch's gradient before accumulation (MLPerf's reference and
  NVIDIA) and clipping the accumulated mean (after the all-reduce) each match numpy, the
  weights and the first moment (which the clipping factor scales), also under loss
  scaling; with accumulation they differ."""
  results = {}
  for clipping in optimization.CLIPPING:
    (want, want_m) = numpy_clipped_lamb(clipping, accumulation)
    (results[clipping], m) = tf_clipped_lamb(clipping, accumulation)
    np.testing.assert_allclose(results[clipping], want, rtol=1e-5, err_msg=clipping)
    np.testing.assert_allclose(m, want_m, rtol=1e-5, err_msg=clipping)
    (scaled, scaled_m) = tf_clipped_lamb(clipping, accumulation, loss_scale=2.0 ** 10)
    np.testing.assert_allclose(scaled, want, rtol=1e-5, err_msg=clipping + " loss-scaled")
    np.testing.assert_allclose(scaled_m, want_m, rtol=1e-5, err_msg=clipping + " loss-scaled")
  difference = np.abs(results[optimization.CLIP_PER_MICRO_BATCH]
                      - results[optimization.CLIP_AFTER_ALLREDUCE]).max()
  if accumulation > 1:
    assert difference > 1e-3
  else:
    assert difference < 1e-6  # one micro-batch: the same gradient either way


def test_a_clipped_micro_batch_is_added_to_its_accumulator_by_one_fused_op():
  """Clipped per micro-batch, each accumulator takes factor * gradient in one pass
  (ApplyGradientDescent with -factor), holding numpy's clipped gradient after it."""
  with tf.Graph().as_default():
    x = tf.constant(CLIP_INPUTS[0])
    w = tf.get_variable("layer/kernel", initializer=CLIP_W0)
    accumulate, _ = optimization.create_train_ops(
        tf.reduce_sum(tf.square(w * x)), optimization.create_optimizer("lamb", 0.1),
        tf.train.get_or_create_global_step(), 2,
        clipping=optimization.CLIP_PER_MICRO_BATCH)
    assert [op.type for op in accumulate.control_inputs] in (
        ["ApplyGradientDescent"], ["ResourceApplyGradientDescent"])
    (accumulator,) = tf.local_variables("gradient_accumulation")
    with tf.Session() as sess:
      sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
      sess.run(accumulate)
      got = sess.run(accumulator)
  grad = 2.0 * CLIP_W0 * CLIP_INPUTS[0] ** 2
  np.testing.assert_allclose(got, grad / max(np.linalg.norm(grad), 1.0), rtol=1e-6)


def test_a_micro_batch_that_overflows_skips_the_accumulated_update():
  """Clipped per micro-batch under loss scaling, an overflow in one micro-batch of an
  accumulated update leaves a NaN in the sum: the update is skipped and the scale halves."""
  with tf.Graph().as_default():
    w = tf.get_variable("w", initializer=np.array([1.0, 2.0], np.float32))
    scale_in = tf.placeholder(tf.float32, [])
    step = tf.train.get_or_create_global_step()
    loss_scale = optimization.DynamicLossScale(initial_scale=8.0)
    accumulate, update = optimization.create_train_ops(
        tf.reduce_sum(w * scale_in), optimization.create_optimizer("lamb", 0.1), step, 2,
        loss_scale=loss_scale, clipping=optimization.CLIP_PER_MICRO_BATCH)
    with tf.Session() as sess:
      sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
      sess.run(accumulate, {scale_in: np.inf})
      sess.run(update, {scale_in: 1.0})
      assert sess.run([step, loss_scale.scale]) == [0, 4.0]
      np.testing.assert_array_equal(sess.run(w), [1.0, 2.0])
      sess.run(accumulate, {scale_in: 1.0})  # the accumulators were emptied
      sess.run(update, {scale_in: 1.0})
      assert sess.run(step) == 1
      assert not np.allclose(sess.run(w), [1.0, 2.0])


def test_loss_scale_skips_overflow_and_halves():
  with tf.Graph().as_default():
    w = tf.get_variable("w", initializer=np.array([1.0, 2.0], np.float32))
    scale_in = tf.placeholder(tf.float32, [])
    loss = tf.reduce_sum(w * scale_in)
    step = tf.train.get_or_create_global_step()
    loss_scale = optimization.DynamicLossScale(initial_scale=8.0, growth_interval=2)
    _, update = optimization.create_train_ops(loss, optimization.create_optimizer("adam", 0.1),
                                              step, loss_scale=loss_scale)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(update, {scale_in: np.inf})
      assert sess.run(loss_scale.scale) == 4.0
      assert sess.run(loss_scale.skipped_steps) == 1
      np.testing.assert_array_equal(sess.run(w), [1.0, 2.0])  # skipped: unchanged
      sess.run(update, {scale_in: 1.0})
      assert not np.allclose(sess.run(w), [1.0, 2.0])
      sess.run(update, {scale_in: 1.0})
      assert sess.run(loss_scale.scale) == 8.0  # two good steps: grown
      assert sess.run(step) == 2  # the skipped update is not counted


def _state(sess):
  """Every global variable but the loss scale's own: weights, slots, global_step."""
  return sess.run({v.op.name: v for v in tf.global_variables()
                   if not v.op.name.startswith("loss_scale/")})


def test_a_float16_overflow_skips_the_update_and_the_scale_grows_after_the_interval():
  """Float16 BERT with a loss scale of 2^40: its float16 gradients overflow for real. The
  update is skipped (weights, moment slots, global_step and so the learning rate stay
  exactly as they were) and the scale halves; at a scale that fits, updates apply and
  the scale doubles after growth_interval good steps."""
  with tf.Graph().as_default():
    tf.set_random_seed(7)
    outputs = pretraining.build_model(CONFIG, _batches(4), True, tf.float16)
    step = tf.train.get_or_create_global_step()
    lr = optimization.learning_rate_schedule(step, 1e-2, num_train_steps=10,
                                             num_warmup_steps=0)
    loss_scale = optimization.DynamicLossScale(initial_scale=2.0 ** 40, growth_interval=2)
    _, update = optimization.create_train_ops(outputs["total_loss"],
                                              optimization.create_optimizer("lamb", lr),
                                              step, loss_scale=loss_scale)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      before, lr_before = _state(sess), sess.run(lr)
      assert any(name.endswith("/adam_m") for name in before)
      sess.run(update)
      after = _state(sess)
      assert sorted(after) == sorted(before)
      for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
      assert sess.run([step, lr]) == [0, lr_before]
      assert sess.run([loss_scale.scale, loss_scale.skipped_steps]) == [2.0 ** 39, 1]

      sess.run(loss_scale.scale.assign(2.0 ** 8))
      sess.run(update)
      assert sess.run([step, loss_scale.scale, loss_scale.good_steps]) == [1, 2.0 ** 8, 1]
      moved = _state(sess)
      assert np.abs(moved["bert/embeddings/word_embeddings"]
                    - before["bert/embeddings/word_embeddings"]).max() > 1e-4
      assert np.abs(moved["bert/embeddings/word_embeddings/adam_m"]).max() > 0
      assert sess.run(lr) < lr_before  # the decay moved on
      sess.run(update)
      assert sess.run([step, loss_scale.scale, loss_scale.good_steps]) == [2, 2.0 ** 9, 0]
      assert sess.run(loss_scale.skipped_steps) == 1


def test_loss_scaled_updates_equal_unscaled_ones():
  """With finite gradients, loss scaling (unscaling folded into the clipping factor)
  gives the float32 update."""
  def weights(loss_scale):
    with tf.Graph().as_default():
      w = tf.get_variable("w", initializer=np.array([[0.5, -1.0], [2.0, 0.25]], np.float32))
      loss = tf.reduce_sum(tf.square(w * np.array([[3.0, 1.0], [-2.0, 5.0]], np.float32)))
      step = tf.train.get_or_create_global_step()
      scale = (optimization.DynamicLossScale(initial_scale=loss_scale)
               if loss_scale else None)
      _, update = optimization.create_train_ops(
          loss, optimization.create_optimizer("lamb", 0.1), step, loss_scale=scale)
      with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(3):
          sess.run(update)
        return sess.run(w), sess.run(step)
  (plain, plain_step), (scaled, scaled_step) = weights(None), weights(2.0 ** 15)
  assert plain_step == scaled_step == 3
  np.testing.assert_allclose(scaled, plain, rtol=1e-6)
  assert np.abs(plain - np.array([[0.5, -1.0], [2.0, 0.25]])).max() > 1e-2
