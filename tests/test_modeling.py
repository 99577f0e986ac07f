"""The model: Google BERT variable names and shapes, output shapes, config handling."""

import json
import math
import re

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bench import backward
from bert_pretrain import config
from bert_pretrain.model import heads
from bert_pretrain.model import kernels
from bert_pretrain.model import modeling
from bert_pretrain.model import unpadded
from bert_pretrain.model import precision
from bert_pretrain.model import dropout as dropout_lib
from bert_pretrain.training import pretraining
from bert_pretrain.distributed import ranks as ranks_lib

CONFIG = modeling.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=37,
                             max_position_embeddings=64, type_vocab_size=2)


def google_bert_variables(config):
  """The variable names and shapes of a Google BERT checkpoint, written out by hand."""
  h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
  names = {
      "bert/embeddings/word_embeddings": [v, h],
      "bert/embeddings/token_type_embeddings": [config.type_vocab_size, h],
      "bert/embeddings/position_embeddings": [config.max_position_embeddings, h],
      "bert/embeddings/LayerNorm/beta": [h],
      "bert/embeddings/LayerNorm/gamma": [h],
      "bert/pooler/dense/kernel": [h, h],
      "bert/pooler/dense/bias": [h],
      "cls/predictions/transform/dense/kernel": [h, h],
      "cls/predictions/transform/dense/bias": [h],
      "cls/predictions/transform/LayerNorm/beta": [h],
      "cls/predictions/transform/LayerNorm/gamma": [h],
      "cls/predictions/output_bias": [v],
      "cls/seq_relationship/output_weights": [2, h],
      "cls/seq_relationship/output_bias": [2],
  }
  for layer in range(config.num_hidden_layers):
    p = "bert/encoder/layer_%d/" % layer
    for name in ("query", "key", "value"):
      names[p + "attention/self/%s/kernel" % name] = [h, h]
      names[p + "attention/self/%s/bias" % name] = [h]
    names[p + "attention/output/dense/kernel"] = [h, h]
    names[p + "attention/output/dense/bias"] = [h]
    names[p + "attention/output/LayerNorm/beta"] = [h]
    names[p + "attention/output/LayerNorm/gamma"] = [h]
    names[p + "intermediate/dense/kernel"] = [h, i]
    names[p + "intermediate/dense/bias"] = [i]
    names[p + "output/dense/kernel"] = [i, h]
    names[p + "output/dense/bias"] = [h]
    names[p + "output/LayerNorm/beta"] = [h]
    names[p + "output/LayerNorm/gamma"] = [h]
  return names


def features(batch, seq, predictions):
  rng = np.random.RandomState(0)
  return {
      "input_ids": tf.constant(rng.randint(0, CONFIG.vocab_size, [batch, seq]), tf.int32),
      "input_mask": tf.constant(np.ones([batch, seq]), tf.int32),
      "segment_ids": tf.constant(rng.randint(0, 2, [batch, seq]), tf.int32),
      "masked_lm_positions": tf.constant(rng.randint(0, seq, [batch, predictions]), tf.int32),
      "masked_lm_ids": tf.constant(rng.randint(0, CONFIG.vocab_size, [batch, predictions]),
                                   tf.int32),
      "masked_lm_weights": tf.ones([batch, predictions], tf.float32),
      "next_sentence_labels": tf.zeros([batch, 1], tf.int32),
  }


def test_variables_have_google_bert_names_and_shapes():
  with tf.Graph().as_default():
    pretraining.build_model(CONFIG, features(2, 16, 3), True, tf.float32)
    got = {v.op.name: v.shape.as_list() for v in tf.global_variables()}
  assert got == google_bert_variables(CONFIG)
  # The table a checkpoint is checked against before the graph is built.
  assert heads.pretraining_variable_shapes(CONFIG) == got


def test_training_and_evaluation_models_share_variables(tmp_path):
  """The evaluator must measure the weights being trained, not a second set."""
  path = tmp_path / "eval.tfrecord"
  with tf.io.TFRecordWriter(str(path)) as writer:
    ints = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
    writer.write(tf.train.Example(features=tf.train.Features(feature={
        "input_ids": ints([1] * 16), "input_mask": ints([1] * 16), "segment_ids": ints([0] * 16),
        "masked_lm_positions": ints([1, 2, 3]), "masked_lm_ids": ints([4, 5, 6]),
        "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * 3)),
        "next_sentence_labels": ints([0])})).SerializeToString())
  with tf.Graph().as_default():
    pretraining.build_model(CONFIG, features(2, 16, 3), True, tf.float32)
    before = [v.op.name for v in tf.global_variables()]
    pretraining.Evaluator(CONFIG, [str(path)], ranks_lib.Ranks(False), tf.float32,
                          batch_size=1, max_seq_length=16, max_predictions_per_seq=3)
    assert [v.op.name for v in tf.global_variables()] == before


