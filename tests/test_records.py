"""Tests of bert_pretrain/records.py on records create_pretraining_data makes from
tests/data/sample_text.txt: the feature spec, the framing, parsing, validation and
serialization of one example."""

import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import create_pretraining_data
from bert_pretrain import input_pipeline
from bert_pretrain import records
from bert_pretrain import tokenization

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_TEXT = os.path.join(ROOT, "tests", "data", "sample_text.txt")
SEQ = 64
PRED = 10


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """Two record files of the sample text, their vocab size and serialized records."""
  root = tmp_path_factory.mktemp("records")
  vocab = str(root / "vocab.txt")
  tokenization.build_wordpiece_vocab([SAMPLE_TEXT], 600, vocab)
  paths = [str(root / "part-0"), str(root / "part-1")]
  create_pretraining_data.create_pretraining_data(
      [SAMPLE_TEXT], paths, vocab, max_seq_length=SEQ, max_predictions_per_seq=PRED,
      dupe_factor=2, random_seed=5)
  vocab_size = len(tokenization.load_vocab(vocab))
  serialized = list(tf.io.tf_record_iterator(paths[0]))
  assert len(serialized) > 20
  return {"paths": paths, "vocab_size": vocab_size, "serialized": serialized}


def damaged(data, tmp_path, name, change):
  """A copy of part-0 with `change(bytearray, offsets)` applied; returns (path, offsets)."""
  offsets, error = records.record_offsets(data["paths"][0])
  assert error is None
  content = bytearray(open(data["paths"][0], "rb").read())
  content = change(content, offsets)
  path = str(tmp_path / name)
  with open(path, "wb") as f:
    f.write(bytes(content))
  return path, offsets


def test_the_spec_has_seven_features_of_the_run_lengths():
  assert records.FEATURE_NAMES == ("input_ids", "input_mask", "segment_ids",
                                   "masked_lm_positions", "masked_lm_ids",
                                   "masked_lm_weights", "next_sentence_labels")
  assert records.FLOAT_FEATURES == ("masked_lm_weights",)
  assert set(records.INT_FEATURES) == set(records.FEATURE_NAMES) - {"masked_lm_weights"}
  spec = records.feature_spec(SEQ, PRED)
  assert list(spec) == list(records.FEATURE_NAMES)
  assert [spec[name].shape for name in records.FEATURE_NAMES] == [
      [SEQ], [SEQ], [SEQ], [PRED], [PRED], [PRED], [1]]
  assert spec["masked_lm_weights"].dtype == tf.float32
  assert spec["input_ids"].dtype == tf.int64


def test_a_written_example_parses_and_serializes_back_to_the_same_bytes(data):
  spec = records.feature_spec(SEQ, PRED)
  with tf.Graph().as_default(), tf.Session() as sess:
    serialized = tf.placeholder(tf.string, [])
    parsed_by_tf = tf.io.parse_single_example(serialized, spec)
    for record in data["serialized"][:20]:
      values = records.parse_example(record)
      assert values["input_ids"].dtype == np.int64
      assert values["masked_lm_weights"].dtype == np.float32
      assert records.wrong_length(values, SEQ, PRED) is None
      assert records.example_problem(values, SEQ, PRED, data["vocab_size"]) is None
      # The writer's fast encoder and serialize_example give the same bytes.
      assert records.serialize_example(values) == record
      expected = sess.run(parsed_by_tf, {serialized: record})
      for name in records.FEATURE_NAMES:
        np.testing.assert_array_equal(values[name], expected[name])


def test_every_written_record_passes_validation(data):
  for path in data["paths"]:
    offsets, error = records.record_offsets(path)
    assert error is None and records.corrupt_records(path, offsets) == []
    read = [payload for _, _, payload in records.read_records(path, offsets)]
    assert read == list(tf.io.tf_record_iterator(path))
    for payload in read:
      assert records.example_problem(records.parse_example(payload), SEQ, PRED,
                                     data["vocab_size"]) is None


def test_read_records_reads_only_the_indices_asked_for(data):
  path = data["paths"][0]
  offsets, _ = records.record_offsets(path)
  read = list(records.read_records(path, offsets, {1, 4}))
  assert [(index, offset) for index, offset, _ in read] == [(1, offsets[1][0]),
                                                            (4, offsets[4][0])]
  assert [payload for _, _, payload in read] == [data["serialized"][1],
                                                 data["serialized"][4]]


def test_a_flipped_byte_is_found_with_file_record_index_and_byte_offset(data, tmp_path):
  def flip(content, offsets):
    for index in (3, 7):
      content[offsets[index][0] + records.HEADER_BYTES + 40] ^= 0xFF
    return content
  path, offsets = damaged(data, tmp_path, "flipped", flip)
  # The framing is intact; the CRCs are not.
  assert records.record_offsets(path) == (offsets, None)
  assert records.corrupt_records(path, offsets) == [
      (3, offsets[3][0], "the CRC does not match the data"),
      (7, offsets[7][0], "the CRC does not match the data")]
  num_records, bad = input_pipeline.find_bad_records(path, SEQ, PRED, data["vocab_size"])
  assert num_records == len(offsets)
  assert [(r.path, r.index, r.offset) for r in bad] == [(path, 3, offsets[3][0]),
                                                        (path, 7, offsets[7][0])]


