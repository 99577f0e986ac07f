"""The model on packed records: the same sequences packed (several to a row, attention
within each) and unpacked (a row each) give the same losses and gradients."""

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain.data import records
from bert_pretrain.model import modeling
from bert_pretrain.model import shapes
from bert_pretrain.training import pretraining

CONFIG = modeling.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=37,
                             max_position_embeddings=64, type_vocab_size=2,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
SEQ, PREDICTIONS, K = 32, 5, 3
# Sequences in pack order: packs of 3 (9 + 14 + 7 = 30 tokens), 2, 2 and 1 sequences.
LENGTHS = [9, 14, 7, 20, 5, 11, 12, 32]
PACK_OF = [0, 0, 0, 1, 1, 2, 2, 3]


def unpacked_sequences(seed=0):
  """Records of LENGTHS' sequences ([CLS] A [SEP] B [SEP]), as parse_example gives a
  batch of them: dict name -> int64 / float32 array [sequences, its length]."""
  rng = np.random.RandomState(seed)
  n = len(LENGTHS)
  values = {name: np.zeros((n, length), np.float32 if name == "masked_lm_weights"
                           else np.int64)
            for name, length in records.feature_lengths(SEQ, PREDICTIONS).items()}
  for i, length in enumerate(LENGTHS):
    values["input_ids"][i, :length] = rng.randint(5, CONFIG.vocab_size, length)
    values["input_ids"][i, 0] = 1
    values["input_mask"][i, :length] = 1
    values["segment_ids"][i, length // 2:length] = 1
    count = max(1, min(PREDICTIONS, length // 6))  # about MLPerf's share of tokens
    positions = np.sort(rng.choice(np.arange(1, length - 1), count, replace=False))
    values["masked_lm_positions"][i, :count] = positions
    values["masked_lm_ids"][i, :count] = rng.randint(5, CONFIG.vocab_size, count)
    values["masked_lm_weights"][i, :count] = 1.0
    values["next_sentence_labels"][i, 0] = i % 3 == 0
  return values


def as_features(values):
  return {name: tf.constant(v.astype(np.float32 if v.dtype == np.float32 else np.int32))
          for name, v in values.items()}


def losses_and_gradients(dtype, path):
  """(packed, unpacked) lists of the three losses then every variable's gradient, on the
  encoder's `path`: "padded" (every position), "mask" (the real tokens, attention over
  every position) or "per-sequence" (each sequence's own attention)."""
  attention_per_sequence = path == "per-sequence"
  unpacked = unpacked_sequences()
  packed = records.pack_batch(unpacked, PACK_OF, max(PACK_OF) + 1, SEQ,
                              records.max_predictions_per_pack(PREDICTIONS, K), K)
  results = []
  with tf.Graph().as_default():
    tf.set_random_seed(3)
    for values in (packed, unpacked):
      with tf.variable_scope(tf.get_variable_scope(), reuse=tf.AUTO_REUSE):
        outputs = pretraining.build_model(CONFIG, as_features(values), True, dtype,
                                          attention_per_sequence=attention_per_sequence,
                                          drop_padding=path != "padded")
      tvars = tf.trainable_variables()
      grads = [tf.convert_to_tensor(g) for g in tf.gradients(outputs["total_loss"], tvars)]
      results.append([outputs[k] for k in ("total_loss", "mlm_loss", "nsp_loss")] + grads)
    within = [op for op in tf.get_default_graph().get_operations()
              if "within_sequences" in op.name]
    assert bool(within) == attention_per_sequence
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      return sess.run(results)


@pytest.mark.parametrize("path", ["padded", "mask", "per-sequence"])
@pytest.mark.parametrize("dtype,tolerance", [(tf.float32, 1e-5), (tf.float16, 5e-3),
                                             (tf.bfloat16, 3e-2)],
                         ids=["float32", "float16", "bfloat16"])
def test_packed_sequences_give_the_losses_and_gradients_of_the_same_sequences_unpacked(
    dtype, tolerance, path):
  packed, unpacked = losses_and_gradients(dtype, path)
  assert len(packed) == len(unpacked) > 3
  largest = 0.0
  for ours, theirs in zip(packed, unpacked):
    scale = max(np.abs(theirs).max(), 1e-3)
    np.testing.assert_allclose(ours, theirs, atol=tolerance * scale, rtol=tolerance)
    largest = max(largest, float(np.abs(ours - theirs).max() / scale))
  assert all(np.abs(g).max() > 0 for g in unpacked[3:])  # every variable learns
  print("%s, %s: losses %s; largest difference, relative to each tensor's largest value, "
        "%.2g" % (dtype.name, path, np.round(packed[:3], 5), largest))


def test_a_packed_sequence_attends_to_its_own_tokens_only():
  """Changing one sequence of a pack leaves the others' outputs as they were."""
  values = records.pack_batch(unpacked_sequences(), PACK_OF, max(PACK_OF) + 1, SEQ,
                              records.max_predictions_per_pack(PREDICTIONS, K), K)
  changed = {name: v.copy() for name, v in values.items()}
  second = values["input_mask"][0] == 2
  changed["input_ids"][0, second] = 7
  with tf.Graph().as_default():
    outputs = []
    for batch in (values, changed):
      feats = as_features(batch)
      with tf.variable_scope(tf.get_variable_scope(), reuse=tf.AUTO_REUSE):
        model = modeling.BertModel(CONFIG, False, feats["input_ids"], feats["input_mask"],
                                   feats["segment_ids"], packed=True,
                                   position_ids=feats["positions"],
                                   cls_positions=feats["next_sentence_positions"])
      outputs.append(model.get_sequence_output())
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      before, after = sess.run(outputs)
  others = np.isin(values["input_mask"][0], [1, 3])  # (padding attends to nothing)
  # Equal up to the rounding of matmuls over other values (their weight is exactly 0).
  np.testing.assert_allclose(before[0, others], after[0, others], atol=1e-5)
  assert np.abs(before[0, second] - after[0, second]).max() > 1e-2


def test_packed_rows_mask_attention_block_by_block():
  with tf.Graph().as_default():
    mask = shapes.create_attention_mask_from_sequence_ids(tf.constant([[1, 1, 2, 0]]))
    rows = shapes.attention_mask_at(mask, tf.constant([[2, 0]]))
    with tf.Session() as sess:
      mask, rows = sess.run([mask, rows])
  np.testing.assert_array_equal(mask[0], [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0],
                                          [0, 0, 0, 0]])
  np.testing.assert_array_equal(rows[0], [[0, 0, 1, 0], [1, 1, 0, 0]])
