# coding=utf-8
"""Tests of bert_pretrain.create_pretraining_data on real English text.

The records are checked against Google's format and rules: the features and their
shapes, the [CLS] A [SEP] B [SEP] layout, masking and next-sentence statistics, and
instance statistics against a plain re-implementation of Google's instance loop.
"""

import gzip
import os
import random
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import create_pretraining_data as cpd
from bert_pretrain.data import records
from bert_pretrain.data import tokenization
from conftest import run_command, signal_when, start_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_TEXT = os.path.join(ROOT, "tests", "data", "sample_text.txt")
SEQ = 128
PRED = 20
DUPE = 20


def read_records(paths):
  """Parses TFRecord files into a list of dicts of numpy arrays (one per example)."""
  examples = []
  for path in paths:
    for record in tf.io.tf_record_iterator(path):
      example = tf.train.Example.FromString(record)
      features = {}
      for name, feature in example.features.feature.items():
        if feature.HasField("int64_list"):
          features[name] = np.array(feature.int64_list.value, dtype=np.int64)
        else:
          features[name] = np.array(feature.float_list.value, dtype=np.float32)
      features["_record"] = record
      examples.append(features)
  return examples


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
  tokenization.build_wordpiece_vocab([SAMPLE_TEXT], 600, path)
  return path


@pytest.fixture(scope="module")
def tokenizer(vocab_file):
  return tokenization.FullTokenizer(vocab_file)


def make_data(tmp_path, vocab_file, num_files=1, **kwargs):
  outputs = [str(tmp_path / ("part-%d.tfrecord" % i)) for i in range(num_files)]
  args = dict(max_seq_length=SEQ, max_predictions_per_seq=PRED, dupe_factor=2)
  args.update(kwargs)
  stats = cpd.create_pretraining_data([SAMPLE_TEXT], outputs, vocab_file, **args)
  return stats, outputs


@pytest.fixture(scope="module")
def data(tmp_path_factory, vocab_file):
  """One run with enough instances (~700) for statistics, over two output files."""
  stats, outputs = make_data(tmp_path_factory.mktemp("data"), vocab_file, num_files=2,
                             dupe_factor=DUPE)
  return stats, outputs, read_records(outputs)


@pytest.fixture(scope="module")
def document_streams(tokenizer):
  """Each document of the sample text as one comma-joined string of its token ids."""
  documents = open(SAMPLE_TEXT, encoding="utf-8").read().strip().split("\n\n")
  streams = []
  for document in documents:
    ids = tokenizer.convert_tokens_to_ids(tokenizer.reference_tokenize(document))
    streams.append("," + ",".join(str(i) for i in ids) + ",")
  return streams


def split_example(example, tokenizer):
  """Returns (len, len_a, original ids) of a parsed example, masks undone."""
  length = int(example["input_mask"].sum())
  len_a = int(np.argmax(example["segment_ids"])) - 2
  original = example["input_ids"][:length].copy()
  num = int(example["masked_lm_weights"].sum())
  original[example["masked_lm_positions"][:num]] = example["masked_lm_ids"][:num]
  return length, len_a, original


def test_statistics(data):
  stats, outputs, examples = data
  for key in ("num_documents", "num_instances", "num_masked_tokens", "num_input_bytes",
              "num_sentences", "num_random_next"):
    assert key in stats
  assert stats["num_documents"] == 9
  assert stats["num_input_bytes"] == os.path.getsize(SAMPLE_TEXT)
  assert stats["num_instances"] == len(examples) > 600
  assert stats["num_masked_tokens"] == sum(int(e["masked_lm_weights"].sum()) for e in examples)
  assert stats["num_random_next"] == sum(int(e["next_sentence_labels"][0]) for e in examples)
  # Round-robin: the files differ by at most one record.
  counts = [len(list(tf.io.tf_record_iterator(p))) for p in outputs]
  assert sum(counts) == len(examples) and abs(counts[0] - counts[1]) <= 1


