"""Tests of bert_pretrain/pack_records.py: histogram packing, dealing the sequences, and the
packer on the demo's records (bert_pretrain/demo_data) and on records of a real Wikipedia
sample (tests/data/wiki_sample.xml through the wiki pipeline with --pack).

The central check: unpacking every written pack gives back, byte for byte, the multiset
of input records (tokens, segment ids, masked positions, ids and weights, next-sentence
label), so every sequence is packed exactly once."""

import collections
import io
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import demo
from bert_pretrain import errors
from bert_pretrain.data import input_pipeline
from bert_pretrain.data import packing
from bert_pretrain import inspect_records
from bert_pretrain import pack_records
from bert_pretrain import processes
from bert_pretrain.data import records
from bert_pretrain.data import tokenization
from bert_pretrain.wiki import pipeline
from bert_pretrain.wiki import workdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIKI_SAMPLE = os.path.join(ROOT, "tests", "data", "wiki_sample.xml")


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
  """The demo's artefacts (4 training files at 128 tokens) and its packed records."""
  cache = str(tmp_path_factory.mktemp("demo"))
  paths = demo.prepare(cache, log=lambda line: None)
  packed = demo.prepare(cache, log=lambda line: None, packed=True)["input_files_dir"]
  return dict(paths, cache=cache, packed=packed)


@pytest.fixture(scope="module")
def wiki_data(tmp_path_factory):
  """The wiki pipeline's records of tests/data/wiki_sample.xml at 128 tokens, with --pack."""
  root = tmp_path_factory.mktemp("wiki")
  vocab = str(root / "vocab.txt")
  tokenization.build_wordpiece_vocab([WIKI_SAMPLE], 1500, vocab)
  output_dir = str(root / "out")
  pipeline.run_pipeline(output_dir, dump=WIKI_SAMPLE, vocab=vocab, pack=True, num_shards=4,
                        num_eval_articles=4, num_eval_samples=10, max_seq_length=128,
                        max_predictions_per_seq=20, dupe_factor=2, pages_per_chunk=10)
  return {"root": output_dir, "vocab": vocab,
          "train": os.path.join(output_dir, "train_data"),
          "packed": os.path.join(output_dir, "packed_train_data")}


def record_files(folder):
  return input_pipeline.list_record_files(folder)


def serialized_records(folder):
  return [record for path in record_files(folder) for record in tf.io.tf_record_iterator(path)]


def unpacked_from_packs(folder, max_predictions_per_seq):
  """Every sequence of the packs in `folder`, serialized as an unpacked record, after
  checking each pack against the packed format; and the packs' parsed values."""
  unpacked, packs = [], []
  for serialized in serialized_records(folder):
    layout = records.record_layout(serialized)
    assert layout.packed
    values = records.parse_example(serialized, packed=True)
    assert records.packed_example_problem(values, layout.max_seq_length,
                                          layout.max_predictions,
                                          layout.max_sequences) is None
    packs.append(values)
    unpacked.extend(records.serialize_example(sequence) for sequence in
                    records.unpack_example(values, max_predictions_per_seq))
  return unpacked, packs


def output_bytes(folder):
  return {name: open(os.path.join(folder, name), "rb").read()
          for name in sorted(os.listdir(folder)) if name.startswith("part-")}


def run(*args, **kwargs):
  """pack_records.run_pack in this process: (status, stdout, stderr)."""
  out, err = io.StringIO(), io.StringIO()
  status = pack_records.run_pack(*args, out=out, err=err, **kwargs)
  return status, out.getvalue(), err.getvalue()


def error_line(status, out, err):
  assert status == 2 and out == "", err
  assert err.startswith("pack_records: error: ") and err.count("\n") == 1, err
  return err


# ---------------------------------------------------------------------------------------
# Histogram packing and dealing.
# ---------------------------------------------------------------------------------------


def mlperf_like_predictions(max_seq_length, max_predictions_per_seq):
  lengths = np.arange(max_seq_length + 1)
  return np.minimum(max_predictions_per_seq, np.maximum(1, np.round(lengths * 0.15))).astype(
      np.int64)


