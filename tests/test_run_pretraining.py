"""The training loop end to end, evaluation numbers, logs, and every bad input."""

import json
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import modeling
from bert_pretrain import run_pretraining as rp
from conftest import PREDICTIONS, SEQ_LENGTH, TINY_CONFIG, base_flags, run_pretraining


def test_training_run_logs_evaluates_and_saves(pretraining_data, tmp_path):
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(
      pretraining_data, out, num_train_steps=6, eval_at_start=True, samples_start_eval=0,
      samples_between_eval=24, save_checkpoints_steps=4, stop_threshold=0.99,
      dllog_path=str(tmp_path / "log.json")))
  assert result.returncode == 0, result.stderr
  stdout = result.stdout
  steps = [int(s) for s in re.findall(r"^Step (\d+), total_loss: [\d.]+, mlm_loss: [\d.]+, "
                                      r"nsp_loss: [\d.]+, learning_rate: \S+, "
                                      r"sentences_per_second: [\d.]+$", stdout, re.M)]
  assert steps == [2, 4, 6]
  # Evaluations: at the start, after 24 and 48 samples (steps 3 and 6); no duplicate at 6.
  assert stdout.count("***** Eval results *****") == 3
  accuracies = [float(a) for a in re.findall(r"^  masked_lm_accuracy = ([\d.]+)$", stdout, re.M)]
  assert len(accuracies) == 3 and all(0.0 <= a <= 1.0 for a in accuracies)
  assert re.search(r"^\| 1 card \| acc [\d.]+ \| fps [\d.]+ \| status aborted \|$", stdout, re.M)
  assert "Throughput Average (sentences/sec) = " in stdout
  # Checkpoints at step 4 and the final one at 6; eval_results.txt of the last eval.
  assert os.path.exists(str(out / "model.ckpt-4.index"))
  assert tf.train.latest_checkpoint(str(out)).endswith("model.ckpt-6")
  results = (out / "eval_results.txt").read_text()
  assert "global_step = 6" in results and "masked_lm_accuracy = %s" % accuracies[-1] in results
  # Machine logs: JSON lines, MLPerf log with run_stop, TensorBoard events.
  records = [json.loads(line) for line in open(str(tmp_path / "log.json"))]
  assert [r["step"] for r in records if r["type"] == "train" and "mlm_loss" in r] == [2, 4, 6]
  mllog = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(str(out / "mlperf.log"))]
  keys = [m["key"] for m in mllog]
  for key in ("init_start", "run_start", "global_batch_size", "opt_base_learning_rate",
              "eval_accuracy", "run_stop"):
    assert key in keys
  assert mllog[-1]["key"] == "run_stop" and mllog[-1]["metadata"]["status"] == "aborted"
  assert [m["value"] for m in mllog if m["key"] == "global_batch_size"] == [8]
  assert any(n.startswith("events.out.tfevents") for n in os.listdir(str(out)))
  # MLCommons' own checker reads the log; all it may object to is the accuracy target,
  # which a 6-step run does not reach.
  check = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage",
                          "training", "--ruleset", "4.1.0", str(out / "mlperf.log")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, cwd=str(tmp_path))
  assert "closed_bert.yaml" in check.stdout
  assert "Required" not in check.stdout, check.stdout
  problems = [l for l in check.stdout.splitlines() if l.startswith(("WARNING", "ERROR"))]
  assert all("eval_accuracy" in l or "FAILED" in l for l in problems), problems


def test_stop_threshold_reached_reports_success(pretraining_data, tmp_path):
  result = run_pretraining(*base_flags(pretraining_data, tmp_path / "out", num_train_steps=20,
                                       samples_start_eval=0, samples_between_eval=16,
                                       stop_threshold=0.0001))
  assert result.returncode == 0, result.stderr
  # Evaluations at steps 2, 4, ...; the first with a correct prediction stops the run (at
  # step 2 an untrained model can still have none right).
  reached = re.search(r"reached --stop_threshold=0.0001 at step (\d+)\n", result.stdout)
  assert reached, result.stdout
  assert "status success" in result.stdout
  assert "Step %d," % (int(reached.group(1)) + 2) not in result.stdout


def _write_records(path, examples):
  def ints(v):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=v))
  with tf.io.TFRecordWriter(path) as writer:
    for ex in examples:
      features = {k: ints(v) for k, v in ex.items() if k != "masked_lm_weights"}
      features["masked_lm_weights"] = tf.train.Feature(
          float_list=tf.train.FloatList(value=ex["masked_lm_weights"]))
      writer.write(tf.train.Example(features=tf.train.Features(feature=features))
                   .SerializeToString())