def test_output_shapes_and_getters():
  with tf.Graph().as_default():
    ids = tf.constant(np.random.RandomState(1).randint(0, 99, [3, 11]), tf.int32)
    model = modeling.BertModel(CONFIG, is_training=False, input_ids=ids,
                               input_mask=tf.ones([3, 11], tf.int32))
    assert model.get_sequence_output().shape.as_list() == [3, 11, 32]
    assert model.get_pooled_output().shape.as_list() == [3, 32]
    assert model.get_embedding_output().shape.as_list() == [3, 11, 32]
    assert model.get_embedding_table().shape.as_list() == [99, 32]
    assert len(model.get_all_encoder_layers()) == 2
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      pooled = sess.run(model.get_pooled_output())
    assert np.all(np.abs(pooled) <= 1.0)  # tanh pooler
    assert np.isfinite(pooled).all()


def test_padding_does_not_change_real_tokens():
  """Attention must ignore masked positions: padding more does not move the outputs."""
  with tf.Graph().as_default():
    ids = tf.placeholder(tf.int32, [1, None])
    mask = tf.placeholder(tf.int32, [1, None])
    model = modeling.BertModel(CONFIG, False, ids, mask)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      short = sess.run(model.get_sequence_output(), {ids: [[5, 6, 7, 0]], mask: [[1, 1, 1, 0]]})
      long = sess.run(model.get_sequence_output(),
                      {ids: [[5, 6, 7, 0, 0, 0]], mask: [[1, 1, 1, 0, 0, 0]]})
  np.testing.assert_allclose(short[0, :3], long[0, :3], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("act,expected", [("gelu", modeling.gelu), ("relu", tf.nn.relu),
                                          ("tanh", tf.tanh), ("linear", None)])
def test_hidden_act_follows_the_config(act, expected):
  assert modeling.get_activation(act) is expected


def test_gelu_values():
  with tf.Graph().as_default(), tf.Session() as sess:
    got = sess.run(modeling.gelu(tf.constant([-1.0, 0.0, 1.0, 3.0])))
  np.testing.assert_allclose(got, [-0.158808, 0.0, 0.841192, 2.996363], atol=1e-5)


def test_config_round_trip_and_errors(tmp_path):
  path = tmp_path / "bert_config.json"
  path.write_text(CONFIG.to_json_string())
  loaded = modeling.BertConfig.from_json_file(str(path))
  assert loaded.to_dict() == CONFIG.to_dict()

  with pytest.raises(ValueError, match="does not exist"):
    modeling.BertConfig.from_json_file(str(tmp_path / "missing.json"))
  path.write_text("{not json")
  with pytest.raises(ValueError, match="not valid JSON"):
    modeling.BertConfig.from_json_file(str(path))
  path.write_text(json.dumps(dict(CONFIG.to_dict(), num_attention_heads=5)))
  with pytest.raises(ValueError, match="not a multiple of num_attention_heads"):
    modeling.BertConfig.from_json_file(str(path))
  path.write_text(json.dumps(dict(CONFIG.to_dict(), hidden_act="swish")))
  with pytest.raises(ValueError, match="hidden_act"):
    modeling.BertConfig.from_json_file(str(path))


def test_sequence_longer_than_positions_is_a_clear_error():
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="longer than max_position_embeddings"):
      modeling.BertModel(CONFIG, False, tf.zeros([1, 65], tf.int32))


def test_assignment_map_from_checkpoint(tmp_path):
  with tf.Graph().as_default():
    a = tf.get_variable("bert/a", [2, 3])
    tf.get_variable("cls/b", [4])
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      prefix = tf.train.Saver([a]).save(sess, str(tmp_path / "model.ckpt"))
    assignment_map, names = modeling.get_assignment_map_from_checkpoint(
        tf.global_variables(), prefix)
  assert dict(assignment_map) == {"bert/a": "bert/a"}
  assert "bert/a:0" in names and "cls/b" not in names
  with tf.Graph().as_default():
    tf.get_variable("bert/a", [3, 3])
    with pytest.raises(ValueError, match=r"bert/a has shape \[2, 3\] but the model needs \[3, 3\]"):
      modeling.get_assignment_map_from_checkpoint(tf.global_variables(), prefix)


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16], ids=["bfloat16", "float16"])
def test_reduced_precision_compute_keeps_float32_variables(dtype):
  with tf.Graph().as_default():
    outputs = pretraining.build_model(CONFIG, features(2, 16, 3), True, dtype)
    # The encoder's matmuls compute in dtype (the embedding lookups stay float32).
    matmuls = [op for op in tf.get_default_graph().get_operations()
               if op.type in ("MatMul", "BatchMatMulV2") and op.name.startswith("bert/encoder/")]
    assert len(matmuls) > 10 and all(op.outputs[0].dtype == dtype for op in matmuls)
    assert all(v.dtype.base_dtype == tf.float32 for v in tf.global_variables())
    assert outputs["total_loss"].dtype == tf.float32
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      loss = sess.run(outputs["total_loss"])
  # Untrained: the masked-LM loss is about log(vocab_size), the NSP loss about log(2).
  assert abs(loss - (np.log(99) + np.log(2))) < 1.0


@pytest.mark.parametrize("dtype,elementwise", [(tf.bfloat16, tf.float32), (tf.float16, tf.float16)],
                         ids=["bfloat16", "float16"])