def test_feature_spec_and_shapes(data):
  _, outputs, examples = data
  names = {"input_ids", "input_mask", "segment_ids", "masked_lm_positions",
           "masked_lm_ids", "masked_lm_weights", "next_sentence_labels"}
  assert set(records.FEATURE_NAMES) == set(records.feature_spec(SEQ, PRED)) == names
  example = tf.train.Example.FromString(examples[0]["_record"])
  assert set(example.features.feature) == names
  for name in names - {"masked_lm_weights"}:
    assert example.features.feature[name].HasField("int64_list"), name
  assert example.features.feature["masked_lm_weights"].HasField("float_list")
  for e in examples:
    for name in ("input_ids", "input_mask", "segment_ids"):
      assert e[name].shape == (SEQ,)
    for name in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
      assert e[name].shape == (PRED,)
    assert e["next_sentence_labels"].shape == (1,)
  # The parsing spec the trainer uses reads the records.
  spec = records.feature_spec(SEQ, PRED)
  with tf.Graph().as_default():
    parsed = tf.io.parse_single_example(examples[0]["_record"], spec)
    with tf.Session() as sess:
      values = sess.run(parsed)
  np.testing.assert_array_equal(values["input_ids"], examples[0]["input_ids"])
  assert values["masked_lm_weights"].dtype == np.float32


def test_records_are_canonical_protobuf(data):
  _, _, examples = data
  for e in examples[:50]:
    proto = tf.train.Example.FromString(e["_record"])
    assert proto.SerializeToString(deterministic=True) == e["_record"]


def test_layout(data, tokenizer):
  _, _, examples = data
  cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
  for e in examples:
    length, len_a, _ = split_example(e, tokenizer)
    len_b = length - len_a - 3
    assert len_a >= 1 and len_b >= 1 and length <= SEQ
    ids = e["input_ids"]
    assert ids[0] == cls_id and ids[len_a + 1] == sep_id and ids[length - 1] == sep_id
    assert (ids[length:] == 0).all()
    np.testing.assert_array_equal(e["input_mask"], np.arange(SEQ) < length)
    expected_segments = (np.arange(SEQ) >= len_a + 2) & (np.arange(SEQ) < length)
    np.testing.assert_array_equal(e["segment_ids"], expected_segments)
    num = int(e["masked_lm_weights"].sum())
    positions = e["masked_lm_positions"][:num]
    assert (e["masked_lm_weights"][:num] == 1).all() and (e["masked_lm_weights"][num:] == 0).all()
    assert (e["masked_lm_positions"][num:] == 0).all() and (e["masked_lm_ids"][num:] == 0).all()
    assert (np.diff(positions) > 0).all()
    assert not set(positions.tolist()) & {0, len_a + 1, length - 1}
    assert positions.max() < length


def test_masking_statistics(data, tokenizer):
  _, _, examples = data
  mask_id = tokenizer.vocab["[MASK]"]
  num_masked = num_tokens = kept = masked = replaced = 0
  relative_positions = []
  for e in examples:
    length = int(e["input_mask"].sum())
    num = int(e["masked_lm_weights"].sum())
    # Google's count exactly: min(max_predictions, max(1, round(len * 0.15))).
    assert num == min(PRED, max(1, int(round(length * 0.15))))
    num_masked += num
    num_tokens += length
    relative_positions.extend((e["masked_lm_positions"][:num] - 1) / (length - 3))
    shown = e["input_ids"][e["masked_lm_positions"][:num]]
    labels = e["masked_lm_ids"][:num]
    masked += int((shown == mask_id).sum())
    kept += int((shown == labels).sum())
    replaced += int(((shown != mask_id) & (shown != labels)).sum())
  assert num_masked > 10000
  assert abs(num_masked / num_tokens - 0.15) < 0.01
  # Binomial standard deviations are ~0.004 (80%) and ~0.003 (10%) here.
  assert abs(masked / num_masked - 0.8) < 0.02
  assert abs(kept / num_masked - 0.1) < 0.015
  assert abs(replaced / num_masked - 0.1) < 0.015
  # Positions are uniform over the sequence: mean 1/2, no quarter favoured.
  assert abs(np.mean(relative_positions) - 0.5) < 0.01
  quarters = np.histogram(relative_positions, bins=4, range=(0, 1.0001))[0]
  assert (abs(quarters / len(relative_positions) - 0.25) < 0.015).all()


def test_max_predictions_cap(tmp_path, vocab_file):
  stats, outputs = make_data(tmp_path, vocab_file, max_predictions_per_seq=5, dupe_factor=1)
  for e in read_records(outputs):
    assert int(e["masked_lm_weights"].sum()) == 5
    assert e["masked_lm_positions"].shape == (5,)