def test_eval_numbers_on_a_hand_checkable_case(tmp_path):
  """A model whose output biases force it to predict token 7 and "is next" (0) always:
  masked-LM accuracy is the weighted share of masked tokens that are 7, next-sentence
  accuracy the share of label 0, over 5 records read in batches of 2."""
  seq, preds = 8, 3
  labels = [([7, 7, 3], [1, 1, 1], 0), ([7, 2, 9], [1, 1, 0], 1), ([4, 7, 7], [1, 0, 0], 0),
            ([7, 5, 6], [1, 1, 1], 0), ([8, 8, 7], [0, 0, 0], 1)]
  examples = [{"input_ids": [1] * seq, "input_mask": [1] * seq, "segment_ids": [0] * seq,
               "masked_lm_positions": [1, 2, 3], "masked_lm_ids": ids,
               "masked_lm_weights": weights, "next_sentence_labels": [nsp]}
              for ids, weights, nsp in labels]
  _write_records(str(tmp_path / "eval.tfrecord"), examples)
  # Weighted hits: 2 of 3, 1 of 2, 0 of 1, 1 of 3, 0 of 0 -> 4 of 9.
  want_mlm = 4.0 / 9.0
  want_nsp = 3.0 / 5.0
  config = modeling.BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=32,
                               max_position_embeddings=seq)
  with tf.Graph().as_default():
    evaluator = rp.Evaluator(config, [str(tmp_path / "eval.tfrecord")], rp.Ranks(False),
                             tf.float32, batch_size=2, max_seq_length=seq,
                             max_predictions_per_seq=preds)
    variables = {v.op.name: v for v in tf.global_variables()}
    bias = np.zeros(20, np.float32)
    bias[7] = 1000.0
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(variables["cls/predictions/output_bias"].assign(bias))
      sess.run(variables["cls/seq_relationship/output_bias"].assign([1000.0, 0.0]))
      results = evaluator.evaluate(sess)
  assert results["eval_samples"] == 5
  assert results["masked_lm_accuracy"] == pytest.approx(want_mlm, abs=1e-6)
  assert results["next_sentence_accuracy"] == pytest.approx(want_nsp, abs=1e-6)
  # Predicting 7 with near certainty: the loss is ~0 on hits and ~1000 on misses.
  assert results["masked_lm_loss"] == pytest.approx(1000.0 * 5 / 9, rel=0.01)


# Every bad input: a one-line error that names the problem and the fix, a non-zero exit
# before training starts, and output_dir left as it was.

