"""Tests of bert_pretrain/inspect_records.py (tools/inspect_tfrecords.py) on records made from tests/data/wiki_sample.xml."""

import io
import json
import os
import random
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bert_pretrain import inspect_records as inspect_tfrecords
from bert_pretrain.data import records
from bert_pretrain.data import tokenization
from bert_pretrain.wiki import pipeline

SAMPLE = os.path.join(ROOT, "tests", "data", "wiki_sample.xml")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """A small prepared dataset (4 train shards, eval set) and its vocab."""
  root = tmp_path_factory.mktemp("inspect")
  vocab = str(root / "vocab.txt")
  tokenization.build_wordpiece_vocab([SAMPLE], 1500, vocab)
  output_dir = str(root / "out")
  pipeline.run_pipeline(output_dir, dump=SAMPLE, vocab=vocab, num_shards=4,
                        num_eval_articles=4, num_eval_samples=20, max_seq_length=64,
                        max_predictions_per_seq=10, dupe_factor=2, pages_per_chunk=10)
  train_dir = os.path.join(output_dir, "train_data")
  files = sorted(os.path.join(train_dir, n) for n in os.listdir(train_dir))
  return {"root": root, "vocab": vocab, "train_dir": train_dir, "files": files,
          "output_dir": output_dir}


def run_cli(*flags):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "inspect_tfrecords.py")]
                        + list(flags), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        universal_newlines=True, env=env, timeout=120)


def inspect(*args, **kwargs):
  """run_inspect in this process; returns (status, report text, error text)."""
  out, err = io.StringIO(), io.StringIO()
  status = inspect_tfrecords.run_inspect(*args, out=out, err=err, **kwargs)
  return status, out.getvalue(), err.getvalue()


def corrupt_copy(source, target, indices):
  """Copies a TFRecord file and flips a payload byte of the records at `indices`."""
  offsets, _ = records.record_offsets(source)
  data = bytearray(open(source, "rb").read())
  for index in indices:
    offset, _ = offsets[index]
    data[offset + 12 + 40] ^= 0xFF
  with open(target, "wb") as f:
    f.write(data)
  return [offsets[i][0] for i in indices]


def test_report_of_good_records(data):
  report = inspect_tfrecords.inspect_files(data["files"], data["vocab"], num_examples=3,
                                           stats_records=0)
  manifest = json.load(open(os.path.join(data["output_dir"], "manifest.json")))
  assert report["records"] == manifest["counts"]["train"]["instances"]
  assert report["parsed"] == report["records"]
  assert not report["corrupt"] and not report["spec_errors"]
  assert (report["max_seq_length"], report["max_predictions_per_seq"]) == (64, 10)
  stats = report["statistics"]
  assert stats["predictions"] == manifest["counts"]["train"]["masked_tokens"]
  assert 0.13 <= stats["masked_fraction"] <= 0.16
  assert abs(stats["mask_fraction"] - 0.8) < 0.05
  assert abs(stats["kept_fraction"] - 0.1) < 0.04
  assert abs(stats["random_fraction"] - 0.1) < 0.04
  assert abs(stats["mask_fraction"] + stats["kept_fraction"] + stats["random_fraction"]
             - 1) < 1e-9
  assert 0.4 <= stats["random_next_fraction"] <= 0.8
  assert len(report["examples"]) == 3


def test_decoded_example_shows_masks_and_true_tokens(data):
  report = inspect_tfrecords.inspect_files(data["files"][:1], data["vocab"],
                                           num_examples=1, stats_records=5)
  example = report["examples"][0]
  values = example["values"]
  text = example["text"]
  assert text.startswith("[CLS] ") and text.endswith(" [SEP]")
  assert text.count("[SEP]") == 2
  inv_vocab = {v: k for k, v in tokenization.load_vocab(data["vocab"]).items()}
  words = text.split(" ")
  weights = values["masked_lm_weights"]
  for position, label in zip(values["masked_lm_positions"][weights > 0],
                             values["masked_lm_ids"][weights > 0]):
    word = words[position]
    assert word.endswith("{%s}" % inv_vocab[label]) or word.endswith(
        "{=%s}" % inv_vocab[label]) or word.endswith("{~%s}" % inv_vocab[label])
  assert "[MASK]{" in " ".join(
      e["text"] for e in inspect_tfrecords.inspect_files(
          data["files"], data["vocab"], num_examples=20, stats_records=20)["examples"])


def test_cli_prints_the_report(data):
  result = run_cli("--input=%s" % data["train_dir"], "--vocab=%s" % data["vocab"],
                   "--num_examples=1")
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert out.startswith("4 files, ")
  assert "corrupt records: none" in out
  assert "feature spec: ok" in out and "max_seq_length 64" in out
  assert "predicted tokens: [MASK] " in out and "next sentence: " in out
  assert "example: " in out and "[CLS]" in out


def test_corrupt_records_reported_with_file_and_offset(data, tmp_path):
  bad = str(tmp_path / "bad.tfrecord")
  offsets = corrupt_copy(data["files"][0], bad, [2, 7])
  report = inspect_tfrecords.inspect_files([bad], num_examples=0)
  assert [(c["index"], c["offset"]) for c in report["corrupt"]] == [(2, offsets[0]),
                                                                  (7, offsets[1])]
  assert all(c["path"] == bad for c in report["corrupt"])
  # The other records are still read, and [MASK]'s id is inferred without a vocab.
  assert report["parsed"] == report["records"] - 2
  assert report["mask_id"] == 4 and report["mask_id_inferred"]
  status, out, _ = inspect(bad)
  assert status == 1
  assert "record 2 at byte %d" % offsets[0] in out
  assert "record 7 at byte %d" % offsets[1] in out