@pytest.mark.parametrize("inside", ["header", "data"])
def test_a_truncated_file_is_found_with_record_index_and_byte_offset(data, tmp_path, inside):
  cut_at = {"header": 5, "data": records.HEADER_BYTES + 30}[inside]
  path, offsets = damaged(data, tmp_path, "cut_" + inside,
                          lambda content, offsets: content[:offsets[6][0] + cut_at])
  found, error = records.record_offsets(path)
  assert found == offsets[:6]
  assert records.framed_end(found) == offsets[6][0]
  assert "record 6 at byte %d" % offsets[6][0] in error
  assert error.startswith("cut short: it ends inside the header" if inside == "header"
                          else "cut short or corrupt: record 6")
  _, bad = input_pipeline.find_bad_records(path, SEQ, PRED, data["vocab_size"])
  assert [(r.path, r.index, r.offset) for r in bad] == [(path, 6, offsets[6][0])]
  assert bad[0].problem == "the file is " + error


def test_validation_catches_a_token_id_at_or_above_vocab_size(data):
  vocab_size = data["vocab_size"]
  values = records.parse_example(data["serialized"][0])
  assert records.token_ids_outside(values, vocab_size).size == 0
  values["masked_lm_ids"][0] = vocab_size - 1
  assert records.token_ids_outside(values, vocab_size).size == 0
  values["input_ids"][2] = vocab_size
  values["masked_lm_ids"][0] = vocab_size + 5
  np.testing.assert_array_equal(records.token_ids_outside(values, vocab_size),
                                [vocab_size, vocab_size + 5])
  assert records.example_problem(values, SEQ, PRED, vocab_size) == (
      "token id %d is outside the vocab (%d tokens)" % (vocab_size + 5, vocab_size))
  # Serialized and read back, the trainer's check names the first id outside.
  assert input_pipeline._record_problem(records.serialize_example(values), SEQ, PRED,
                                        vocab_size) == (
      "token id %d is outside the vocab (vocab_size %d)" % (vocab_size, vocab_size))


def test_validation_catches_a_wrong_length(data):
  values = records.parse_example(data["serialized"][0])
  values["segment_ids"] = values["segment_ids"][:-1]
  assert records.wrong_length(values, SEQ, PRED) == ("segment_ids", SEQ - 1, SEQ)
  assert records.example_problem(values, SEQ, PRED) == (
      "segment_ids has %d values, not max_seq_length %d" % (SEQ - 1, SEQ))
  # A set of other lengths names its input_ids first.
  good = records.parse_example(data["serialized"][0])
  assert records.wrong_length(good, 128, PRED) == ("input_ids", SEQ, 128)
  assert records.wrong_length(good, SEQ, 20) == ("masked_lm_positions", PRED, 20)
  assert records.wrong_length(good, SEQ, 20, records.SET_LENGTH_FEATURES) == (
      "masked_lm_ids", PRED, 20)
  assert records.example_problem(good, SEQ, 20) == (
      "masked_lm_positions has %d values, not max_predictions_per_seq 20" % PRED)


def test_validation_catches_a_broken_layout(data):
  values = records.parse_example(data["serialized"][0])
  values["input_mask"][1] = 0
  assert records.example_problem(values, SEQ, PRED) == (
      "input_mask is not a run of ones followed by zeros")
  values = records.parse_example(data["serialized"][0])
  values["next_sentence_labels"][0] = 2
  assert records.example_problem(values, SEQ, PRED) == "next_sentence_labels is 2, not 0 or 1"


def test_parsing_names_what_is_not_a_pretraining_example(data):
  with pytest.raises(records.RecordError, match="^not a tf.train.Example$") as raised:
    records.parse_example(b"\xff\xff\xffjunk")
  assert raised.value.not_an_example
  example = tf.train.Example.FromString(data["serialized"][0])
  del example.features.feature["segment_ids"]
  del example.features.feature["masked_lm_weights"]
  with pytest.raises(records.RecordError, match="^lacks the feature segment_ids$") as raised:
    records.parse_example(example.SerializeToString())
  assert raised.value.missing == ("segment_ids", "masked_lm_weights")
  example = tf.train.Example.FromString(data["serialized"][0])
  example.features.feature["masked_lm_weights"].ClearField("float_list")
  example.features.feature["masked_lm_weights"].int64_list.value.extend([1] * PRED)
  with pytest.raises(records.RecordError,
                     match="^feature masked_lm_weights is a int64_list, not a float_list$"):
    records.parse_example(example.SerializeToString())
