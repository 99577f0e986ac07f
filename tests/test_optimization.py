"""Optimizers, schedule, accumulation and loss scaling, checked against numpy."""

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import modeling
from bert_pretrain import optimization
from bert_pretrain import pretraining


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


# 1 - beta in float32, as TensorFlow's fused ApplyAdam kernel computes it.
ONE_MINUS_B1 = float(np.float32(1) - np.float32(0.9))
ONE_MINUS_B2 = float(np.float32(1) - np.float32(0.999))


def numpy_lamb_step(w, g, m, v, step, lr, wd, b1=0.9, b2=0.999, eps=1e-6):
  m = m + (g - m) * ONE_MINUS_B1
  v = v + (g * g - v) * ONE_MINUS_B2
  update = (m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps) + wd * w
  ratio = np.linalg.norm(w) / np.linalg.norm(update)
  return w - lr * ratio * update, m, v


@pytest.mark.parametrize("name", ["lamb", "adam"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain ops"])
def test_one_update_matches_numpy(name, fused):
  """The fused kernels (in place) and the plain ops (under a strategy, or when an update
  may be skipped: `applied`) compute the same update."""
  w0 = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
  g = np.array([[0.1, 0.2], [-0.3, 0.05]], np.float32)
  b0 = np.array([0.3, -0.2], np.float32)
  with tf.Graph().as_default():
    w = tf.get_variable("layer/kernel", initializer=w0)
    b = tf.get_variable("layer/bias", initializer=b0)
    step = tf.train.get_or_create_global_step()
    opt = optimization.create_optimizer(name, 0.1, weight_decay_rate=0.01)
    op = opt.apply_gradients([(tf.constant(g), w), (tf.constant(g[0]), b)], global_step=step,
                             applied=None if fused else tf.constant(True))
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(op)
      w1, b1 = sess.run([w, b])
      names = sorted(v.op.name for v in tf.global_variables())
  if name == "lamb":
    want_w, _, _ = numpy_lamb_step(w0, g, 0, 0, 1, 0.1, 0.01)
    want_b, _, _ = numpy_lamb_step(b0, g[0], 0, 0, 1, 0.1, 0.0)  # no decay on bias
  else:
    m, v = ONE_MINUS_B1 * g, ONE_MINUS_B2 * g * g
    want_w = w0 - 0.1 * (m / (np.sqrt(v) + 1e-6) + 0.01 * w0)
    want_b = b0 - 0.1 * (m[0] / (np.sqrt(v[0]) + 1e-6))
  np.testing.assert_allclose(w1, want_w, rtol=1e-5)
  np.testing.assert_allclose(b1, want_b, rtol=1e-5)
  # Slots are named as in Google BERT checkpoints.
  assert "layer/kernel/adam_m" in names and "layer/kernel/adam_v" in names


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


def train_weights(batch_size, accumulation, updates=3, optimizer="lamb"):
  with tf.Graph().as_default():
    tf.set_random_seed(7)
    outputs = pretraining.build_model(CONFIG, _batches(batch_size), True, tf.float32)
    step = tf.train.get_or_create_global_step()
    opt = optimization.create_optimizer(optimizer, 1e-2)
    accumulate, update = optimization.create_train_ops(outputs["total_loss"], opt, step,
                                                       accumulation)
    with tf.Session() as sess:
      sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
      for _ in range(updates):
        for _ in range(accumulation - 1):
          sess.run(accumulate)
        sess.run(update)
      return sess.run(step), {v.op.name: sess.run(v) for v in tf.trainable_variables()}


@pytest.mark.parametrize("optimizer", ["lamb", "adam"])
def test_accumulation_equals_a_larger_batch(optimizer):
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


@pytest.mark.parametrize("optimizer", ["lamb", "adam"])
def test_the_fused_kernels_train_a_model_as_the_plain_ops_do(optimizer, monkeypatch):
  """Three updates of a real model: the fused in-place kernels against the plain ops
  (the path under a strategy, taken here by passing `applied`). An in-place update that
  ran before the forward pass had read the weights (Adam's decay once did) differs by
  1e-5 or more, and differently from run to run."""
  fused = train_weights(8, 1, optimizer=optimizer)[1]
  apply_gradients = optimization._WeightDecayOptimizer.apply_gradients
  monkeypatch.setattr(optimization._WeightDecayOptimizer, "apply_gradients",
                      lambda self, pairs, global_step=None, applied=None: apply_gradients(
                          self, pairs, global_step, applied=tf.constant(True)))
  plain = train_weights(8, 1, optimizer=optimizer)[1]
  for name in plain:
    np.testing.assert_allclose(fused[name], plain[name], rtol=1e-6, atol=1e-6, err_msg=name)


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
  return {v.op.name: sess.run(v) for v in tf.global_variables()
          if not v.op.name.startswith("loss_scale/")}


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