def _corrupt_copy(data, tmp_path):
  folder = tmp_path / "corrupt"
  shutil.copytree(data["train"], str(folder))
  name = sorted(os.listdir(str(folder)))[0]
  blob = (folder / name).read_bytes()
  # Cut inside the record that spans the middle of the file: a cut that falls between two
  # records (the data, hence record sizes, vary with the vocab) leaves a valid shorter file.
  offset = 0
  while True:
    (length,) = struct.unpack("<Q", blob[offset:offset + 8])
    if offset + 12 + length + 4 > len(blob) // 2:
      break
    offset += 12 + length + 4
  (folder / name).write_bytes(blob[:offset + 12 + length // 2])
  return str(folder)


def _flipped_copy(data, tmp_path):
  folder = tmp_path / "flipped"
  shutil.copytree(data["train"], str(folder))
  name = sorted(os.listdir(str(folder)))[0]
  blob = bytearray((folder / name).read_bytes())
  blob[40] ^= 0xFF  # inside the first record's data: the CRC check fails
  (folder / name).write_bytes(bytes(blob))
  return str(folder)


def _config_with(tmp_path, **changes):
  path = tmp_path / "changed_config.json"
  path.write_text(json.dumps(dict(TINY_CONFIG, **changes)))
  return str(path)


def _big_vocab(data, tmp_path):
  path = tmp_path / "big_vocab.txt"
  words = open(data["vocab"]).read().split("\n")
  path.write_text("\n".join(words + ["extra%d" % i for i in range(1000)]))
  return str(path)


def _empty_dir(tmp_path):
  (tmp_path / "empty").mkdir()
  return str(tmp_path / "empty")


def _readme_only_dir(tmp_path):
  (tmp_path / "readme_only").mkdir()
  (tmp_path / "readme_only" / "README.txt").write_text("no records here")
  return str(tmp_path / "readme_only")


def _not_records_dir(tmp_path):
  (tmp_path / "not_records").mkdir()
  (tmp_path / "not_records" / "part-0").write_text("just some text, not a TFRecord file\n" * 3)
  return str(tmp_path / "not_records")


def _unwritable_output(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  return str(blocker / "out")


BAD_INPUTS = [
    ("missing data folder", lambda d, t: dict(input_files_dir=str(t / "nope")),
     r"--input_files_dir=\S+ does not exist"),
    ("empty data folder", lambda d, t: dict(input_files_dir=_empty_dir(t)),
     r"holds no TFRecord files"),
    ("no files matching", lambda d, t: dict(input_files_dir=_readme_only_dir(t)),
     r"holds no TFRecord files"),
    ("not TFRecords", lambda d, t: dict(input_files_dir=_not_records_dir(t)),
     r"corrupt TFRecord file"),
    ("truncated TFRecord", lambda d, t: dict(input_files_dir=_corrupt_copy(d, t)),
     r"corrupt TFRecord file .*part-0"),
    ("flipped byte in a TFRecord", lambda d, t: dict(input_files_dir=_flipped_copy(d, t)),
     r"corrupt TFRecord file .*part-0"),
    ("records of another sequence length", lambda d, t: dict(max_seq_length=128),
     r"records of max_seq_length 64 .* pass --max_seq_length=64"),
    ("missing eval folder", lambda d, t: dict(eval_files_dir=str(t / "nope")),
     r"--eval_files_dir=\S+ does not exist"),
    ("missing bert_config.json", lambda d, t: dict(bert_config_file=str(t / "nope.json")),
     r"bert config \S+ does not exist"),
    ("invalid bert_config.json", lambda d, t: dict(bert_config_file=_config_with(
        t, hidden_size="big")), r"hidden_size must be a positive integer"),
    ("vocab larger than vocab_size", lambda d, t: dict(vocab_file=_big_vocab(d, t)),
     r"has \d+ tokens but vocab_size in \S+ is 600"),
    ("data ids beyond vocab_size", lambda d, t: dict(bert_config_file=_config_with(
        t, vocab_size=100)), r"holds token id \d+ but vocab_size is 100"),
    ("checkpoint path that does not exist", lambda d, t: dict(
        init_checkpoint=str(t / "model.ckpt-5")), r"no checkpoint there"),
    ("max_seq_length above max_position_embeddings", lambda d, t: dict(
        bert_config_file=_config_with(t, max_position_embeddings=32)),
     r"--max_seq_length=64 is above max_position_embeddings=32"),
    ("batch size 0", lambda d, t: dict(train_batch_size=0),
     r"--train_batch_size=0 must be at least 1"),
    ("bert_config.json is a folder", lambda d, t: dict(bert_config_file=_empty_dir(t)),
     r"bert config \S+ does not exist"),
    ("negative keep_checkpoint_max", lambda d, t: dict(keep_checkpoint_max=-1),
     r"--keep_checkpoint_max=-1 must not be negative"),
    ("output_dir that cannot be written", lambda d, t: dict(output_dir=_unwritable_output(t)),
     r"--output_dir=\S+ cannot be written"),
]


@pytest.mark.parametrize("case,overrides,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_a_one_line_error(pretraining_data, tmp_path, case, overrides, message):
  out = tmp_path / "out"
  out.mkdir()
  (out / "model.ckpt-keep.txt").write_text("an earlier result")
  flags = base_flags(pretraining_data, out)
  for name, value in overrides(pretraining_data, tmp_path).items():
    flags = [f for f in flags if not f.startswith("--%s=" % name)] + ["--%s=%s" % (name, value)]
  result = run_pretraining(*flags)
  assert result.returncode != 0, case
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1, result.stderr
  assert re.search(message, errors[0]), errors[0]
  assert "Traceback" not in result.stderr
  assert "Step " not in result.stdout
  assert sorted(os.listdir(str(out))) == ["model.ckpt-keep.txt"]


def test_half_written_and_foreign_files_are_not_training_data(pretraining_data, tmp_path):
  from bert_pretrain import input_pipeline
  folder = tmp_path / "records"
  shutil.copytree(pretraining_data["train"], str(folder))
  for name in ("part-9.tmp-1234", "README.md", "manifest.json", ".hidden", "part-8.tmp"):
    (folder / name).write_text("not records")
  (folder / "empty-part").write_bytes(b"")
  files = input_pipeline.list_record_files(str(folder))
  assert [os.path.basename(f) for f in files] == sorted(os.listdir(pretraining_data["train"]))


def _final_eval(stdout):
  blocks = stdout.split("***** Eval results *****")
  last = blocks[-1]
  return {k: float(v) for k, v in re.findall(r"^  (\w+) = ([\d.e+-]+)$", last, re.M)}


def test_amp_matches_float32_and_xla_runs(pretraining_data, tmp_path):
  """bfloat16 compute (the CPU's --amp) trains like float32: same data order, same seed,
  the final eval within a small tolerance; --use_xla runs too."""
  common = dict(num_train_steps=30, learning_rate=5e-3, shuffle_buffer=1, seed=5,
                display_loss_steps=10)
  fp32 = run_pretraining(*base_flags(pretraining_data, tmp_path / "fp32", **common))
  amp = run_pretraining(*base_flags(pretraining_data, tmp_path / "amp", amp=None, **common))
  xla = run_pretraining(*base_flags(pretraining_data, tmp_path / "xla", use_xla=None,
                                    **dict(common, num_train_steps=2)))
  for result in (fp32, amp, xla):
    assert result.returncode == 0, result.stderr
  assert "float32 compute" in fp32.stdout and "bfloat16 compute" in amp.stdout
  first_loss = float(re.search(r"Step 10, total_loss: ([\d.]+)", fp32.stdout).group(1))
  got, want = _final_eval(amp.stdout), _final_eval(fp32.stdout)
  assert want["masked_lm_loss"] < first_loss - 0.5  # float32 did learn something
  assert got["masked_lm_loss"] == pytest.approx(want["masked_lm_loss"], rel=0.03)
  assert got["masked_lm_accuracy"] == pytest.approx(want["masked_lm_accuracy"], abs=0.03)
  assert "Step 2," in xla.stdout