@pytest.mark.parametrize("shortest_first", [True, False])
def test_histogram_packing_puts_every_sequence_in_one_pack_within_the_limits(
    shortest_first):
  rng = np.random.RandomState(3)
  histogram = np.zeros(129, np.int64)
  histogram[5:] = rng.randint(0, 40, 124)
  histogram[128] = 500
  predictions = mlperf_like_predictions(128, 20)
  strategies = packing.histogram_packing(histogram, predictions, 23, 3,
                                              shortest_first)
  used = np.zeros_like(histogram)
  for lengths, count in strategies:
    assert 1 <= len(lengths) <= 3 and sum(lengths) <= 128 and count > 0
    assert sum(predictions[length] for length in lengths) <= 23
    for length in lengths:
      used[length] += count
  np.testing.assert_array_equal(used, histogram)
  packs = sum(count for _, count in strategies)
  tokens = np.dot(np.arange(129), histogram)
  # Almost every pack is full: at most a few per length are not.
  assert packs < tokens / 128.0 * 1.02 + 128


def test_shortest_pack_first_and_best_fit_choose_the_room_as_the_paper_says():
  # Lengths 7, 5 and 3, two sequences each, in packs of 10 tokens: the 3s go into the
  # packs with the most room (the 5s) under SPFHP, into the fullest that fits (the 7s)
  # under best fit.
  histogram = np.zeros(11, np.int64)
  histogram[[3, 5, 7]] = 2
  predictions = np.ones(11, np.int64)
  assert packing.histogram_packing(histogram, predictions, 10, 3, True) == [
      ((5, 3), 2), ((7,), 2)]
  assert packing.histogram_packing(histogram, predictions, 10, 3, False) == [
      ((5,), 2), ((7, 3), 2)]
  # One sequence a pack at most: nothing is shared.
  assert packing.histogram_packing(histogram, predictions, 10, 1, True) == [
      ((3,), 2), ((5,), 2), ((7,), 2)]


def test_sequences_of_one_length_share_packs_within_the_prediction_limit():
  histogram = np.zeros(11, np.int64)
  histogram[5] = 3
  predictions = np.zeros(11, np.int64)
  predictions[5] = 3
  # SPFHP opens a pack for each sequence of the longest length; filling new packs pairs
  # them, as far as the predictions allow.
  assert packing.histogram_packing(histogram, predictions, 6, 3) == [((5,), 3)]
  assert packing.histogram_packing(histogram, predictions, 6, 3, fill_new=True) == [
      ((5,), 1), ((5, 5), 1)]
  assert packing.plan_strategies(histogram, predictions, 6, 3) == (
      [((5,), 1), ((5, 5), 1)], "SPFHP, new packs filled")
  assert packing.plan_strategies(histogram, predictions, 5, 3) == (
      [((5,), 3)], "SPFHP")


def test_dealing_gives_each_slot_one_sequence_of_its_length_and_depends_on_the_seed():
  rng = np.random.RandomState(0)
  lengths = rng.randint(3, 65, 5000).astype(np.uint16)
  histogram = np.bincount(lengths, minlength=65)
  strategies, _ = packing.plan_strategies(histogram, mlperf_like_predictions(64, 10),
                                               13, 3)
  chunks = [lengths[i:i + 700] for i in range(0, len(lengths), 700)]
  members, _ = packing.deal_sequences(chunks, strategies, histogram, 7)
  np.testing.assert_array_equal(np.sort(members), np.arange(len(lengths)))
  slot_lengths = np.concatenate([np.tile(lengths_of, count)
                                 for lengths_of, count in strategies])
  np.testing.assert_array_equal(lengths[members], slot_lengths)
  again, _ = packing.deal_sequences(chunks, strategies, histogram, 7)
  other, _ = packing.deal_sequences(chunks, strategies, histogram, 8)
  np.testing.assert_array_equal(again, members)
  assert np.mean(other != members) > 0.5


# ---------------------------------------------------------------------------------------
# The packer on the demo's and on Wikipedia records.
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("data_name", ["demo_data", "wiki_data"])
def test_every_sequence_is_packed_exactly_once(request, data_name):
  data = request.getfixturevalue(data_name)
  train = data["input_files_dir"] if data_name == "demo_data" else data["train"]
  packed_dir = data["packed"]
  inputs = serialized_records(train)
  max_predictions_per_seq = records.record_layout(inputs[0]).max_predictions
  unpacked, packs = unpacked_from_packs(packed_dir, max_predictions_per_seq)
  # The same records, byte for byte, each as often as in the input.
  assert collections.Counter(unpacked) == collections.Counter(inputs)
  summary = pack_records.read_json(os.path.join(packed_dir, "pack_records.json"))["summary"]
  assert summary["sequences_in"] == summary["sequences_out"] == len(inputs)
  assert summary["packs"] == len(packs)
  assert summary["sequences_per_pack"] > 1.05
  assert summary["padding_after"] < summary["padding_before"] / 2
  assert 2 <= max(len(np.flatnonzero(p["next_sentence_weights"])) for p in packs) <= 3


