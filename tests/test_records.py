"""Tests of bert_pretrain/data/records.py on records create_pretraining_data makes from
tests/data/sample_text.txt: the feature spec, the framing, parsing, validation and
serialization of one example."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import create_pretraining_data
from bert_pretrain.data import input_pipeline
from bert_pretrain.data import records
from bert_pretrain.data import tokenization

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
      # What create_pretraining_data wrote is protobuf's own serialization of the values.
      assert reference_bytes(values, records.FEATURE_NAMES, records.FLOAT_FEATURES) == record
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


def test_reading_records_prints_no_deprecation_warning_before_a_tools_line(data):
  # In a process of its own: TensorFlow warns once a process.
  script = ("import sys; from bert_pretrain.data import records; "
            "print(len(list(records.record_iterator(sys.argv[1]))))")
  result = subprocess.run([sys.executable, "-c", script, data["paths"][0]],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, cwd=ROOT, timeout=120)
  assert result.returncode == 0, result.stderr
  assert int(result.stdout) == len(data["serialized"])
  assert "deprecat" not in result.stderr, result.stderr


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


# ---------------------------------------------------------------------------------------
# The packed format.
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def short(tmp_path_factory):
  """Records with short sequences: the sample text's sentences cut to their first 6
  words, in documents of two; and groups of up to 3 records in file order, each
  fitting 64 tokens and 13 predictions."""
  root = tmp_path_factory.mktemp("short")
  vocab = str(root / "vocab.txt")
  tokenization.build_wordpiece_vocab([SAMPLE_TEXT], 600, vocab)
  sentences = [" ".join(line.split()[:6]) for line in open(SAMPLE_TEXT, encoding="utf-8")
               if line.strip()]
  text = root / "short.txt"
  text.write_text("\n\n".join("\n".join(sentences[i:i + 2])
                              for i in range(0, len(sentences) - 1, 2)) + "\n",
                  encoding="utf-8")
  path = str(root / "part-0")
  create_pretraining_data.create_pretraining_data(
      [str(text)], [path], vocab, max_seq_length=SEQ, max_predictions_per_seq=PRED,
      dupe_factor=1, random_seed=9)
  serialized = list(tf.io.tf_record_iterator(path))
  groups, group = [], []
  for record in serialized:
    values = records.parse_example(record)
    candidate = group + [(record, values)]
    tokens = sum(int(v["input_mask"].sum()) for _, v in candidate)
    predictions = sum(int(v["masked_lm_weights"].sum()) for _, v in candidate)
    if len(candidate) > 3 or tokens > SEQ or predictions > PRED + 3:
      groups.append(group)
      candidate = [(record, values)]
    group = candidate
  groups.append(group)
  assert sum(len(g) > 1 for g in groups) > 10 and any(len(g) == 3 for g in groups)
  return {"groups": groups, "vocab_size": len(tokenization.load_vocab(vocab))}


def reference_bytes(values, names, float_names):
  """tf.train.Example's own deterministic serialization of these values."""
  feature = {}
  for name in names:
    if name in float_names:
      feature[name] = tf.train.Feature(float_list=tf.train.FloatList(
          value=np.asarray(values[name]).tolist()))
    else:
      feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(
          value=np.asarray(values[name]).tolist()))
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(
      deterministic=True)


def test_the_packed_spec_has_habanas_ten_features():
  assert records.PACKED_FEATURE_NAMES == (
      "input_ids", "input_mask", "segment_ids", "positions", "masked_lm_positions",
      "masked_lm_ids", "masked_lm_weights", "next_sentence_positions",
      "next_sentence_labels", "next_sentence_weights")
  assert records.PACKED_ONLY == ("positions", "next_sentence_positions",
                                 "next_sentence_weights")
  assert records.PACKED_FLOAT_FEATURES == ("masked_lm_weights", "next_sentence_weights")
  assert records.max_predictions_per_pack(76, 3) == 79
  spec = records.packed_feature_spec(512, 79, 3)
  assert [spec[name].shape for name in records.PACKED_FEATURE_NAMES] == [
      [512], [512], [512], [512], [79], [79], [79], [3], [3], [3]]
  assert records.is_packed(spec) and not records.is_packed(records.feature_spec(512, 76))