def test_elementwise_math_computes_in_float32_when_the_matmuls_are_bfloat16(
    dtype, elementwise, monkeypatch):
  # TensorFlow's ops (the fused kernels, which compute the same in float32 within:
  # test_kernels.py).
  monkeypatch.setattr(kernels, "_loaded", {kernels.library_path(): "off"})
  with tf.Graph().as_default():
    batch = features(2, 16, 3)
    model = modeling.BertModel(CONFIG, True, batch["input_ids"], batch["input_mask"],
                               batch["segment_ids"], compute_type=dtype)
    ops = [op for op in tf.get_default_graph().get_operations()
           if op.name.startswith("bert/encoder/")]
    by_type = {t: [op.outputs[0].dtype for op in ops if op.type == t]
               for t in ("Sigmoid", "Softmax", "Rsqrt", "MatMul")}
    # GELU and the attention softmax (dropout: below): every layer has them.
    for op_type in ("Sigmoid", "Softmax"):
      assert by_type[op_type] and set(by_type[op_type]) == {elementwise}, op_type
    # Layer norm's statistics are float32 whatever the compute type.
    assert by_type["Rsqrt"] and set(by_type["Rsqrt"]) == {tf.float32}
    # The residual stream: each sublayer's output plus its input.
    residual_adds = [op for op in ops
                     if re.search(r"layer_\d+/(attention/)?output/add$", op.name)]
    assert len(residual_adds) == 2 * CONFIG.num_hidden_layers
    assert {op.outputs[0].dtype for op in residual_adds} == {elementwise}
    # ... whose residual, after the first, is the previous layer norm's output as it is
    # (not cast to bfloat16 and back).
    assert all("/LayerNorm/" in op.inputs[1].op.name for op in residual_adds[1:])
    assert model.get_sequence_output().dtype == dtype
    assert all(layer.dtype == dtype for layer in model.get_all_encoder_layers())
    assert set(by_type["MatMul"]) == {dtype}


def test_attention_with_its_projections_in_one_matmul_equals_three_dense_layers():
  """Google's query, key and value kernels are used side by side in one product; the
  layer must still compute softmax(q k^T / sqrt(size) + mask) v with each of them."""
  rng = np.random.RandomState(4)
  batch, seq, heads, size = 2, 5, 2, 4
  x_value = rng.randn(batch * seq, heads * size).astype(np.float32)
  mask_value = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.float32)
  with tf.Graph().as_default(), tf.Session() as sess:
    x = tf.constant(x_value)
    output = modeling.attention_layer(x, x, tf.constant(mask_value[:, None, :]), heads, size,
                                      batch_size=batch, from_seq_length=seq, to_seq_length=seq)
    sess.run(tf.global_variables_initializer())
    got = sess.run(output)
    v = {var.op.name: sess.run(var) for var in tf.global_variables()}
  assert sorted(v) == ["%s/%s" % (n, k) for n in ("key", "query", "value")
                       for k in ("bias", "kernel")]

  def heads_of(name):  # [batch, heads, seq, size]
    y = x_value @ v[name + "/kernel"] + v[name + "/bias"]
    return y.reshape(batch, seq, heads, size).transpose(0, 2, 1, 3)
  scores = heads_of("query") @ heads_of("key").transpose(0, 1, 3, 2) / np.sqrt(size)
  scores += (1.0 - mask_value[:, None, None, :]) * -10000.0
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  want = (probs @ heads_of("value")).transpose(0, 2, 1, 3).reshape(batch * seq, heads * size)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_sequence", [False, True])
def test_last_layer_at_the_masked_positions_gives_the_whole_models_losses_and_gradients(
    per_sequence):
  """build_model computes the last layer only where the heads read it ([CLS] and the
  masked positions, repeats and padding zeros included) and the encoder on the real
  tokens only (93 of 192 here, rounded up to 128 rows), its attention too when
  per_sequence: the same losses and gradients as the whole model's sequence output
  gathered there."""
  batch, seq, preds = 3, 64, 5
  positions = np.sort(np.random.RandomState(5).randint(0, 7, [batch, preds]), axis=1)
  positions[2, 3:] = 0  # padding predictions
  with tf.Graph().as_default():
    feats = features(batch, seq, preds)
    feats["input_mask"] = tf.constant((np.arange(seq) < [[64], [20], [9]]).astype(np.int32))
    feats["masked_lm_positions"] = tf.constant(positions, tf.int32)
    ours = pretraining.build_model(CONFIG, feats, False, tf.float32,
                                   attention_per_sequence=per_sequence)
    with tf.variable_scope("", reuse=True):
      model = modeling.BertModel(CONFIG, False, feats["input_ids"], feats["input_mask"],
                                 feats["segment_ids"])
      mlm_loss = heads.get_masked_lm_output(
          CONFIG, model.get_sequence_output(), model.get_embedding_table(),
          feats["masked_lm_positions"], feats["masked_lm_ids"], feats["masked_lm_weights"])[0]
      nsp_loss = heads.get_next_sentence_output(CONFIG, model.get_pooled_output(),
                                                   feats["next_sentence_labels"])[0]
    variables = tf.trainable_variables()
    ours_grads = [tf.convert_to_tensor(g) for g in tf.gradients(ours["total_loss"], variables)]
    whole_grads = [tf.convert_to_tensor(g) for g in tf.gradients(mlm_loss + nsp_loss, variables)]
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      got = sess.run([ours["mlm_loss"], ours["nsp_loss"], ours_grads])
      want = sess.run([mlm_loss, nsp_loss, whole_grads])
  assert len(variables) == len(google_bert_variables(CONFIG))
  np.testing.assert_allclose(got[:2], want[:2], rtol=1e-6)
  for name, g, w in zip([v.op.name for v in variables], got[2], want[2]):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6, err_msg=name)