def test_masked_labels_are_the_original_text(data, tokenizer, document_streams):
  """Undoing the masks gives A and B as runs of real text; label 0 means B follows A."""
  _, _, examples = data
  random_next = 0
  for e in examples:
    length, len_a, original = split_example(e, tokenizer)
    tokens_a = "," + ",".join(str(i) for i in original[1:len_a + 1]) + ","
    tokens_b = "," + ",".join(str(i) for i in original[len_a + 2:length - 1]) + ","
    docs_a = [i for i, s in enumerate(document_streams) if tokens_a in s]
    docs_b = [i for i, s in enumerate(document_streams) if tokens_b in s]
    assert docs_a and docs_b
    is_random = int(e["next_sentence_labels"][0])
    random_next += is_random
    if len_a >= 8 and length - len_a - 3 >= 8:
      # Long runs are unique to one document of the sample text.
      assert len(docs_a) == 1 and len(docs_b) == 1
      if is_random:
        assert docs_a != docs_b
      else:
        assert docs_a == docs_b
        stream = document_streams[docs_a[0]]
        assert stream.index(tokens_a) < stream.index(tokens_b)
  # Google's rate is a little above 1/2: one-sentence chunks always take a random B.
  assert 0.45 < random_next / len(examples) < 0.65


def google_instance_lengths(documents, max_seq_length, short_seq_prob, dupe_factor, rng):
  """Google's instance loop, written plainly: (len_a, len_b, is_random_next) each."""
  instances = []
  for _ in range(dupe_factor):
    for document_index, document in enumerate(documents):
      max_num_tokens = max_seq_length - 3
      target = max_num_tokens
      if rng.random() < short_seq_prob:
        target = rng.randint(2, max_num_tokens)
      chunk, length, i = [], 0, 0
      while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
          a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
          tokens_a = [t for s in chunk[:a_end] for t in s]
          tokens_b = []
          if len(chunk) == 1 or rng.random() < 0.5:
            is_random = True
            for _ in range(10):
              other = rng.randint(0, len(documents) - 1)
              if other != document_index:
                break
            start = rng.randint(0, len(documents[other]) - 1)
            for sentence in documents[other][start:]:
              tokens_b.extend(sentence)
              if len(tokens_b) >= target - len(tokens_a):
                break
            i -= len(chunk) - a_end
          else:
            is_random = False
            tokens_b = [t for s in chunk[a_end:] for t in s]
          while len(tokens_a) + len(tokens_b) > max_num_tokens:
            longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
            if rng.random() < 0.5:
              del longer[0]
            else:
              longer.pop()
          instances.append((len(tokens_a), len(tokens_b), is_random))
          chunk, length = [], 0
        i += 1
  return instances


@pytest.mark.parametrize("max_seq_length,short_seq_prob", [(128, 0.1), (64, 0.5)])
def test_instance_statistics_match_google(tokenizer, max_seq_length, short_seq_prob):
  documents, _, _ = cpd.read_documents([SAMPLE_TEXT], tokenizer, np.int32)
  as_lists = [[d.token_ids[b:e].tolist() for b, e in zip(d.sentence_bounds,
                                                          d.sentence_bounds[1:])]
              for d in documents]
  # Many passes: with nine documents, a pass's counts vary by several percent.
  passes = 300
  ours = []
  rng = random.Random(1)
  for _ in range(passes):
    for index in range(len(documents)):
      batch = []
      cpd.create_instances_from_document(documents, index, max_seq_length,
                                         short_seq_prob, rng, batch)
      ours.extend((len(a), len(b), r) for a, b, r in batch)
  google = google_instance_lengths(as_lists, max_seq_length, short_seq_prob, passes,
                                   random.Random(2))

  def summary(instances):
    a, b, r = (np.array(x, dtype=np.float64) for x in zip(*instances))
    return len(instances), a.mean(), b.mean(), r.mean(), (a + b).mean()

  ours_summary, google_summary = summary(ours), summary(google)
  # Count, mean A and B lengths, random-next rate, mean A+B length: within 3%.
  for mine, theirs in zip(ours_summary, google_summary):
    assert abs(mine / theirs - 1) < 0.03, (ours_summary, google_summary)
  assert max(a + b for a, b, _ in ours) <= max_seq_length - 3
  assert min(min(a, b) for a, b, _ in ours) >= 1


def test_truncation_counts_match_google():
  for max_num_tokens in (2, 5, 10):
    for len_a in range(1, 16):
      for len_b in range(1, 16):
        a, b = len_a, len_b
        while a + b > max_num_tokens:
          if a > b:
            a -= 1
          else:
            b -= 1
        assert cpd.num_tokens_to_truncate(len_a, len_b, max_num_tokens) == (
            len_a - a, len_b - b)