def test_packed_records_round_trip_to_the_same_unpacked_records(short):
  spec = records.packed_feature_spec(SEQ, PRED + 3, 3)
  with tf.Graph().as_default(), tf.Session() as sess:
    serialized = tf.placeholder(tf.string, [])
    parsed_by_tf = tf.io.parse_single_example(serialized, spec)
    for group in short["groups"]:
      sequences = [values for _, values in group]
      packed = records.pack_sequences(sequences, SEQ, PRED + 3, 3)
      record = records.serialize_example(packed)
      assert record == reference_bytes(packed, records.PACKED_FEATURE_NAMES,
                                       records.PACKED_FLOAT_FEATURES)
      assert records.record_layout(record) == (True, SEQ, PRED + 3, 3)
      values = records.parse_example(record, packed=None)
      expected = sess.run(parsed_by_tf, {serialized: record})
      for name in records.PACKED_FEATURE_NAMES:
        np.testing.assert_array_equal(values[name], expected[name])
        np.testing.assert_array_equal(values[name], packed[name])
      assert records.packed_example_problem(values, SEQ, PRED + 3, 3,
                                            short["vocab_size"]) is None
      # Each [CLS] is where next_sentence_positions says, each masked position holds
      # the same token as in its own record.
      starts = values["next_sentence_positions"][:len(group)]
      for slot, (_, sequence) in enumerate(group):
        start = starts[slot]
        assert values["input_ids"][start] == sequence["input_ids"][0]
        assert values["positions"][start] == 0 and values["input_mask"][start] == slot + 1
      predicted = values["masked_lm_weights"] > 0
      owners = values["input_mask"][values["masked_lm_positions"][predicted]]
      assert list(owners) == sorted(owners)
      unpacked = records.unpack_example(values, PRED)
      assert [records.serialize_example(v) for v in unpacked] == [r for r, _ in group]


def test_unpacked_records_are_recognised_as_such(data):
  assert records.record_layout(data["serialized"][0]) == (False, SEQ, PRED, 1)
  assert not records.is_packed(records.parse_example(data["serialized"][0], packed=None))


def test_packed_validation_names_what_is_wrong(short):
  group = [g for g in short["groups"] if len(g) == 2][0]
  good = records.pack_sequences([v for _, v in group], SEQ, PRED + 3, 3)
  start = good["next_sentence_positions"][1]
  used = int(np.count_nonzero(good["input_mask"]))

  def problem(change, vocab_size=None):
    values = {name: value.copy() for name, value in good.items()}
    change(values)
    return records.packed_example_problem(values, SEQ, PRED + 3, 3, vocab_size)

  def set_value(name, index, value):
    return lambda values: values[name].__setitem__(index, value)

  assert problem(lambda v: None) is None
  assert problem(lambda v: v.__setitem__("positions", v["positions"][:-1])) == (
      "positions has %d values, not max_seq_length %d" % (SEQ - 1, SEQ))
  assert problem(set_value("positions", start, 7)) == (
      "positions do not restart at 0 at each sequence")
  assert problem(set_value("input_mask", start, 3)) == (
      "input_mask is not the sequence indices 1, 2, ... of the tokens followed by zeros")
  assert problem(set_value("next_sentence_positions", 1, start + 1)) == (
      "next_sentence_positions are not the positions of the sequences' [CLS]")
  assert problem(set_value("next_sentence_weights", 2, 1.0)) == (
      "next_sentence_weights are not 1.0 for each of the 2 sequences then 0.0")
  assert problem(set_value("next_sentence_labels", 0, 2)) == (
      "next_sentence_labels are not 0 or 1 (0 in the empty slots)")
  if used < SEQ:
    assert problem(set_value("input_ids", SEQ - 1, 5)) == (
        "input_ids are not zero-padded after the last sequence")

  def habana_weights(values):
    predicted = values["masked_lm_weights"] > 0
    owners = values["input_mask"][values["masked_lm_positions"][predicted]]
    values["masked_lm_weights"][predicted] = owners

  assert problem(habana_weights).startswith(
      "masked_lm_weights hold sequence indices (Habana's and Graphcore's packers write "
      "them), not 1.0 weights")

  def mask_the_second_cls(values):
    positions = values["masked_lm_positions"]
    second = np.flatnonzero(positions >= start)[0]
    positions[second] = start

  assert problem(mask_the_second_cls) == (
      "masked_lm_positions are not ascending positions inside the sequences")
  assert problem(set_value("input_ids", 1, short["vocab_size"]), short["vocab_size"]) == (
      "token id %d is outside the vocab (%d tokens)" % (short["vocab_size"],
                                                        short["vocab_size"]))