def test_unpadded_rows_puts_the_real_tokens_first_and_maps_every_position_to_a_row():
  mask = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], np.int32)
  with tf.Graph().as_default(), tf.Session() as sess:
    exact = sess.run(unpadded.unpadded_rows(tf.constant(mask), 1))
    rounded = sess.run(unpadded.unpadded_rows(tf.constant(mask), 2))
    empty = sess.run(unpadded.unpadded_rows(tf.zeros([2, 4], tf.int32), 4))
  # Rows 0-2 are the real tokens (positions 0, 1, 4); the padding reads the last row.
  assert exact[0].tolist() == [0, 1, 4]
  assert exact[1].tolist() == [0, 1, 2, 2, 2, 2, 2, 2]
  # Rounded up to 4 rows: the first padding position (2) is computed too, as row 3.
  assert rounded[0].tolist() == [0, 1, 4, 2]
  assert rounded[1].tolist() == [0, 1, 3, 3, 2, 3, 3, 3]
  # A batch of padding only still computes one row.
  assert empty[0].tolist() == [0] and empty[1].tolist() == [0] * 8


@pytest.mark.parametrize("positions,multiple", [
    (128, 16), (1024, 16), (1025, 32), (2048, 32), (3072, 48), (4096, 64), (8192, 128)])
def test_rows_are_rounded_to_a_multiple_of_16_that_gives_at_most_64_shapes(positions,
                                                                            multiple):
  assert unpadded.default_row_multiple(positions) == multiple
  shapes = lambda m: -(-positions // m)  # row counts 1..positions rounded up to m
  # The smallest such multiple: 16 fewer would give more than 64 shapes.
  assert shapes(multiple) <= 64 and (multiple == 16 or shapes(multiple - 16) > 64)


# Lengths 5, 12 and 1; a mask with a hole (position 2), a full one and an empty one.
MASKS = {"lengths": (np.arange(12) < [[5], [12], [1]]).astype(np.int32),
         "hole and empty": np.array([[1, 1, 0, 1, 1] + [0] * 7, [1] * 12, [0] * 12], np.int32)}


@pytest.mark.parametrize("row_multiple", [1, 8, None])
@pytest.mark.parametrize("per_sequence", [False, True])
@pytest.mark.parametrize("masks", sorted(MASKS))
def test_encoder_without_the_padding_gives_the_same_outputs_and_gradients_at_real_tokens(
    row_multiple, per_sequence, masks):
  batch, seq, width = 3, 12, 16
  rng = np.random.RandomState(7)
  x_value = rng.randn(batch, seq, width).astype(np.float32)
  mask_value = MASKS[masks]
  weights = rng.randn(batch, seq, width).astype(np.float32) * mask_value[:, :, None]
  args = dict(hidden_size=width, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=24, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0, do_return_all_layers=True)
  with tf.Graph().as_default(), tf.Session() as sess:
    x, mask = tf.constant(x_value), tf.constant(mask_value)
    attention_mask = modeling.create_attention_mask_from_input_mask(x, mask)
    with tf.variable_scope("encoder"):
      whole = modeling.transformer_model(x, attention_mask, **args)
    with tf.variable_scope("encoder", reuse=True):
      skipping = unpadded.transformer_model(x, attention_mask, mask,
                                            row_multiple=row_multiple,
                                            attention_per_sequence=per_sequence, **args)
    variables = tf.trainable_variables()
    grads = [tf.gradients(tf.reduce_sum(layers[-1] * weights), variables)
             for layers in (whole, skipping)]
    assert per_sequence == bool([op for op in sess.graph.get_operations()
                                 if "within_sequences" in op.name])
    sess.run(tf.global_variables_initializer())
    (want, got), (want_grads, got_grads) = sess.run([(whole, skipping), grads])
  assert len(variables) == 2 * 16
  real = mask_value.astype(bool)
  for layer_want, layer_got in zip(want, got):
    np.testing.assert_allclose(layer_got[real], layer_want[real], rtol=1e-5, atol=1e-5)
  for variable, g, w in zip(variables, got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=variable.op.name)


def test_attention_per_sequence_without_a_known_batch_size_attends_at_every_position():
  """A batch size unknown when the graph is built cannot be looped over: the attention
  then runs at every position, with the same outputs."""
  args = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=24, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0)
  x_value = np.random.RandomState(3).randn(2, 6, 16).astype(np.float32)
  mask_value = (np.arange(6) < [[4], [2]]).astype(np.int32)
  with tf.Graph().as_default() as graph, tf.Session() as sess:
    x = tf.placeholder(tf.float32, [None, 6, 16])
    mask = tf.placeholder(tf.int32, [None, 6])
    attention_mask = modeling.create_attention_mask_from_input_mask(x, mask)
    outputs = []
    for per_sequence in (False, True):
      with tf.variable_scope("encoder", reuse=tf.AUTO_REUSE):
        outputs.append(unpadded.transformer_model(
            x, attention_mask, mask, attention_per_sequence=per_sequence,
            **args))
    sess.run(tf.global_variables_initializer())
    want, got = sess.run(outputs, {x: x_value, mask: mask_value})
  real = mask_value.astype(bool)
  np.testing.assert_array_equal(got[real], want[real])
  # Both graphs attend the same way: no "within_sequences" op was made.
  assert not [op.name for op in graph.get_operations() if "within_sequences" in op.name]