@pytest.mark.parametrize("data_name", ["demo_data", "wiki_data"])
def test_the_packs_are_in_random_order(request, data_name):
  """The input index of each pack's first sequence does not follow the pack's place."""
  data = request.getfixturevalue(data_name)
  train = data["input_files_dir"] if data_name == "demo_data" else data["train"]
  index = {record: i for i, record in enumerate(serialized_records(train))}
  max_predictions_per_seq = records.record_layout(next(iter(index))).max_predictions
  first = []
  for serialized in serialized_records(data["packed"]):
    values = records.parse_example(serialized, packed=True)
    sequence = records.unpack_example(values, max_predictions_per_seq)[0]
    first.append(index[records.serialize_example(sequence)])
  correlation = np.corrcoef(np.arange(len(first)), first)[0, 1]
  assert abs(correlation) < 0.2
  # Nor are packs of one kind together: the number of sequences changes often.
  sizes = [len(records.unpack_example(records.parse_example(s, packed=True),
                                      max_predictions_per_seq))
           for s in serialized_records(data["packed"])]
  assert sum(a != b for a, b in zip(sizes, sizes[1:])) > 0.05 * len(sizes)


def test_same_seed_gives_the_same_bytes_whatever_jobs_and_another_seed_another_order(
    demo_data, tmp_path):
  status, out, _ = run(demo_data["input_files_dir"], str(tmp_path / "two_jobs"), jobs=2)
  assert status == 0, out
  assert output_bytes(str(tmp_path / "two_jobs")) == output_bytes(demo_data["packed"])
  status, _, _ = run(demo_data["input_files_dir"], str(tmp_path / "seed"), seed=1)
  assert status == 0
  other = output_bytes(str(tmp_path / "seed"))
  assert other != output_bytes(demo_data["packed"])
  unpacked, _ = unpacked_from_packs(str(tmp_path / "seed"), 20)
  assert collections.Counter(unpacked) == collections.Counter(
      serialized_records(demo_data["input_files_dir"]))


def test_the_summary_line_and_a_rerun_that_finds_the_work_done(demo_data, tmp_path):
  output_dir = str(tmp_path / "out")
  status, out, _ = run(demo_data["input_files_dir"], output_dir, num_output_files=3)
  assert status == 0
  inputs = serialized_records(demo_data["input_files_dir"])
  tokens = sum(int(records.parse_example(r)["input_mask"].sum()) for r in inputs)
  packs = len(serialized_records(output_dir))
  assert out == ("pack_records: %d sequences in, %d out, in %d packs (%.3f sequences a "
                 "pack); padding %.1f%% of the tokens before, %.1f%% after; 3 files in %s, "
                 % (len(inputs), len(inputs), packs, len(inputs) / float(packs),
                    100 - 100.0 * tokens / (len(inputs) * 128),
                    100 - 100.0 * tokens / (packs * 128), output_dir)) + out.split(", ")[-1]
  assert out.split(", ")[-1].endswith(" s\n")
  # The big arrays of work/ are gone; the markers are kept.
  assert sorted(os.listdir(os.path.join(output_dir, "work"))) == ["done"]
  before = {name: os.stat(os.path.join(output_dir, name)).st_mtime_ns
            for name in output_bytes(output_dir)}
  status, again, _ = run(demo_data["input_files_dir"], output_dir, num_output_files=3)
  assert status == 0 and again.rstrip().endswith("(done before)")
  assert {name: os.stat(os.path.join(output_dir, name)).st_mtime_ns
          for name in before} == before


def interrupt_on_call(monkeypatch, name, call, interrupt=KeyboardInterrupt):
  """Makes pack_records.<name> raise `interrupt` (Ctrl-C's KeyboardInterrupt, or SIGTERM's
  errors.Terminated) on its call-th call."""
  real = getattr(pack_records, name)
  calls = [0]

  def interrupted(task):
    calls[0] += 1
    if calls[0] == call:
      raise interrupt()
    return real(task)

  monkeypatch.setattr(pack_records, name, interrupted)