def test_a_pack_refuses_what_does_not_fit(data, short):
  full = [records.parse_example(r) for r in data["serialized"][:4]]
  with pytest.raises(ValueError, match="more than max_seq_length 64 tokens"):
    records.pack_sequences(full[:2], SEQ, 3 * PRED, 3)
  group = [v for _, v in [g for g in short["groups"] if len(g) == 3][0]]
  with pytest.raises(ValueError, match="more than max_predictions_per_pack 2 predictions"):
    records.pack_sequences(group, SEQ, 2, 3)
  with pytest.raises(ValueError, match="3 sequences do not fit a pack of 2"):
    records.pack_sequences(group, SEQ, PRED + 3, 2)


def test_the_batch_check_gives_each_records_own_problem(data):
  rows = [records.parse_example(r) for r in data["serialized"][:6]]
  rows[1]["input_mask"][3] = 0
  rows[2]["masked_lm_weights"][0] = 0.5
  rows[3]["next_sentence_labels"][0] = 7
  rows[4]["masked_lm_positions"][0] = 0
  rows[5]["input_ids"][0] = data["vocab_size"] + 2
  batch = {name: np.stack([row[name] for row in rows]) for name in records.FEATURE_NAMES}
  problems = records.example_problems(batch, data["vocab_size"])
  assert problems == [records.example_problem(row, SEQ, PRED, data["vocab_size"])
                      for row in rows]
  assert problems[0] is None and all(problems[1:])
  assert problems[3] == "next_sentence_labels is 7, not 0 or 1"


@pytest.mark.parametrize("top", [1, 127, 128, 2 ** 14 - 1, 2 ** 14, 2 ** 21 - 1, 2 ** 21,
                                 2 ** 28, 2 ** 35, 2 ** 63 - 1])
def test_the_batch_encoder_writes_tensorflows_bytes_for_ids_up_to_any_size(data, top):
  # The largest id sets how many bytes a value may take, and so how they are made.
  values = records.parse_example(data["serialized"][0])
  rng = np.random.default_rng(top % 1000)
  batch = {name: np.stack([values[name]] * 4) for name in records.FEATURE_NAMES}
  batch["input_ids"] = rng.integers(0, top, batch["input_ids"].shape, endpoint=True)
  batch["input_ids"][0, 0] = top
  batch["input_ids"][1, :8] = np.minimum([0, 1, 127, 128, 16383, 16384, top // 2, top], top)
  rows = [{name: batch[name][row] for name in records.FEATURE_NAMES} for row in range(4)]
  assert records.serialize_examples(batch) == [
      reference_bytes(row, records.FEATURE_NAMES, records.FLOAT_FEATURES) for row in rows]


def test_features_with_different_numbers_of_records_are_refused_not_cut(data):
  values = records.parse_example(data["serialized"][0])
  batch = {name: np.stack([values[name]] * 3) for name in records.FEATURE_NAMES}
  batch["next_sentence_labels"] = batch["next_sentence_labels"][:2]
  with pytest.raises(ValueError, match="different numbers of records: .*input_ids 3, .*"
                     "next_sentence_labels 2"):
    records.serialize_examples(batch)


def test_the_batch_encoder_writes_tensorflows_bytes_for_any_int64(data):
  values = records.parse_example(data["serialized"][0])
  values["input_ids"][:4] = [-5, 2 ** 40, 2 ** 63 - 1, -2 ** 63]
  values["masked_lm_weights"][0] = -0.0
  batch = {name: np.stack([values[name]] * 3) for name in records.FEATURE_NAMES}
  expected = reference_bytes(values, records.FEATURE_NAMES, records.FLOAT_FEATURES)
  assert records.serialize_examples(batch) == [expected] * 3
  assert records.parse_example(expected)["input_ids"][:4].tolist() == [
      -5, 2 ** 40, 2 ** 63 - 1, -2 ** 63]