def test_encoder_skipping_the_padding_without_an_attention_mask_is_refused():
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="needs the attention_mask"):
      unpadded.transformer_model(tf.zeros([2, 4, 16]), None, tf.ones([2, 4], tf.int32),
                                 hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=8)


def test_layer_norms_written_out_gradient_equals_tensorflows_own():
  rng = np.random.RandomState(3)
  x_value = (rng.randn(2, 5, 16) * 3 + 1).astype(np.float32)
  gamma_value = rng.randn(16).astype(np.float32)
  beta_value = rng.randn(16).astype(np.float32)
  upstream = rng.randn(2, 5, 16).astype(np.float32)
  with tf.Graph().as_default(), tf.Session() as sess:
    x, gamma, beta = (tf.constant(v) for v in (x_value, gamma_value, beta_value))
    mean, variance = tf.nn.moments(x, axes=[-1], keep_dims=True)
    theirs = (x - mean) * tf.rsqrt(variance + 1e-12) * gamma + beta
    ours = precision.normalize(x, gamma, beta)
    grads = [tf.gradients(tf.reduce_sum(y * upstream), [x, gamma, beta]) for y in (ours, theirs)]
    (ours_v, theirs_v), (ours_g, theirs_g) = sess.run([(ours, theirs), grads])
  np.testing.assert_allclose(ours_v, theirs_v, rtol=1e-5, atol=1e-5)
  for got, want in zip(ours_g, theirs_g):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def forward_tensors_the_backward_pass_keeps(upstream, *gradients):
  """The float tensors, constants aside, computed before `upstream` exists that the ops
  computing `gradients` from it read: what the forward pass leaves for the backward one."""
  return {t for t in backward.kept_tensors([upstream.op], list(gradients))
          if t.dtype.is_floating and t.op.type != "Const"}


@pytest.mark.parametrize("dtype, tolerance", [(tf.float32, 1e-5), (tf.bfloat16, 1e-2)])
def test_gelus_written_out_gradient_equals_tensorflows_own_and_keeps_one_tensor(
    dtype, tolerance):
  x_value = np.linspace(-6.0, 6.0, 97).astype(np.float32).reshape(1, 97)
  upstream_value = np.random.RandomState(4).randn(1, 97).astype(np.float32)
  with tf.Graph().as_default(), tf.Session() as sess:
    x = tf.cast(tf.placeholder_with_default(x_value, [1, 97]), dtype)
    upstream = tf.placeholder_with_default(upstream_value, [1, 97])
    ours = modeling.gelu(x)
    (ours_g,) = tf.gradients(ours, [x], grad_ys=tf.cast(upstream, dtype))
    kept = forward_tensors_the_backward_pass_keeps(upstream, ours_g)
    v = tf.cast(x, tf.float32)  # the plain formula, differentiated by TensorFlow
    theirs = v * (0.5 * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * tf.pow(v, 3)))))
    (theirs_g,) = tf.gradients(theirs, [x], grad_ys=tf.constant(upstream_value))
    values = sess.run([tf.cast(t, tf.float32) for t in (ours, theirs, ours_g, theirs_g)])
  assert ours.dtype == ours_g.dtype == dtype
  assert [(t.dtype, t.shape.as_list()) for t in kept] == [(dtype, [1, 97])]  # its slope
  np.testing.assert_allclose(values[0], values[1], rtol=tolerance, atol=tolerance)
  np.testing.assert_allclose(values[2], values[3], rtol=tolerance, atol=tolerance)