@pytest.mark.parametrize("step,interrupt", [("lengths_task", KeyboardInterrupt),
                                            ("write_task", KeyboardInterrupt),
                                            ("write_task", errors.Terminated)])
def test_an_interrupted_run_resumes_where_it_stopped(demo_data, tmp_path, monkeypatch,
                                                     capsys, step, interrupt):
  output_dir = str(tmp_path / "out")
  inputs = demo_data["input_files_dir"]
  with monkeypatch.context() as patch:
    interrupt_on_call(patch, step, 2, interrupt)
    status, out, err = run(inputs, output_dir)
  assert out == ""
  if interrupt is errors.Terminated:
    assert status == 143 and err == ("pack_records: terminated (SIGTERM); run the same "
                                     "command again to go on where it stopped\n")
  else:
    assert status == 130 and err == ("pack_records: interrupted; run the same command again "
                                   "to go on where it stopped\n")
  assert not [n for n in os.listdir(output_dir) if ".tmp" in n]
  written = sorted(output_bytes(output_dir))
  assert written == (["part-00000-of-00004"] if step == "write_task" else [])
  capsys.readouterr()
  status, out, _ = run(inputs, output_dir)
  assert status == 0
  progress = capsys.readouterr().err
  if step == "lengths_task":
    assert "lengths: 3 files read (1 done before)" in progress
  else:
    assert "lengths:" not in progress and "plan:" not in progress
    assert "write: 3 files written (1 done before)" in progress
  assert output_bytes(output_dir) == output_bytes(demo_data["packed"])


def test_a_worker_that_died_is_exit_status_1_not_bad_input(tmp_path, monkeypatch):
  def pack(*unused_args):
    raise processes.WorkerDied()
  monkeypatch.setattr(pack_records, "pack", pack)
  status, out, err = run(str(tmp_path / "in"), str(tmp_path / "out"), jobs=2)
  assert (status, out) == (1, "")
  assert err == "pack_records: error: %s\n" % processes.WorkerDied()


def test_a_lost_output_file_is_made_again_the_same(demo_data, tmp_path):
  output_dir = str(tmp_path / "out")
  shutil.copytree(demo_data["packed"], output_dir)
  os.remove(os.path.join(output_dir, "part-00002-of-00004"))
  # The copy's settings name the same input files: it resumes.
  status, out, _ = run(demo_data["input_files_dir"], output_dir)
  assert status == 0 and "(done before)" not in out
  assert output_bytes(output_dir) == output_bytes(demo_data["packed"])


def test_the_plan_holds_ten_bytes_a_sequence(demo_data, tmp_path, monkeypatch):
  """What the module docstring states: uint32 slots, pack order and offsets."""
  output_dir = str(tmp_path / "out")
  interrupt_on_call(monkeypatch, "write_task", 1)
  status, _, _ = run(demo_data["input_files_dir"], output_dir)
  assert status == 130
  plan = os.path.join(output_dir, "work", "plan")
  arrays = {name: np.load(os.path.join(plan, name)) for name in sorted(os.listdir(plan))}
  sequences = len(serialized_records(demo_data["input_files_dir"]))
  packs = len(arrays["order.npy"])
  assert {name: (array.dtype, len(array)) for name, array in arrays.items()} == {
      "members.npy": (np.uint32, sequences), "offsets.npy": (np.uint32, sequences),
      "order.npy": (np.uint32, packs)}
  np.testing.assert_array_equal(np.sort(arrays["order.npy"]), np.arange(packs))


def test_the_demo_makes_packed_records_beside_the_unpacked_ones(demo_data):
  assert demo_data["packed"] == os.path.join(demo_data["cache"], "train_packed")
  assert len(record_files(demo_data["packed"])) == len(record_files(
      demo_data["input_files_dir"]))
  lines = []
  assert demo.prepare(demo_data["cache"], log=lines.append,
                      packed=True)["input_files_dir"] == demo_data["packed"]
  assert lines == []  # done before: nothing is packed again