def test_trim_is_fair():
  rng = random.Random(0)
  tokens = np.arange(20)
  fronts = [int(cpd._trim(tokens, 10, rng)[0]) for _ in range(4000)]
  # Tokens removed from the front ~ Binomial(10, 1/2): mean 5, variance 2.5.
  assert abs(np.mean(fronts) - 5) < 0.1 and abs(np.var(fronts) - 2.5) < 0.3


def test_whole_word_masking(tmp_path, vocab_file, tokenizer):
  stats, outputs = make_data(tmp_path, vocab_file, do_whole_word_mask=True, dupe_factor=4)
  examples = read_records(outputs)
  is_continuation = {i for t, i in tokenizer.vocab.items() if t.startswith("##")}
  sep_id = tokenizer.vocab["[SEP]"]
  num_words_split = 0
  for e in examples:
    length, len_a, original = split_example(e, tokenizer)
    num = int(e["masked_lm_weights"].sum())
    masked = set(e["masked_lm_positions"][:num].tolist())
    assert 1 <= num <= min(PRED, max(1, int(round(length * 0.15))))
    # Candidates in order: A then B (Google joins a "##" after [SEP] to A's last word).
    candidates = list(range(1, len_a + 1)) + list(range(len_a + 2, length - 1))
    for previous, current in zip(candidates, candidates[1:]):
      if original[current] in is_continuation:
        # A word piece is masked exactly when the piece before it is.
        assert (previous in masked) == (current in masked)
        num_words_split += 1
    assert original[len_a + 1] == sep_id
  assert num_words_split > 100
  assert stats["num_masked_tokens"] > 0


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path, vocab_file):
  _, first = make_data(tmp_path / "a", vocab_file, random_seed=7)
  _, second = make_data(tmp_path / "b", vocab_file, random_seed=7)
  _, third = make_data(tmp_path / "c", vocab_file, random_seed=8)
  data = [open(p[0], "rb").read() for p in (first, second, third)]
  assert data[0] == data[1]
  assert data[0] != data[2]


def test_no_temporary_files_left(tmp_path, vocab_file, monkeypatch):
  make_data(tmp_path, vocab_file, num_files=2, dupe_factor=1)
  assert sorted(os.listdir(tmp_path)) == ["part-0.tfrecord", "part-1.tfrecord"]

  def fail(*args, **kwargs):
    raise RuntimeError("disk full")

  failed = tmp_path / "failed"
  monkeypatch.setattr(cpd.records, "serialize_examples", fail)
  with pytest.raises(RuntimeError, match="disk full"):
    make_data(failed, vocab_file, num_files=2, dupe_factor=1)
  # Nothing half-written is left, under the final name or the temporary one.
  assert os.listdir(failed) == []


def _write(path, text, mode="w"):
  with open(str(path), mode) as f:
    f.write(text)
  return str(path)