def test_gelus_gradient_in_float16_stays_finite_where_its_inner_slope_would_overflow():
  """From |x| = 68 the sigmoid's inner slope exceeds float16's range, where the slope
  itself is 0 or 1: the gradient is that of the plain formula, finite."""
  x_value = np.concatenate([np.linspace(-300.0, 300.0, 121), [-68.0, 68.0, -67.0, 67.0]])
  x_value = x_value.astype(np.float32).reshape(1, -1)
  with tf.Graph().as_default(), tf.Session() as sess:
    x = tf.placeholder_with_default(x_value, x_value.shape)
    (ours_g,) = tf.gradients(modeling.gelu(tf.cast(x, tf.float16)), [x])
    theirs = x * (0.5 * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3)))))
    (theirs_g,) = tf.gradients(theirs, [x])
    (ours_g, theirs_g) = sess.run([ours_g, theirs_g])
  assert np.isfinite(ours_g).all()
  np.testing.assert_allclose(ours_g, theirs_g, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kept_dtype, tolerance", [(tf.float32, 1e-6), (tf.bfloat16, 5e-3)])
def test_the_attentions_softmax_keeps_its_probabilities_in_the_matmuls_type(
    kept_dtype, tolerance):
  rng = np.random.RandomState(6)
  logits_value = (rng.randn(2, 3, 7) * 3).astype(np.float32)
  upstream_value = rng.randn(2, 3, 7).astype(np.float32)
  with tf.Graph().as_default(), tf.Session() as sess:
    logits = tf.placeholder_with_default(logits_value, [2, 3, 7])
    upstream = tf.placeholder_with_default(upstream_value, [2, 3, 7])
    ours = precision.softmax(logits, kept_dtype)
    (ours_g,) = tf.gradients(ours, [logits], grad_ys=upstream)
    kept = forward_tensors_the_backward_pass_keeps(upstream, ours_g)
    theirs = tf.nn.softmax(logits)
    (theirs_g,) = tf.gradients(theirs, [logits], grad_ys=tf.constant(upstream_value))
    values = sess.run([ours, theirs, ours_g, theirs_g])
  assert [(t.dtype, t.shape.as_list()) for t in kept] == [(kept_dtype, [2, 3, 7])]
  np.testing.assert_array_equal(values[0], values[1])
  np.testing.assert_allclose(values[2], values[3], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype, tolerance", [(tf.float32, 1e-5), (tf.bfloat16, 2e-2)])
def test_the_attentions_dropout_makes_its_dropped_probabilities_again_in_the_backward_pass(
    dtype, tolerance):
  """Its output and gradients are TensorFlow's own derivation of the same forward ops;
  the backward pass keeps the probabilities in the matmul's type and the value, not the
  dropped probabilities too."""
  rng = np.random.RandomState(7)
  scores_value = (rng.randn(2, 2, 5, 7) * 3).astype(np.float32)
  value_value = rng.randn(2, 2, 7, 4).astype(np.float32)
  keep_value = rng.rand(2, 2, 5, 7) >= 0.3
  upstream_value = rng.randn(2, 2, 5, 4).astype(np.float32)
  with tf.Graph().as_default(), tf.Session() as sess:
    scores = tf.placeholder_with_default(scores_value, [2, 2, 5, 7])
    value = tf.cast(tf.placeholder_with_default(value_value, [2, 2, 7, 4]), dtype)
    keep = tf.constant(keep_value)
    upstream = tf.placeholder_with_default(upstream_value, [2, 2, 5, 4])
    ours = precision.dropped_attention(scores, value, keep, 0.3)
    ours_g = tf.gradients(ours, [scores, value], grad_ys=tf.cast(upstream, dtype))
    kept = forward_tensors_the_backward_pass_keeps(upstream, *ours_g)
    probs = tf.cast(tf.cast(tf.nn.softmax(scores), dtype), tf.float32)
    dropped = tf.where_v2(keep, probs / 0.7, tf.zeros_like(probs))
    theirs = tf.matmul(tf.cast(dropped, dtype), value)
    theirs_g = tf.gradients(theirs, [scores, value], grad_ys=tf.cast(upstream_value, dtype))
    values = sess.run([tf.cast(t, tf.float32) for t in [ours, theirs] + ours_g + theirs_g])
  assert ours.dtype == ours_g[1].dtype == dtype
  assert sorted((t.dtype.name, t.shape.as_list()) for t in kept) == [
      (dtype.name, [2, 2, 5, 7]), (dtype.name, [2, 2, 7, 4])]  # the probabilities, the value
  np.testing.assert_array_equal(values[0], values[1])
  for got, want in zip(values[2:4], values[4:6]):
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("rows, width, units, dtype, products", [
    (64, 8, 32, tf.float32, ["BatchMatMulV2", "BatchMatMulV2"]),  # both results narrow
    (8, 32, 8, tf.float32, ["MatMul", "MatMul"]),  # neither
    (64, 8, 32, tf.bfloat16, ["MatMul", "MatMul"]),  # bfloat16 keeps MatMul
])
def test_dense_layers_gradient_takes_batch_matmul_where_the_result_is_narrow(
    rows, width, units, dtype, products):
  rng = np.random.RandomState(5)
  x_value = rng.randn(rows, width).astype(np.float32)
  upstream = rng.randn(rows, units).astype(np.float32)
  with tf.Graph().as_default(), tf.Session() as sess:
    x = tf.constant(x_value)
    with tf.variable_scope("", custom_getter=precision.get_custom_getter(dtype)):
      y = modeling.dense_layer(tf.cast(x, dtype), units, "dense")
    kernel = tf.trainable_variables("dense/kernel")[0]
    before = set(tf.get_default_graph().get_operations())
    grads = tf.gradients(tf.reduce_sum(tf.cast(y, tf.float32) * upstream), [x, kernel])
    made = [op.type for op in tf.get_default_graph().get_operations()
            if op not in before and op.type in ("MatMul", "BatchMatMulV2")]
    sess.run(tf.global_variables_initializer())
    (d_x, d_kernel, kernel_value) = sess.run(grads + [kernel])
  assert sorted(made) == products
  tolerance = 1e-5 if dtype == tf.float32 else 5e-2
  np.testing.assert_allclose(d_x, upstream @ kernel_value.T, rtol=tolerance, atol=tolerance)
  np.testing.assert_allclose(d_kernel, x_value.T @ upstream, rtol=tolerance, atol=tolerance)


def _dropout_run(seed, dtype=tf.float32, prob=0.1):
  """Two steps of dropout_lib.dropout(ones [1000, 100], prob) in a graph seeded with `seed`
  (stateful masks): (outputs, gradient of the first), and the types the dropout's float
  ops compute in."""
  with tf.Graph().as_default():
    tf.set_random_seed(seed)
    x = tf.ones([1000, 100], dtype)
    before = set(tf.get_default_graph().get_operations())
    y = dropout_lib.dropout(x, prob)
    types = {op.outputs[0].dtype for op in tf.get_default_graph().get_operations()
             if op not in before and op.outputs and op.outputs[0].dtype.is_floating}
    grad = tf.gradients(tf.reduce_sum(tf.cast(y, tf.float32) * 3.0), x)[0]
    with tf.Session() as sess:
      first, first_grad = sess.run([y, grad])
      second = sess.run(y)
  return (first.astype(np.float32), second.astype(np.float32),
          first_grad.astype(np.float32)), types


def test_dropout_drops_a_tenth_scales_the_rest_and_draws_a_new_mask_each_step():
  (first, second, grad), _ = _dropout_run(seed=1)
  for values in (first, second):
    # 100000 values: the dropped fraction's standard deviation is 0.001.
    assert abs(np.mean(values == 0) - 0.1) < 0.005
    np.testing.assert_allclose(values[values != 0], 1 / 0.9, rtol=1e-6)
  assert np.mean((first == 0) != (second == 0)) > 0.1
  # The gradient flows through the kept values only, with their scale.
  np.testing.assert_allclose(grad, 3.0 * first, rtol=1e-6)


def test_dropout_keeps_any_shape():
  with tf.Graph().as_default(), tf.Session() as sess:
    values = sess.run(dropout_lib.dropout(tf.ones([3, 5, 7]), 0.5))
  assert values.shape == (3, 5, 7) and set(np.unique(values)) <= {0.0, 2.0}


def test_dropout_masks_repeat_with_the_graph_seed():
  (first, second, _), _ = _dropout_run(seed=7)
  (again, _, _), _ = _dropout_run(seed=7)
  (other, _, _), _ = _dropout_run(seed=8)
  np.testing.assert_array_equal(first, again)
  assert np.mean(first != other) > 0.1 and np.mean(first != second) > 0.1


def test_dropout_of_bfloat16_computes_in_float32():
  (first, _, _), types = _dropout_run(seed=1, dtype=tf.bfloat16)
  # Its float ops: float32, and the last cast back to bfloat16.
  assert types == {tf.float32, tf.bfloat16}
  assert abs(np.mean(first == 0) - 0.1) < 0.005
  np.testing.assert_allclose(first[first != 0], 1 / 0.9, rtol=1e-2)


def _seeded_masks(seed, position, prob=0.1, sites=2, dtype=tf.float32):
  """dropout_lib.dropout(ones [1000, 100], prob) at `sites` sites seeded by
  DropoutSeeds(seed, position), in a graph and session of their own (as a new process
  would build them)."""
  with tf.Graph().as_default():
    feed = tf.placeholder(tf.int64, [])
    seeds = dropout_lib.DropoutSeeds(seed, feed)
    x = tf.ones([1000, 100], dtype)
    outputs = [dropout_lib.dropout(x, prob, seeds) for _ in range(sites)]
    with tf.Session() as sess:
      return [v.astype(np.float32) for v in sess.run(outputs, {feed: position})]


def test_seeded_dropout_masks_are_a_function_of_the_seed_the_site_and_the_position():
  first, second = _seeded_masks(7, 100)
  again = _seeded_masks(7, 100)
  for site, mask in enumerate((first, second)):
    np.testing.assert_array_equal(mask, again[site])  # a new graph draws them again
  # Another site, position or seed: another mask, independent of the first (two masks
  # of keep probability 0.9 disagree at 2 x 0.9 x 0.1 = 18% of the values).
  for other in (second, _seeded_masks(7, 101)[0], _seeded_masks(8, 100)[0]):
    assert abs(np.mean((first == 0) != (other == 0)) - 0.18) < 0.01


@pytest.mark.parametrize("prob", [0.1, 0.5])
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_seeded_dropout_keeps_values_with_the_probability_of_stateful_dropout(prob, dtype):
  seeded = np.concatenate(_seeded_masks(3, 0, prob, sites=3, dtype=dtype))
  (stateful, _, _), _ = _dropout_run(seed=3, dtype=dtype, prob=prob)
  # 300000 and 100000 values: the dropped fraction's standard deviation is at most
  # 0.0009 and 0.0016.
  for values in (seeded, stateful):
    assert abs(np.mean(values == 0) - prob) < 0.006
    np.testing.assert_allclose(values[values != 0], 1 / (1 - prob),
                               rtol=1e-6 if dtype == tf.float32 else 1e-2)


@pytest.mark.parametrize("per_sequence", [False, True], ids=["padded", "per-sequence"])
def test_a_seeded_training_step_draws_every_mask_from_the_position_and_micro_batch(
    per_sequence):
  """With a seed, no dropout site of the training graph (the embeddings, each layer's
  attention probabilities, per sequence too, and both sublayer outputs) uses a stateful
  random op, and the losses repeat for the same data position and micro-batch."""
  lengths = [[16], [9], [4], [12]]
  def graph(seed):
    tf.set_random_seed(1)
    feats = features(4, 16, 3)
    feats["input_mask"] = tf.constant((np.arange(16) < lengths).astype(np.int32))
    feats["masked_lm_positions"] = tf.constant(
        np.random.RandomState(2).randint(1, 4, [4, 3]), tf.int32)
    return pretraining.build_train_graph(
        CONFIG, feats, tf.float32, config.Optimizer(learning_rate=0.1, num_train_steps=100,
                                                    num_accumulation_steps=2),
        seed=seed, attention_per_sequence=per_sequence)
  stateful = ("RandomUniform", "RandomUniformInt", "RandomStandardNormal")
  with tf.Graph().as_default() as unseeded:
    graph(None)
  assert any(op.type in stateful for op in unseeded.get_operations()
             if "random_keep_mask" in op.name or "dropout" in op.name)
  with tf.Graph().as_default() as seeded:
    train = graph(5)
    assert not [op.name for op in seeded.get_operations() if op.type in stateful and
                ("random_keep_mask" in op.name or "dropout" in op.name)]
    assert bool([op for op in seeded.get_operations() if "within_sequences" in op.name]) == (
        per_sequence)
    loss = train.outputs["total_loss"]
    with tf.Session() as sess:
      sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
      at = lambda micro: sess.run(loss, {train.micro_batch: micro})
      first = at(0)
      assert at(0) == first and at(1) != first
      sess.run(train.data_position.assign(8))
      assert at(0) != first
      # An update (two micro-batches of 4) moves the position on by its 8 records.
      sess.run(train.accumulate_op, {train.micro_batch: 0})
      sess.run(train.update_op, {train.micro_batch: 1})
      assert sess.run(train.data_position) == 16


def test_softmax_cross_entropy_matches_tensorflows():
  rng = np.random.RandomState(4)
  # Confident wrong predictions (label logit far below the max) are the hard case.
  logits_value = (rng.randn(6, 1000) * 8).astype(np.float32)
  labels_value = rng.randint(0, 1000, 6).astype(np.int32)
  logits_value[0, labels_value[0]] = -60.0
  with tf.Graph().as_default():
    logits = tf.constant(logits_value)
    labels = tf.constant(labels_value)
    weights = tf.constant(rng.rand(6).astype(np.float32))
    ours = precision.softmax_cross_entropy(logits, labels)
    theirs = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    grads = [tf.gradients(tf.reduce_sum(loss * weights), logits)[0] for loss in (ours, theirs)]
    with tf.Session() as sess:
      ours_v, theirs_v, g_ours, g_theirs = sess.run([ours, theirs] + grads)
  assert theirs_v[0] > 50
  np.testing.assert_allclose(ours_v, theirs_v, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(g_ours, g_theirs, atol=1e-6)


def test_attention_runs_per_sequence_on_a_cpu_without_xla_from_sequence_512():
  def rule(seq_length, dtype=tf.float32, on_cpu=True, use_xla=False):
    return pretraining.attends_per_sequence(seq_length, dtype, on_cpu, use_xla)
  assert rule(512) and rule(1024) and not rule(511) and not rule(128)
  assert not rule(512, on_cpu=False) and not rule(512, use_xla=True)
  # TensorFlow 1.15 compiles its CPU bfloat16 batched matmul for each new shape.
  assert rule(512, tf.bfloat16) == (not tf.__version__.startswith("1."))


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16])
def test_training_that_attends_per_sequence_with_dropout_learns_a_batch(dtype):
  """float16 with its loss scaling too."""
  lengths = [[16], [9], [4], [12]]
  with tf.Graph().as_default() as graph:
    tf.set_random_seed(1)
    feats = features(4, 16, 3)
    feats["input_mask"] = tf.constant((np.arange(16) < lengths).astype(np.int32))
    feats["masked_lm_positions"] = tf.constant(
        np.random.RandomState(2).randint(1, 4, [4, 3]), tf.int32)
    train = pretraining.build_train_graph(
        CONFIG, feats, dtype, config.Optimizer(learning_rate=0.1, num_train_steps=100),
        attention_per_sequence=True)
    assert [op for op in graph.get_operations() if "within_sequences" in op.name]
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      losses = [sess.run([train.update_op, train.outputs["total_loss"]])[1]
                for _ in range(30)]
  assert np.all(np.isfinite(losses))
  assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses


def test_attention_within_sequences_without_a_known_batch_size_or_beside_to_rows_is_refused():
  with tf.Graph().as_default():
    rows = tf.zeros([6, 16])
    args = dict(num_attention_heads=2, size_per_head=8, from_seq_length=3, to_seq_length=3,
                to_lengths=tf.constant([2, 1]))
    with pytest.raises(ValueError, match="to_lengths takes a Python int batch_size"):
      unpadded.attention_layer(rows, rows, batch_size=tf.constant(2), **args)
    with pytest.raises(ValueError, match="pass one of to_rows and to_lengths"):
      unpadded.attention_layer(rows, rows, batch_size=2, to_rows=tf.range(6), **args)