def test_the_wiki_manifest_lists_the_packs(wiki_data):
  manifest = pack_records.read_json(os.path.join(wiki_data["root"], "manifest.json"))
  listed = sorted(p for p in manifest["files"] if p.startswith("packed_train_data/"))
  assert listed == ["packed_train_data/part-%05d-of-00004" % i for i in range(4)]
  for path in listed:
    digest = workdir.file_digest(os.path.join(wiki_data["root"], path))
    assert manifest["files"][path] == digest
  assert manifest["packed"]["sequences_in"] == manifest["counts"]["train"]["instances"]


# ---------------------------------------------------------------------------------------
# Bad input: one line, exit 2, nothing written.
# ---------------------------------------------------------------------------------------


def test_a_missing_input(tmp_path):
  err = error_line(*run(str(tmp_path / "missing"), str(tmp_path / "out")))
  assert "--input=%s does not exist" % (tmp_path / "missing") in err
  assert not (tmp_path / "out").exists()


def test_files_of_mixed_sequence_lengths(demo_data, pretraining_data, tmp_path):
  inputs = "%s,%s" % (record_files(demo_data["input_files_dir"])[0],
                      record_files(pretraining_data["train"])[0])
  err = error_line(*run(inputs, str(tmp_path / "out")))
  assert "has max_seq_length 64 and max_predictions_per_seq 10" in err
  assert "has 128 and 20; pack the files of each sequence length separately" in err
  assert not (tmp_path / "out").exists()


def test_records_that_are_not_mlperf_pretraining_records(tmp_path):
  path = str(tmp_path / "classifier.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    example = tf.train.Example(features=tf.train.Features(feature={
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1]))}))
    writer.write(example.SerializeToString())
  err = error_line(*run(path, str(tmp_path / "out")))
  assert ("is not MLPerf pretraining records: its first record lacks the feature "
          "input_ids; pass the TFRecords of create_pretraining_data") in err
  text = tmp_path / "notes.bin"
  text.write_text("just some text, not a TFRecord file\n")
  err = error_line(*run(str(text), str(tmp_path / "out")))
  assert "is not a TFRecord file" in err


@pytest.mark.parametrize("damage", ["flipped byte", "cut short"])
def test_a_corrupt_input_file_is_named_with_its_record(pretraining_data, tmp_path, damage):
  source = record_files(pretraining_data["train"])[0]
  offsets, _ = records.record_offsets(source)
  content = bytearray(open(source, "rb").read())
  if damage == "flipped byte":
    content[offsets[5][0] + records.HEADER_BYTES + 30] ^= 0xFF
    expected = "record 5 at byte %d: the CRC does not match the data" % offsets[5][0]
  else:
    content = content[:offsets[5][0] + 20]
    expected = "cut short or corrupt: record 5 at byte %d" % offsets[5][0]
  bad = tmp_path / "part-0"
  bad.write_bytes(bytes(content))
  err = error_line(*run(str(bad), str(tmp_path / "out")))
  assert "%s is corrupt: %s" % (bad, expected) in err


def test_packed_records_as_input(demo_data, tmp_path):
  err = error_line(*run(demo_data["packed"], str(tmp_path / "out")))
  assert "holds packed records already; pass the unpacked records" in err


def test_a_bad_record_inside_a_file_is_named_and_binds_nothing(pretraining_data, tmp_path):
  good = record_files(pretraining_data["train"])
  source = list(tf.io.tf_record_iterator(good[0]))
  values = records.parse_example(source[0])
  values["input_mask"][2] = 0
  bad = tmp_path / "in" / "part-0"
  bad.parent.mkdir()
  with tf.io.TFRecordWriter(str(bad)) as writer:
    writer.write(source[1])
    writer.write(records.serialize_example(values))
  output_dir = str(tmp_path / "out")
  err = error_line(*run(str(bad), output_dir))
  assert ("%s record 1 (byte %d): input_mask is not a run of ones followed by zeros"
          % (bad, 16 + len(source[1]))) in err
  assert not os.path.exists(os.path.join(output_dir, "pack_records.json"))
  # The corrected command (other input files) runs on the same folder.
  status, out, err = run(good[0], output_dir)
  assert status == 0, err