def test_file_cut_short_is_reported(data, tmp_path):
  cut = str(tmp_path / "cut.tfrecord")
  offsets, _ = records.record_offsets(data["files"][1])
  with open(data["files"][1], "rb") as f:
    data_bytes = f.read()
  with open(cut, "wb") as f:
    f.write(data_bytes[:offsets[5][0] + 30])
  report = inspect_tfrecords.inspect_files([cut], num_examples=0)
  assert report["records"] == 5
  assert len(report["corrupt"]) == 1
  assert report["corrupt"][0]["index"] == 5
  assert "cut short" in report["corrupt"][0]["message"]
  assert "byte %d" % offsets[5][0] in report["corrupt"][0]["message"]


def test_a_file_without_a_readable_record_is_not_called_ok(tmp_path):
  noise = tmp_path / "part-0"
  rng = random.Random(5)
  noise.write_bytes(bytes(rng.getrandbits(8) for _ in range(5000)))
  status, out, _ = inspect(str(noise))
  assert status == 1
  assert "feature spec: not checked (no record could be read)" in out.splitlines(), out
  assert not re.search(r"^feature spec: ok", out, re.M), out


def test_other_lengths_break_the_spec(data):
  status, out, _ = inspect(data["files"][0], max_seq_length=128, num_examples=0)
  assert status == 1
  assert "SPEC: " in out
  assert "input_ids has 64 values, not max_seq_length 128" in out


def test_bad_input_is_one_line(data, tmp_path):
  status, out, err = inspect(str(tmp_path / "missing"))
  assert (status, out) == (2, "")
  assert err.startswith("inspect_tfrecords: error: ") and err.count("\n") == 1
  assert "does not exist" in err
  status, _, err = inspect(data["train_dir"], vocab=str(tmp_path / "v.txt"))
  assert status == 2 and "vocab file" in err and "does not exist" in err
  empty = tmp_path / "empty"
  empty.mkdir()
  shutil.copy(os.path.join(data["output_dir"], "manifest.json"), str(empty))
  status, _, err = inspect(str(empty))
  assert status == 2 and "holds no TFRecord files" in err
  # The dataset's root: its folders are named.
  status, _, err = inspect(data["output_dir"])
  assert status == 2 and ("inspect_tfrecords: error: --input=%s holds no TFRecord files, only "
                          "folders (" % data["output_dir"]) in err
  assert "train_data" in err and "eval_data" in err, err
  result = run_cli("--input=" + data["train_dir"], "--stats_records=-5")
  assert result.returncode != 0 and not result.stdout
  assert "flag --stats_records=-5: -5 is not a non-negative integer" in result.stderr


def test_an_empty_input_or_a_vocab_folder_is_one_line_naming_what_to_pass(data, tmp_path):
  for given in ("--input=", "--input= , "):
    result = run_cli(given, "--vocab=" + data["vocab"])
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("inspect_tfrecords: error: --input is empty; pass "
                             "--input=<records folder, glob or file>\n")
  status, out, err = inspect(data["train_dir"], vocab=str(data["root"]))
  assert (status, out) == (2, "")
  assert err == ("inspect_tfrecords: error: --vocab=%s is a folder; pass the vocab file (the "
                 "vocab.txt the records were made with), or leave --vocab out\n" % data["root"])
  # A text file given as the vocab: the records are not blamed, record by record.
  text = tmp_path / "notes.txt"
  text.write_text("some words\nof a text\n")
  status, out, err = inspect(data["train_dir"], vocab=str(text))
  assert (status, out) == (2, "")
  assert err == ("inspect_tfrecords: error: vocab file %s lacks [UNK] [CLS] [SEP] [MASK]; "
                 "pass the vocab.txt the records were made with, or leave --vocab out\n" % text)


def test_packed_records_are_recognised_and_a_broken_pack_breaks_the_spec(data, tmp_path):
  from bert_pretrain import pack_records  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  packed_dir = str(tmp_path / "packed")
  pack_records.pack(data["files"], packed_dir)
  packed_files = sorted(os.path.join(packed_dir, n) for n in os.listdir(packed_dir)
                        if n.startswith("part-"))
  report = inspect_tfrecords.inspect_files(packed_files, data["vocab"], num_examples=1,
                                           stats_records=0)
  plain = inspect_tfrecords.inspect_files(data["files"], data["vocab"], num_examples=0,
                                          stats_records=0)
  assert report["packed"] and not report["spec_errors"]
  assert report["statistics"]["sequences"] == plain["records"]
  assert report["statistics"]["predictions"] == plain["statistics"]["predictions"]
  # A pack whose positions do not restart, and an unpacked record among packed ones.
  broken = str(tmp_path / "broken")
  serialized = list(tf.io.tf_record_iterator(packed_files[0]))
  values = records.parse_example(serialized[0], packed=True)
  values["positions"][0] = 1
  with tf.io.TFRecordWriter(broken) as writer:
    writer.write(serialized[1])
    writer.write(records.serialize_example(values))
    writer.write(open(data["files"][0], "rb").read()[12:12 + records.record_offsets(
        data["files"][0])[0][0][1]])
  status, out, _ = inspect(broken, num_examples=0)
  assert status == 1
  assert "SPEC: 2 records break the feature spec" in out
  assert "%s record 1 at byte %d: positions do not restart at 0 at each sequence" % (
      broken, 16 + len(serialized[1])) in out
  assert "record 2 at byte" in out and "an unpacked record among packed ones" in out