def bad_cases(tmp_path, vocab_file):
  """(description, kwargs, expected message part) of bad inputs."""
  empty = _write(tmp_path / "empty.txt", "\n\n  \n")
  latin1 = _write(tmp_path / "latin1.txt", "caf\xe9\n".encode("latin-1"), mode="wb")
  made = str(tmp_path / "made.tfrecord")
  with tf.io.TFRecordWriter(made) as writer:
    writer.write(b"\xff\xfe a record")
  packed = _write(tmp_path / "dump.xml.gz", gzip.compress(b"<mediawiki/>"), mode="wb")
  no_mask_vocab = _write(tmp_path / "vocab_no_mask.txt",
                         "[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
  out = [str(tmp_path / "out.tfrecord")]
  (tmp_path / "shards").mkdir(exist_ok=True)
  _write(tmp_path / "shards" / "part-00000-of-00002", "")
  (tmp_path / "empty").mkdir(exist_ok=True)
  return [
      ("missing input", dict(input_files=[str(tmp_path / "nope.txt")]),
       "input file .*nope.txt' does not exist; check --input_file"),
      ("input is a folder", dict(input_files=[str(tmp_path)]),
       "input file .* is a folder; pass the text files in it, e.g. --input_file=.*/\\*.txt"),
      ("input is a folder of shards", dict(input_files=[str(tmp_path / "shards")]),
       "input file .*shards' is a folder; pass the text files in it, e.g. "
       "--input_file=.*shards/\\*$"),
      ("input is an empty folder", dict(input_files=[str(tmp_path / "empty")]),
       "input file .*empty' is an empty folder; pass the corpus's text files"),
      ("glob matches nothing", dict(input_files=str(tmp_path / "none-*.txt")),
       "matches no files"),
      ("input named and matched", dict(input_files="%s,%s" % (
          SAMPLE_TEXT, os.path.join(os.path.dirname(SAMPLE_TEXT), "*"))),
       "input file .* is given twice in --input_file \\(named and matched by a pattern, "
       "say\\): its documents would be read twice; list each once"),
      ("no input", dict(input_files=[]), "no input files given"),
      ("empty input", dict(input_files=[empty]), "hold no text"),
      ("not utf-8", dict(input_files=[latin1]), "is not UTF-8 .* convert it to UTF-8"),
      ("tfrecords", dict(input_files=[made]), "is TFRecords \\(made already\\), not text; "
       "pass the text files they were made from$"),
      ("compressed", dict(input_files=[packed]), "is compressed \\(gzip\\), not text; pass "
       "the text \\(a Wikipedia dump goes through tools/prepare_wiki.sh\\)$"),
      ("missing vocab", dict(vocab_file=str(tmp_path / "vocab.txt")),
       "vocab file .* does not exist"),
      ("vocab is its folder", dict(vocab_file=os.path.dirname(vocab_file)),
       "vocab file .* is a folder; pass the vocab file, e.g. .*/vocab.txt"),
      ("vocab is a folder", dict(vocab_file=str(tmp_path)),
       "vocab file .* is a folder; pass the vocab file in it"),
      ("vocab without [MASK]", dict(vocab_file=no_mask_vocab), r"lacks \[MASK\]"),
      ("too many predictions", dict(max_seq_length=16, max_predictions_per_seq=17),
       "max_predictions_per_seq=17 must be between 1 and max_seq_length=16"),
      ("no predictions", dict(max_predictions_per_seq=0), "max_predictions_per_seq=0"),
      ("tiny sequences", dict(max_seq_length=4, max_predictions_per_seq=1),
       "max_seq_length=4 is too small"),
      ("masked_lm_prob 0", dict(masked_lm_prob=0.0), r"masked_lm_prob=0 must be in \(0, 1\]"),
      ("short_seq_prob > 1", dict(short_seq_prob=1.5), "short_seq_prob=1.5"),
      ("dupe_factor 0", dict(dupe_factor=0), "dupe_factor=0 must be >= 1"),
      ("negative seed", dict(random_seed=-1), "random_seed=-1 must be >= 0"),
      ("no output", dict(output_files=[]), "no output files given"),
      ("output twice", dict(output_files=out + out), "listed twice"),
      ("output is input", dict(output_files=[SAMPLE_TEXT]), "is also an input file"),
      ("output is the vocab", dict(output_files=[vocab_file]), "is also the vocab file"),
  ]


def test_bad_inputs(tmp_path, vocab_file):
  vocab = open(vocab_file, "rb").read()
  for description, overrides, message in bad_cases(tmp_path, vocab_file):
    args = dict(input_files=[SAMPLE_TEXT], output_files=[str(tmp_path / "o.tfrecord")],
                vocab_file=vocab_file, max_seq_length=SEQ, max_predictions_per_seq=PRED,
                dupe_factor=1)
    args.update(overrides)
    with pytest.raises(ValueError, match=message) as error:
      cpd.create_pretraining_data(**args)
    assert "\n" not in str(error.value), description
    assert not os.path.exists(str(tmp_path / "o.tfrecord")), description
  assert open(vocab_file, "rb").read() == vocab


def _run_cli(*flags):
  return run_command("bert_pretrain.create_pretraining_data", *flags, timeout=120)


def test_command_line(tmp_path, vocab_file):
  output = str(tmp_path / "cli.tfrecord")
  result = _run_cli("--input_file=%s" % os.path.join(ROOT, "tests", "data", "sample_*.txt"),
                    "--output_file=%s" % output, "--vocab_file=%s" % vocab_file,
                    "--max_seq_length=64", "--max_predictions_per_seq=10",
                    "--dupe_factor=1", "--do_whole_word_mask", "--random_seed=3")
  assert result.returncode == 0, result.stderr
  assert "instances from 9 documents" in result.stdout
  assert len(read_records([output])) > 20

  result = _run_cli("--input_file=%s" % SAMPLE_TEXT, "--output_file=%s" % output + "-2",
                    "--vocab_file=%s" % vocab_file, "--max_seq_length=64",
                    "--max_predictions_per_seq=65")
  assert result.returncode == 2
  last_line = result.stderr.strip().splitlines()[-1]
  assert last_line == ("create_pretraining_data: error: max_predictions_per_seq=65 must "
                       "be between 1 and max_seq_length=64")


def test_documents_of_one_sentence_each_give_a_one_line_warning(tmp_path, vocab_file):
  sentences = [line.strip() for line in open(SAMPLE_TEXT, encoding="utf-8") if line.strip()]
  one_each = _write(tmp_path / "one_each.txt", "\n\n".join(sentences[:40]) + "\n")
  output = str(tmp_path / "one_each.tfrecord")
  result = _run_cli("--input_file=%s" % one_each, "--output_file=%s" % output,
                    "--vocab_file=%s" % vocab_file, "--max_seq_length=64",
                    "--max_predictions_per_seq=10", "--dupe_factor=1")
  assert result.returncode == 0, result.stderr
  warnings = [l for l in result.stderr.splitlines() if "warning:" in l]
  assert warnings == [
      "create_pretraining_data: warning: 40 of 40 instances (100%) have a random next "
      "sentence, where documents of several sentences give about half; 40 of the 40 "
      "documents have one sentence, whose B always comes from another document: write one "
      "sentence a line, with a blank line between documents only"]
  assert len(read_records([output])) == 40
  # Documents of several sentences: about half, no warning.
  result = _run_cli("--input_file=%s" % SAMPLE_TEXT,
                    "--output_file=%s" % str(tmp_path / "several.tfrecord"),
                    "--vocab_file=%s" % vocab_file, "--max_seq_length=64",
                    "--max_predictions_per_seq=10", "--dupe_factor=1")
  assert result.returncode == 0, result.stderr
  assert "warning:" not in result.stderr


def test_the_command_keeps_records_already_written_and_names_the_fix(tmp_path, vocab_file):
  kept = str(tmp_path / "part-1")
  cpd.create_pretraining_data([SAMPLE_TEXT], [kept], vocab_file, max_seq_length=64,
                              max_predictions_per_seq=10, dupe_factor=1)
  before = open(kept, "rb").read()
  new = str(tmp_path / "part-0")
  for outputs, message in [
      ("%s,%s" % (new, kept), "--output_file=%s already exists and would be replaced; "
       "delete it to make it again, or pass another path" % kept),
      (str(tmp_path), "--output_file=%s is a folder; pass a file path in it, e.g. %s"
       % (tmp_path, os.path.join(str(tmp_path), "part-0"))),
      (str(tmp_path / "new") + "/", "--output_file=%s/ ends in '/', a folder's name; pass a "
       "file path in it, e.g. %s/part-0" % (tmp_path / "new", tmp_path / "new")),
      # A folder on the way that is a file: said before the work, named (not a temporary).
      (str(tmp_path / "part-1" / "sub" / "part-0"), "--output_file=%s cannot be written: %s "
       "is a file, not a folder; pass another path"
       % (tmp_path / "part-1" / "sub" / "part-0", kept))] + ([
      # A folder that access() calls writable but makes no file in (/proc, for root).
      ("/proc/part-0", "--output_file=/proc/part-0 cannot be written: /proc: no file can "
       "be made there (No such file or directory); pass another path")]
      if os.geteuid() == 0 else []):
    result = _run_cli("--input_file=%s" % SAMPLE_TEXT, "--output_file=%s" % outputs,
                      "--vocab_file=%s" % vocab_file, "--max_seq_length=64",
                      "--max_predictions_per_seq=10", "--dupe_factor=1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "create_pretraining_data: error: " + message)
    assert open(kept, "rb").read() == before
    assert sorted(os.listdir(str(tmp_path))) == ["part-1"]


def test_a_file_that_cannot_be_made_is_named_as_asked_not_as_its_temporary(
    tmp_path, vocab_file):
  with pytest.raises(tf.errors.OpError) as caught:
    cpd.create_pretraining_data([SAMPLE_TEXT], ["/proc/part-0"], vocab_file,
                                max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1)
  assert caught.value.message.startswith("/proc/part-0;"), caught.value.message
  assert not os.path.exists("/proc/part-0")
  # The rename onto a folder fails after the writing: named as asked too.
  folder = tmp_path / "part-1"
  folder.mkdir()
  with pytest.raises(OSError) as renamed:
    cpd.create_pretraining_data([SAMPLE_TEXT], [str(folder)], vocab_file,
                                max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1)
  assert renamed.value.filename == str(folder)
  assert os.listdir(str(tmp_path)) == ["part-1"]


def test_a_full_disk_removes_every_temporary_file_and_names_the_disk_written(
    small_disk, vocab_file):
  # Room for less than a record a file: both files fail, one in write(), one in close().
  stat = os.statvfs(str(small_disk))
  (small_disk / "filler").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 8 * 1024))
  outputs = [str(small_disk / "part-0"), str(small_disk / "part-1")]
  result = _run_cli("--input_file=%s" % SAMPLE_TEXT, "--output_file=%s" % ",".join(outputs),
                    "--vocab_file=%s" % vocab_file, "--max_seq_length=64",
                    "--max_predictions_per_seq=10", "--dupe_factor=2")
  assert result.returncode == 2, result.stderr
  assert re.match(r"^create_pretraining_data: error: the disk is full \(no space left on the "
                  r"device, 0\.\d MB free\) while writing %s/part-[01]; free space there and "
                  r"run the same command again$" % re.escape(str(small_disk)),
                  result.stderr.strip().splitlines()[-1]), result.stderr
  assert sorted(os.listdir(str(small_disk))) == ["filler"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_command_with_one_line_and_no_temporary_file(tmp_path, vocab_file,
                                                                       signum):
  text = _write(tmp_path / "long.txt", open(SAMPLE_TEXT, encoding="utf-8").read() * 30)
  outputs = [str(tmp_path / "out" / "part-0"), str(tmp_path / "out" / "part-1")]
  log = tmp_path / "log.txt"
  for _ in range(3):  # again where it had written its files before the signal (starved)
    process = start_command("bert_pretrain.create_pretraining_data", "--input_file=%s" % text,
                            "--output_file=%s" % ",".join(outputs),
                            "--vocab_file=%s" % vocab_file, "--max_seq_length=64",
                            "--max_predictions_per_seq=10", "--dupe_factor=20",
                            stdout=log, stderr=log)
    # Signalled once it writes: its temporary files are there, for about a second.
    status = signal_when(process, lambda process=process: process.poll() is not None or (
        os.path.isdir(str(tmp_path / "out")) and os.listdir(str(tmp_path / "out"))),
                         signum, log)
    if status != 0 and "its files were written" not in log.read_text():
      break
    assert sorted(os.listdir(str(tmp_path / "out"))) == ["part-0", "part-1"]
    shutil.rmtree(str(tmp_path / "out"))
  output = log.read_text()
  assert "Traceback" not in output, output
  if signum == signal.SIGTERM:
    assert status == 143 and output.endswith(
        "\ncreate_pretraining_data: terminated (SIGTERM); its files were not written: run "
        "the same command again\n"), output
  else:
    assert status == 130 and output.endswith(
        "\ncreate_pretraining_data: interrupted; its files were not written: run the same "
        "command again\n"), output
  assert os.listdir(str(tmp_path / "out")) == []


@pytest.mark.parametrize("when", ["before the second rename", "as the first returns"])
def test_a_signal_between_two_renames_leaves_none_of_the_files(tmp_path, vocab_file,
                                                              monkeypatch, when):
  renames = []

  def replace_then_interrupt(source, destination):
    if renames:
      raise KeyboardInterrupt()
    os.rename(source, destination)
    renames.append(destination)
    if when == "as the first returns":
      raise KeyboardInterrupt()

  monkeypatch.setattr(cpd.os, "replace", replace_then_interrupt)
  with pytest.raises(KeyboardInterrupt):
    make_data(tmp_path, vocab_file, num_files=3, dupe_factor=1)
  assert renames == [str(tmp_path / "part-0.tfrecord")]
  assert os.listdir(str(tmp_path)) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_summary_prints_says_the_files_were_written(tmp_path, vocab_file,
                                                                        signum):
  outputs = [str(tmp_path / "part-0"), str(tmp_path / "part-1")]
  code = ("import os, sys, time\n"
          "from absl import app\n"
          "from bert_pretrain import create_pretraining_data as cpd\n"
          "def signalled(*args):\n"
          "  os.kill(os.getpid(), %d)\n"
          "  time.sleep(60)\n"
          "cpd.print_summary = signalled\n"
          "cpd.define_flags()\n"
          "sys.argv = sys.argv[:1] + sys.argv[2:]\n"
          "app.run(cpd.main)\n" % signum)
  result = subprocess.run(
      [sys.executable, "-c", code, "--", "--input_file=%s" % SAMPLE_TEXT,
       "--output_file=%s" % ",".join(outputs), "--vocab_file=%s" % vocab_file,
       "--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=1"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
  assert "Traceback" not in result.stderr, result.stderr
  said = result.stderr.strip().splitlines()[-1]
  if signum == signal.SIGTERM:
    assert (result.returncode, said) == (143, "create_pretraining_data: terminated "
                                              "(SIGTERM); its files were written, only the "
                                              "summary was cut short")
  else:
    assert (result.returncode, said) == (130, "create_pretraining_data: interrupted; its files "
                                            "were written, only the summary was cut short")
  assert sorted(os.listdir(str(tmp_path))) == ["part-0", "part-1"]
  assert len(read_records(outputs)) > 20


def test_the_temporary_files_of_a_killed_run_are_removed_by_the_next(tmp_path, vocab_file):
  output = tmp_path / "part-0"
  dead = subprocess.Popen(["true"])
  dead.wait()  # a pid no process has now
  (tmp_path / ("part-0.tmp-%d" % dead.pid)).write_bytes(b"\0" * 100)
  running = tmp_path / ("part-0.tmp-%d" % os.getpid())  # another run's, still writing
  running.write_bytes(b"\0" * 100)
  result = _run_cli("--input_file=%s" % SAMPLE_TEXT, "--output_file=%s" % output,
                    "--vocab_file=%s" % vocab_file, "--max_seq_length=64",
                    "--max_predictions_per_seq=10", "--dupe_factor=1")
  assert result.returncode == 0, result.stderr
  assert sorted(os.listdir(str(tmp_path))) == ["part-0", running.name]


def test_a_vocab_that_leaves_most_of_the_text_unknown_gives_a_one_line_warning(tmp_path,
                                                                              vocab_file):
  tiny = _write(tmp_path / "tiny_vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
  result = _run_cli("--input_file=%s" % SAMPLE_TEXT, "--output_file=%s" % (tmp_path / "o"),
                    "--vocab_file=%s" % tiny, "--max_seq_length=64",
                    "--max_predictions_per_seq=10", "--dupe_factor=1")
  assert result.returncode == 0, result.stderr
  [warning] = [l for l in result.stderr.splitlines() if "warning:" in l]
  unknown, total = [int(n) for n in re.match(
      r"^create_pretraining_data: warning: (\d+) of the (\d+) tokens of the text \(\d+%\) are "
      r"\[UNK\]: the vocab does not fit the text; pass --vocab_file=<the model's "
      r"vocab.txt>$", warning).groups()]
  assert 0.9 * total < unknown < total
  # The text's own vocab: no warning.
  result = _run_cli("--input_file=%s" % SAMPLE_TEXT, "--output_file=%s" % (tmp_path / "o2"),
                    "--vocab_file=%s" % vocab_file, "--max_seq_length=64",
                    "--max_predictions_per_seq=10", "--dupe_factor=1")
  assert result.returncode == 0 and "warning:" not in result.stderr, result.stderr


@pytest.mark.parametrize("casing", ["cased text, uncased vocab", "uncased text, cased vocab"])
def test_the_unknown_tokens_warning_names_the_casing_that_does_not_fit_the_vocab(
    tmp_path, vocab_file, casing):
  text = SAMPLE_TEXT
  if casing == "cased text, uncased vocab":
    text = _write(tmp_path / "shouted.txt", open(SAMPLE_TEXT, encoding="utf-8").read().upper())
    vocab, flags, fix = vocab_file, ["--nodo_lower_case"], (
        "the vocab is uncased (no upper-case token): pass --do_lower_case=true (the "
        "default), or --vocab_file=<a cased vocab.txt>")
  else:
    vocab = _write(tmp_path / "cased_vocab.txt", "".join(
        (token if token.startswith("[") else token.capitalize()) + "\n"
        for token in open(vocab_file, encoding="utf-8").read().split("\n") if token))
    flags, fix = [], ("the vocab is cased: pass --do_lower_case=false, or "
                      "--vocab_file=<an uncased vocab.txt>")
  result = _run_cli("--input_file=%s" % text, "--output_file=%s" % (tmp_path / "o"),
                    "--vocab_file=%s" % vocab, "--max_seq_length=64",
                    "--max_predictions_per_seq=10", "--dupe_factor=1", *flags)
  assert result.returncode == 0, result.stderr
  [warning] = [l for l in result.stderr.splitlines() if "warning:" in l and "[UNK]" in l]
  assert warning.endswith("the vocab does not fit the text; " + fix), warning