def test_an_output_folder_of_another_command_or_of_other_files(demo_data, tmp_path,
                                                               monkeypatch):
  output_dir = str(tmp_path / "out")
  with monkeypatch.context() as patch:
    interrupt_on_call(patch, "write_task", 2)
    assert run(demo_data["input_files_dir"], output_dir, seed=1)[0] == 130
  before = output_bytes(output_dir)
  err = error_line(*run(demo_data["input_files_dir"], output_dir, seed=2))
  assert ("holds packs made by another command (seed=1 there, 2 now); pass the same flags "
          "to resume it, or a new --output_dir") in err
  err = error_line(*run(record_files(demo_data["input_files_dir"])[0], output_dir, seed=1))
  assert "other input files (4 there, 1 now)" in err
  assert output_bytes(output_dir) == before
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("someone else's file")
  err = error_line(*run(demo_data["input_files_dir"], str(other)))
  assert "is not empty and holds no pack_records.json (it has notes.txt)" in err
  assert os.listdir(str(other)) == ["notes.txt"]  # the refused run left no lock file


def test_a_second_run_on_the_same_folder_and_bad_flags(demo_data, tmp_path):
  output_dir = tmp_path / "out"
  output_dir.mkdir()
  with workdir.locked(pack_records.PackLayout(str(output_dir)), "pack_records"):
    err = error_line(*run(demo_data["input_files_dir"], str(output_dir)))
  assert "another pack_records run is using" in err
  err = error_line(*run(demo_data["input_files_dir"], str(tmp_path / "o"),
                        max_sequences_per_pack=0))
  assert "--max_sequences_per_pack=0 must be >= 1" in err
  err = error_line(*run(demo_data["input_files_dir"], str(tmp_path / "o"), seed=-1))
  assert err.strip().endswith("--seed=-1 must be from 0 to 4294967295")
  assert not (tmp_path / "o").exists()
  err = error_line(*run(demo_data["input_files_dir"], demo_data["cache"]))
  assert "is inside --output_dir" in err


def test_the_command_line(demo_data, tmp_path):
  # A process of its own: pack_records imports TensorFlow inside its functions, so a forked
  # run would not save the import.
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  command = [sys.executable, "-m", "bert_pretrain.pack_records",
             "--input=%s" % demo_data["input_files_dir"], "--jobs=1"]
  result = subprocess.run(command + ["--output_dir=%s" % (tmp_path / "out")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env, timeout=300)
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("pack_records: 4754 sequences in, 4754 out, in ")
  assert "pack_records: write: 4 files written (0 done before)" in result.stderr
  assert output_bytes(str(tmp_path / "out")) == output_bytes(demo_data["packed"])
  result = subprocess.run(command + ["--output_dir=%s" % (tmp_path / "out"), "--seed=3"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env, timeout=300)
  assert result.returncode == 2
  assert [line for line in result.stderr.splitlines() if "error" in line] == [
      result.stderr.strip()]


def test_inspect_records_shows_the_packs_sequence_by_sequence(demo_data):
  vocab = demo_data["vocab_file"]
  packed = inspect_records.inspect_files(record_files(demo_data["packed"]), vocab,
                                         num_examples=50, stats_records=0)
  plain = inspect_records.inspect_files(record_files(demo_data["input_files_dir"]), vocab,
                                        num_examples=0, stats_records=0)
  assert packed["packed"] and not plain["packed"]
  assert not packed["problems"] and not packed["corrupt"]
  stats, plain_stats = packed["statistics"], plain["statistics"]
  assert stats["sequences"] == plain["records"] == plain_stats["records"]
  for key in ("tokens", "predictions", "mask_fraction", "random_next_fraction"):
    assert stats[key] == pytest.approx(plain_stats[key])
  lines = inspect_records.format_report(packed)
  assert any(line.startswith("feature spec: ok in %d packed records read (max_seq_length "
                             "128, max_predictions_per_pack 23, max_sequences_per_pack 3)"
                             % packed["records"]) for line in lines)
  assert any(line.startswith("packs: 4754 sequences in %d records, " % packed["records"])
             for line in lines)
  several = [e for e in packed["examples"] if len(e["texts"]) > 1][0]
  start = lines.index("example: %s record %d, a pack of %d sequences" % (
      several["path"], several["index"], len(several["texts"])))
  for slot, text in enumerate(several["texts"]):
    assert lines[start + 1 + slot] == "  [%d] %s" % (slot + 1, text)
    assert text.startswith("[CLS] ") and text.endswith(" [SEP]") and text.count("[SEP]") == 2
