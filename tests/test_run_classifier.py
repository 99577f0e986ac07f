"""Fine-tuning (run_classifier, classifier_data): GLUE's files as published, the inputs,
the metrics, a run from a pretraining checkpoint, and its one-line errors."""

import collections
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_pretrain.training import checkpoints
from bert_pretrain.finetune import classifier_data
from bert_pretrain import demo
from bert_pretrain import processes
from bert_pretrain.model import modeling
from bert_pretrain.finetune import classifier
from bert_pretrain.data import tokenization
from bert_pretrain.distributed import stacks
from conftest import (ROOT, SAMPLE_TEXT, TINY_CONFIG, forking_env, horovod_env, kill_tree,
                      run_command, signal_when, start_command)


def _write(path, lines):
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


# The first lines of each GLUE file as downloaded (columns cut short where unread).
GLUE = {
    "mrpc": {
        "train.tsv": ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                      "1\t702876\t702977\tAmrozi accused his brother .\tHe called him \" the "
                      "witness \" ."],
        "test.tsv": ["index\t#1 ID\t#2 ID\t#1 String\t#2 String",
                     "0\t1089874\t1089925\tPCCW 's chief .\tCurrent Chief ."]},
    "sst2": {
        "train.tsv": ["sentence\tlabel", "hide new secretions from the parental units \t0"],
        "test.tsv": ["index\tsentence", "0\tuneasy mishmash of styles and genres ."]},
    "cola": {
        "train.tsv": ["gj04\t1\t\tOur friends won't buy this analysis, let alone the next one.",
                      "gj04\t0\t*\tOne more pseudo generalization and I'm giving up."],
        "test.tsv": ["index\tsentence", "0\tBill whistled past the house."]},
    "mnli": {
        "train.tsv": ["index\tpromptID\tpairID\tgenre\ts1bp\ts2bp\ts1p\ts2p\tsentence1\t"
                      "sentence2\tlabel1\tgold_label",
                      "0\t31193\t31193n\tgovernment\t(\t(\t(\t(\tConceptually cream "
                      "skimming .\tProduct and geography .\tneutral\tneutral"],
        "test_matched.tsv": ["index\tpromptID\tpairID\tgenre\ts1bp\ts2bp\ts1p\ts2p\t"
                             "sentence1\tsentence2",
                             "0\t31493\t31493\ttravel\t(\t(\t(\t(\tHierbas .\tA name .\t"]},
}
WANT = {
    ("mrpc", "train"): [("Amrozi accused his brother .", "He called him \" the witness \" .",
                         "1")],
    ("mrpc", "test"): [("PCCW 's chief .", "Current Chief .", "0")],
    ("sst2", "train"): [("hide new secretions from the parental units ", None, "0")],
    ("sst2", "test"): [("uneasy mishmash of styles and genres .", None, "0")],
    ("cola", "train"): [("Our friends won't buy this analysis, let alone the next one.", None,
                         "1"),
                        ("One more pseudo generalization and I'm giving up.", None, "0")],
    ("cola", "test"): [("Bill whistled past the house.", None, "0")],
    ("mnli", "train"): [("Conceptually cream skimming .", "Product and geography .",
                         "neutral")],
    ("mnli", "test"): [("Hierbas .", "A name .", "contradiction")],
}


@pytest.mark.parametrize("task,split", sorted(WANT))
def test_glue_files_read_as_published(tmp_path, task, split):
  for name, lines in GLUE[task].items():
    _write(tmp_path / name, lines)
  examples = classifier_data.read_examples(task, str(tmp_path), split)
  assert [tuple(e) for e in examples] == WANT[(task, split)]


def test_a_plain_tsv_task_takes_its_labels_from_train_tsv(tmp_path):
  _write(tmp_path / "train.tsv", ["a b\tpos", "c d\tneg", "e\tf\tpos"])
  assert classifier_data.task_labels("tsv", str(tmp_path)) == ["neg", "pos"]
  examples = classifier_data.read_examples("tsv", str(tmp_path), "train")
  assert [tuple(e) for e in examples] == [("a b", None, "pos"), ("c d", None, "neg"),
                                          ("e", "f", "pos")]


def test_a_test_tsv_has_train_tsvs_columns_with_or_without_the_label(tmp_path):
  pair, single = tmp_path / "pair", tmp_path / "single"
  for folder in (pair, single):
    folder.mkdir()
  _write(pair / "train.tsv", ["a b\tc d\tpos", "e\tf\tneg"])
  _write(pair / "test.tsv", ["g h\ti j", "k\tl\tneg"])  # a pair without, one with a label
  examples = classifier_data.read_examples("tsv", str(pair), "test", ["neg", "pos"])
  assert [tuple(e) for e in examples] == [("g h", "i j", "neg"), ("k", "l", "neg")]
  _write(single / "train.tsv", ["a b\tpos", "c\tneg"])
  _write(single / "test.tsv", ["g h", "k\tpos"])
  examples = classifier_data.read_examples("tsv", str(single), "test", ["neg", "pos"])
  assert [tuple(e) for e in examples] == [("g h", None, "neg"), ("k", None, "neg")]
  _write(single / "test.tsv", ["g h", "k\tl\tpos"])
  with pytest.raises(ValueError, match=r"^%s line 2 has 3 columns but the lines of train.tsv "
                                       r"have 2; give a test line those columns without the "
                                       r"label \(1\) or with it \(2, not read\)$"
                                       % re.escape(str(single / "test.tsv"))):
    classifier_data.read_examples("tsv", str(single), "test", ["neg", "pos"])
  # Without a file of the task's layout, two columns may be either.
  os.remove(str(pair / "train.tsv"))
  with pytest.raises(ValueError, match=r"test.tsv line 1 has 2 columns: text_a<TAB>text_b, or "
                                       r"text<TAB>label\? there is no train.tsv or dev.tsv "
                                       r"beside it to tell; give its lines the label column"):
    classifier_data.read_examples("tsv", str(pair), "test", ["neg", "pos"])


def test_a_line_longer_than_csvs_field_limit_is_read_whole(tmp_path):
  long_text = "word " * 40000  # 200000 characters: csv refuses over 131072 by default
  _write(tmp_path / "train.tsv", ["a b\tpos", long_text + "\tneg", "c\tpos", "d\tneg"])
  examples = classifier_data.read_examples("tsv", str(tmp_path), "train")
  assert [(len(e.text_a), e.label) for e in examples] == [(3, "pos"), (200000, "neg"),
                                                          (1, "pos"), (1, "neg")]
  assert csv.field_size_limit() == 131072  # as it was: others reading csv keep the limit


def test_a_missing_file_or_a_short_line_is_named_with_the_fix(tmp_path):
  with pytest.raises(ValueError, match=r"dev_matched.tsv does not exist; --data_dir must "
                                       r"hold the mnli files"):
    classifier_data.read_examples("mnli", str(tmp_path), "dev")
  _write(tmp_path / "train.tsv", ["Quality\t#1 ID", "1\t2\t3"])
  with pytest.raises(ValueError, match=r"train.tsv line 2 has 3 columns, mrpc needs 5; is "
                                       r"--task_name=mrpc the task of --data_dir\?"):
    classifier_data.read_examples("mrpc", str(tmp_path), "train")


def test_a_pair_is_cls_a_sep_b_sep_with_the_longer_part_cut_first(tmp_path):
  vocab = tmp_path / "vocab.txt"
  _write(vocab, list(tokenization.SPECIAL_TOKENS) + ["a", "b", "c", "d", "e"])
  tokenizer = tokenization.FullTokenizer(str(vocab))
  examples = [classifier_data.Example("a b c", "d e", "y"),
              classifier_data.Example("e d", None, "x")]
  features = classifier_data.convert_examples(examples, ["x", "y"], tokenizer, 7)
  # 3 + 2 tokens do not fit 7 - 3: "c" goes. [CLS]=2 [SEP]=3 a=5 b=6 c=7 d=8 e=9.
  np.testing.assert_array_equal(features["input_ids"], [[2, 5, 6, 3, 8, 9, 3],
                                                        [2, 9, 8, 3, 0, 0, 0]])
  np.testing.assert_array_equal(features["segment_ids"], [[0, 0, 0, 0, 1, 1, 1],
                                                          [0, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(features["input_mask"], [[1] * 7, [1, 1, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(features["label_ids"], [1, 0])
  with pytest.raises(ValueError, match="label 'z' of example 0 .* is not one of"):
    classifier_data.convert_examples([classifier_data.Example("a", None, "z")], ["x", "y"],
                                     tokenizer, 7)


def test_f1_and_matthews_correlation_match_hand_counts():
  labels = [1, 1, 1, 0, 0, 0, 1, 0]
  predictions = [1, 1, 0, 0, 1, 0, 1, 0]  # tp 3, fn 1, fp 1, tn 3
  mrpc = classifier.classification_metrics("mrpc", labels, predictions)
  assert mrpc == {"accuracy": 0.75, "f1": 0.75}
  cola = classifier.classification_metrics("cola", labels, predictions)
  assert cola["matthews_corr"] == pytest.approx((3 * 3 - 1 * 1) / 16.0)
  assert classifier.classification_metrics("cola", [1, 1], [1, 1])["matthews_corr"] == 0.0


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  """A plain TSV task on the sample text (does a sentence hold the word "and"?), a vocab,
  the tiny config and a pretraining checkpoint of it (random weights, Google's names)."""
  root = tmp_path_factory.mktemp("classifier")
  vocab = str(root / "vocab.txt")
  tokenization.build_wordpiece_vocab([SAMPLE_TEXT], TINY_CONFIG["vocab_size"], vocab)
  config = modeling.BertConfig.from_dict(TINY_CONFIG)
  config_file = root / "bert_config.json"
  config_file.write_text(config.to_json_string())
  sentences = [l.strip() for l in open(SAMPLE_TEXT, encoding="utf-8") if l.strip()][:68]
  tokens = tokenization.BasicTokenizer()
  rows = ["%s\t%s" % (s, "and" if "and" in tokens.tokenize(s) else "none") for s in sentences]
  data = root / "task"
  data.mkdir()
  _write(data / "train.tsv", rows[:40])
  # A tiny BERT from random weights does not generalize from 40 sentences (dev accuracy
  # 0.45 on 20 others): dev.tsv is the training set, which fine-tuning must fit.
  _write(data / "dev.tsv", rows[:40])
  _write(data / "test.tsv", rows[60:])  # 8 rows
  init = root / "pretrained" / "model.ckpt-0"
  demo.write_fresh_checkpoint(config, str(init))
  return {"data": str(data), "vocab": vocab, "config": str(config_file), "init": str(init),
          "rows": rows}


def classify(task, output_dir, *extra, **flags):
  values = dict(task_name="tsv", data_dir=task["data"], vocab_file=task["vocab"],
                bert_config_file=task["config"], output_dir=str(output_dir),
                max_seq_length=64, train_batch_size=8, eval_batch_size=16,
                learning_rate=1e-3, num_train_epochs=30, seed=1, intra_op_threads=1,
                display_loss_steps=25)
  values.update(flags)
  return run_command("bert_pretrain.run_classifier",
                     *["--%s=%s" % item for item in values.items()] + list(extra))


def _results(output_dir):
  with open(os.path.join(str(output_dir), "eval_results.txt")) as f:
    return dict(line.strip().split(" = ") for line in f)


def test_fine_tuning_from_a_pretraining_checkpoint_learns_the_task_and_predicts(task, tmp_path):
  out = tmp_path / "out"
  result = classify(task, out, "--do_predict", init_checkpoint=task["init"])
  assert result.returncode == 0, result.stderr
  # The encoder comes from the checkpoint by name; the head is new.
  loaded = re.search(r"Loaded (\d+) of (\d+) model variables", result.stdout)
  assert loaded and int(loaded.group(2)) == int(loaded.group(1)) + 2, result.stdout
  assert "initialized fresh): output_weights, output_bias" in result.stdout
  assert "labels ['and', 'none']" in result.stdout and "150 updates" in result.stdout
  results = _results(out)
  assert int(results["eval_examples"]) == 40
  assert float(results["accuracy"]) >= 0.9, results  # the larger class: 0.55
  probabilities = np.loadtxt(str(out / "test_results.tsv"), ndmin=2)
  assert probabilities.shape == (8, 2)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
  # The fine-tuned checkpoint evaluates to the same numbers without training.
  again = classify(task, tmp_path / "again", "--nodo_train", init_checkpoint=str(out))
  assert again.returncode == 0, again.stderr
  assert re.search(r"Loaded (\d+) of \1 model variables", again.stdout), again.stdout
  assert _results(tmp_path / "again")["accuracy"] == results["accuracy"]
  assert (out / "labels.txt").read_text() == "and\nnone\n"
  # There the labels are the fine-tune's: a dev label not among them names labels.txt.
  dev_only = tmp_path / "dev_only"
  dev_only.mkdir()
  _write(dev_only / "dev.tsv", task["rows"][:2] + ["a sentence\tmedium"])
  unknown = classify(task, tmp_path / "unknown", "--nodo_train", data_dir=str(dev_only),
                     init_checkpoint=str(out))
  assert unknown.returncode == 2
  assert ("dev.tsv line 3 has the label 'medium', which is not one of the labels of "
          "%s ['and', 'none']" % (out / "labels.txt")) in unknown.stderr


def test_evaluating_without_training_needs_a_checkpoint_with_a_classifier_head(task, tmp_path):
  result = classify(task, tmp_path / "out", "--nodo_train", init_checkpoint=task["init"])
  assert result.returncode == 2
  assert ("--nodo_train but %s has no classifier head (output_weights); pass the checkpoint "
          "run_classifier wrote, or train" % task["init"]) in result.stderr

@pytest.mark.parametrize("flags,message", [
    (dict(task_name="mrpc"), r"dev.tsv|train.tsv"),
    (dict(vocab_file="/nonexistent/vocab.txt"), r"--vocab_file=/nonexistent/vocab.txt does "
                                                r"not exist"),
    (dict(max_seq_length=4096), r"--max_seq_length=4096 exceeds the model's "
                                r"max_position_embeddings=128; lower --max_seq_length"),
    (dict(max_seq_length=2), r"--max_seq_length=2 leaves no room for text"),
    (dict(display_loss_steps=0), r"--display_loss_steps=0 must be positive"),
    (dict(learning_rate=-1), r"--learning_rate=-1 must be positive and finite \(the peak of "
                             r"the schedule\); pass e.g. --learning_rate=5e-05$"),
    (dict(learning_rate="inf"), r"--learning_rate=inf must be positive and finite"),
    (dict(learning_rate="nan"), r"--learning_rate=nan must be positive and finite"),
    (dict(num_train_epochs="inf"), r"--num_train_epochs=inf must be positive and finite \(the "
                                   r"passes over the train split\); pass e.g. "
                                   r"--num_train_epochs=3, or --nodo_train$"),
    (dict(num_train_epochs="nan"), r"--num_train_epochs=nan must be positive and finite"),
    (dict(num_train_epochs=0), r"--num_train_epochs=0 must be positive and finite"),
    (dict(warmup_proportion=5), r"--warmup_proportion=5 must be in \[0, 1\]"),
    (dict(warmup_proportion="nan"), r"--warmup_proportion=nan must be in \[0, 1\]"),
    (dict(seed=-1), r"--seed=-1 must be from 0 to 2147483647 \(or leave it out\)$"),
    (dict(cpu_devices=0, distribution="mirrored"), r"--cpu_devices=0 must be at least 1"),
    (dict(vocab_file=""), r"--vocab_file is required; pass the model's vocab.txt$"),
    (dict(data_dir="/nonexistent/task"), r"--data_dir=/nonexistent/task does not exist; pass "
                                         r"the task's folder of .tsv files$"),
    (dict(cpu_devices=4 * os.cpu_count() + 1, distribution="mirrored"),
     r"--cpu_devices=%d is more than 4 a core of this host's %d cores" % (4 * os.cpu_count() + 1,
                                                                    os.cpu_count())),
], ids=["wrong-task", "no-vocab", "too-long", "too-short", "no-display", "negative-lr",
        "inf-lr", "nan-lr", "inf-epochs", "nan-epochs", "no-epochs", "warmup-5", "nan-warmup",
        "negative-seed", "no-cpu-devices", "vocab-required", "no-data-dir", "cpu-devices"])
def test_bad_inputs_stop_with_one_line_before_training(task, tmp_path, flags, message):
  result = classify(task, tmp_path / "out", **flags)
  assert result.returncode == 2
  (line,) = [l for l in result.stderr.splitlines() if l.startswith("run_classifier: error:")]
  assert re.search(message, line), result.stderr
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags,stopped", [
    (dict(learning_rate=1e6, num_train_epochs=4, display_loss_steps=5),
     r"Loss is nan at step (\d+)"),
    # One update at a learning rate near float32's largest, whose step overflows: its
    # loss, taken before the update, is finite; the weights after it are not.
    (dict(learning_rate=3e38, num_train_epochs=0.2), r"NaN or Inf in the weights after step "
                                                     r"(1)"),
    # float16 skips the steps whose gradients overflow, but not forever once the weights
    # are Inf: the first non-finite loss shown checks them.
    (dict(learning_rate=3e38, num_train_epochs=1, display_loss_steps=1, amp_dtype="float16"),
     r"NaN or Inf in the weights after step (\d+)")],
    ids=["loss", "weights", "float16"])
def test_a_fine_tune_that_diverges_stops_with_one_line_and_saves_nothing(task, tmp_path,
                                                                         flags, stopped):
  out = tmp_path / "out"
  result = classify(task, out, "--do_predict", init_checkpoint=task["init"],
                    warmup_proportion=0, **flags)
  assert result.returncode == 1, result.stderr
  (line,) = [l for l in result.stderr.splitlines() if l.startswith("run_classifier: error:")]
  step = re.fullmatch(r"run_classifier: error: %s: stopping without saving\. Lower "
                      r"--learning_rate or raise --warmup_proportion and run again" % stopped,
                      line)
  assert step, result.stderr
  # It stops at the first display step whose loss is not finite.
  shown = re.findall(r"^Step (\d+), loss: (\S+),", result.stdout, re.M)
  assert shown[-1][0] == step.group(1), result.stdout
  assert all(np.isfinite(float(loss)) for _, loss in shown[:-1]), result.stdout
  assert not [n for n in os.listdir(str(out)) if n.startswith("model.ckpt")]
  assert "Saved" not in result.stdout and "accuracy" not in result.stdout
  assert sorted(os.listdir(str(out))) == [checkpoints.LOCK_FILE, checkpoints.RUN_MARKER]


def test_an_unknown_label_is_named_with_its_file_and_line(task, tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  _write(data / "train.tsv", task["rows"][:8])
  _write(data / "dev.tsv", task["rows"][8:10] + ["a sentence\tmedium"])
  result = classify(task, tmp_path / "out", data_dir=str(data))
  assert result.returncode == 2
  assert ("dev.tsv line 3 has the label 'medium', which is not one of the labels of "
          "train.tsv ['and', 'none']; correct the line or the task") in result.stderr


def test_a_checkpoint_of_another_config_is_refused_by_name(task, tmp_path):
  other = modeling.BertConfig.from_dict(dict(TINY_CONFIG, hidden_size=48))
  init = tmp_path / "other" / "model.ckpt-0"
  demo.write_fresh_checkpoint(other, str(init))
  result = classify(task, tmp_path / "out", init_checkpoint=str(init))
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "run_classifier: error: --init_checkpoint=%s holds a model with hidden_size=48 but "
      "--bert_config_file=%s says hidden_size=32; pass the config the checkpoint was trained "
      "with" % (init, task["config"]))


@pytest.mark.parametrize("layers", [4, 2])
def test_a_config_of_other_layers_than_the_checkpoint_stops_before_training(task, tmp_path,
                                                                            layers):
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(dict(TINY_CONFIG, num_hidden_layers=layers)))
  result = classify(task, tmp_path / "out", init_checkpoint=task["init"],
                    bert_config_file=str(config))
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "run_classifier: error: --init_checkpoint=%s holds a model with num_hidden_layers=1 but "
      "--bert_config_file=%s says num_hidden_layers=%d; pass the config the checkpoint was "
      "trained with" % (task["init"], config, layers))
  assert not (tmp_path / "out").exists()


def test_training_data_of_one_label_is_refused(task, tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  rows = [row.rsplit("\t", 1)[0] + "\tnone" for row in task["rows"][:20]]
  _write(data / "train.tsv", rows[:16])
  _write(data / "dev.tsv", rows[16:])
  result = classify(task, tmp_path / "out", data_dir=str(data))
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "run_classifier: error: %s has only the label 'none' (16 examples): a classifier learns "
      "nothing from one label; pass a --data_dir whose training split holds examples of at "
      "least two labels" % (data / "train.tsv"))
  assert not (tmp_path / "out").exists()


def _task_folder(folder, train, dev):
  folder.mkdir()
  _write(folder / "train.tsv", train)
  _write(folder / "dev.tsv", dev)
  return str(folder)


@pytest.mark.parametrize("change,message", [
    # 20 lines of text<TAB>label turned into label<TAB>text: 20 labels.
    (lambda rows: ["%s\t%s" % tuple(reversed(row.split("\t"))) for row in rows],
     r"train.tsv has 20 different labels in 20 lines: columns swapped, or a file without "
     r"labels\? the label is the last column \(text_a\[<TAB>text_b\]<TAB>label\); correct "
     r"the file$"),
    (lambda rows: ["text\tlabel"] + rows,
     r"train.tsv line 1 holds the only example of the label 'label' \(the others have \d+ "
     r"lines or more\): a header line\? remove it; a plain TSV has none"),
    (lambda rows: rows + ["a sentence\t "],
     r"train.tsv line 21 has an empty label \(the last column\); give it its label or "
     r"remove the line$"),
    # Refused as a line, not first warned of as a label of one line.
    (lambda rows: rows[:10] + ["a line without a tab"] + rows[10:],
     r"train.tsv line 11 has 1 columns; a plain TSV line is text_a\[<TAB>text_b\]<TAB>label$"),
], ids=["swapped", "header", "empty-label", "one-column"])
def test_training_lines_whose_last_column_is_not_a_label_are_refused(task, tmp_path, change,
                                                                      message):
  data = _task_folder(tmp_path / "data", change(task["rows"][:20]), task["rows"][20:30])
  result = classify(task, tmp_path / "out", data_dir=data, init_checkpoint=task["init"])
  assert result.returncode == 2, result.stdout[-2000:]
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith("run_classifier: error: %s" % os.path.join(data, "train.tsv"))
  assert re.search(message, line), line
  assert "warning:" not in result.stderr, result.stderr
  assert not (tmp_path / "out").exists()


def test_a_vocab_that_does_not_fit_the_text_is_a_warning(task, tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\na\nof\n")
  result = classify(task, tmp_path / "out", vocab_file=str(vocab), num_train_epochs=0.2)
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r"^run_classifier: warning: \d+ of the \d+ tokens of the text \(\d+%\) are "
                   r"\[UNK\]: the vocab does not fit the text; pass --vocab_file=<the model's "
                   r"vocab.txt>$", result.stderr, re.M), result.stderr
  # The task's own vocab leaves few unknown.
  assert "[UNK]" not in classify(task, tmp_path / "own", num_train_epochs=0.2).stderr


def test_a_label_of_one_line_is_trained_on_with_a_warning(task, tmp_path):
  rows = task["rows"][:5] + ["a sentence\tnon"] + task["rows"][5:20]
  dev = task["rows"][20:30] + ["another sentence\tnon"]
  data = _task_folder(tmp_path / "data", rows, dev)
  result = classify(task, tmp_path / "out", data_dir=data)
  assert result.returncode == 0, result.stderr[-3000:]
  [warning] = [l for l in result.stderr.splitlines() if "warning:" in l]
  assert warning == (
      "run_classifier: warning: %s line 6 holds the only example of the label 'non' (the "
      "others have 9 lines or more): a typo, or columns swapped? the label is the last "
      "column (text_a[<TAB>text_b]<TAB>label); correct the line if so"
      % os.path.join(data, "train.tsv"))


@pytest.mark.parametrize("train,dev", [
    (["one\ta", "two\tb", "three\tc"], []),  # a small task, not swapped columns
    (["rare one\tc"] + ["x%d\ta" % i for i in range(6)], ["rare two\tc"]),  # not a header
])
def test_small_or_unbalanced_tasks_are_not_refused(train, dev):
  lines = collections.defaultdict(list)
  for number, row in enumerate(train, 1):
    lines[row.split("\t")[-1]].append(number)
  dev_lines = {row.split("\t")[-1]: [1] for row in dev}
  said = []
  classifier_data.check_label_counts(lines, "train.tsv", dev_lines, said.append)
  assert len(said) == (1 if dev else 0)


def test_a_test_tsv_of_other_columns_than_train_tsv_is_refused_before_training(task,
                                                                               tmp_path):
  data = _task_folder(tmp_path / "data", task["rows"][:20], task["rows"][20:30])
  _write(tmp_path / "data" / "test.tsv", ["one\ttwo\tand", "three\tfour\tnone"])
  result = classify(task, tmp_path / "out", "--do_predict", data_dir=data,
                    init_checkpoint=task["init"])
  assert result.returncode == 2, result.stdout[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
      "run_classifier: error: %s line 1 has 3 columns but the lines of train.tsv have 2; give "
      "a test line those columns without the label (1) or with it (2, not read)"
      % os.path.join(data, "test.tsv"))
  assert not (tmp_path / "out").exists()


def test_spaces_around_a_label_do_not_make_another_class(task, tmp_path):
  rows = task["rows"][:20]
  spaced = [row + " " if i % 3 else row.replace("\t", "\t  ") for i, row in enumerate(rows)]
  data = _task_folder(tmp_path / "data", spaced, rows[:8])
  result = classify(task, tmp_path / "out", data_dir=data, init_checkpoint=task["init"],
                    num_train_epochs=1)
  assert result.returncode == 0, result.stderr
  assert "labels ['and', 'none']" in result.stdout, result.stdout
  assert (tmp_path / "out" / "labels.txt").read_text() == "and\nnone\n"


def _files(folder):
  """name -> bytes of the files in folder (the lock file aside: each run rewrites it)."""
  return {name: (folder / name).read_bytes() for name in sorted(os.listdir(str(folder)))
          if name != checkpoints.LOCK_FILE}


def _refusal(result):
  """The last line of a run refused with exit status 2."""
  assert result.returncode == 2, result.stderr[-3000:]
  return result.stderr.strip().splitlines()[-1]


def test_an_output_dir_with_a_fine_tune_is_resumed_by_the_same_command_only(task, tmp_path):
  out = tmp_path / "out"
  flags = dict(init_checkpoint=task["init"], num_train_epochs=4)
  first = classify(task, out, **flags)
  assert first.returncode == 0, first.stderr
  assert "Saved %s" % (out / "model.ckpt-20") in first.stdout
  before = _files(out)
  # The same command: the fine-tune is there, so nothing is trained; the same results.
  again = classify(task, out, **flags)
  assert again.returncode == 0, again.stderr
  assert ("--output_dir=%s already holds this fine-tune (model.ckpt-20, the same settings): "
          "nothing to train, it is evaluated" % out) in again.stdout
  assert "Step " not in again.stdout and "Saved" not in again.stdout
  assert _files(out) == before
  # Other settings, or evaluating another checkpoint there, are refused; nothing changes.
  assert _refusal(classify(task, out, init_checkpoint=task["init"], num_train_epochs=2)) == (
      "run_classifier: error: --output_dir=%s holds a run with other num_train_epochs, "
      "num_train_steps (num_train_epochs was 4.0, now 2.0; num_train_steps was 20, now 10); "
      "resume with the same settings or use a new --output_dir"
      % out)
  elsewhere = tmp_path / "elsewhere"
  assert classify(task, elsewhere, **dict(flags, seed=2)).returncode == 0
  evaluated = classify(task, out, "--nodo_train", init_checkpoint=str(elsewhere))
  assert evaluated.returncode == 2
  assert ("run_classifier: error: --output_dir=%s holds the fine-tune model.ckpt-20; "
          "evaluating --init_checkpoint=%s there would replace its results"
          % (out, elsewhere / "model.ckpt-20")) in evaluated.stderr
  assert _files(out) == before
  # --nodo_train into a folder without a fine-tune: its results are of one checkpoint.
  results = tmp_path / "results"
  assert classify(task, results, "--nodo_train", init_checkpoint=str(elsewhere)).returncode == 0
  kept = _files(results)
  assert _refusal(classify(task, results, "--nodo_train", init_checkpoint=str(out))) == (
      "run_classifier: error: --output_dir=%s holds the results of evaluating %s; evaluating "
      "--init_checkpoint=%s there would replace them; pass another --output_dir"
      % (results, elsewhere / "model.ckpt-20", out / "model.ckpt-20"))
  assert _files(results) == kept
  assert _refusal(classify(task, results, init_checkpoint=task["init"],
                           num_train_epochs=1)) == (
      "run_classifier: error: --output_dir=%s holds the results of evaluating %s; a "
      "fine-tune there would replace them; pass another --output_dir"
      % (results, elsewhere / "model.ckpt-20"))
  assert _files(results) == kept
  assert classify(task, results, "--nodo_train", init_checkpoint=str(elsewhere)).returncode == 0
  # A fine-tune of an earlier version (no run marker) is not written over either.
  os.remove(str(out / checkpoints.RUN_MARKER))
  old = classify(task, out, **flags)
  assert old.returncode == 2
  assert ("--output_dir=%s holds a checkpoint that is not a checkpoint of this run's recipe"
          % out) in old.stderr


def test_a_fine_tune_is_not_taken_up_after_its_train_tsv_or_vocab_changed(task, tmp_path):
  data = _task_folder(tmp_path / "data", task["rows"][:16], task["rows"][16:24])
  vocab = tmp_path / "vocab.txt"
  shutil.copy(task["vocab"], str(vocab))
  out = tmp_path / "out"
  flags = dict(data_dir=data, vocab_file=str(vocab), init_checkpoint=task["init"],
               num_train_epochs=1)
  assert classify(task, out, **flags).returncode == 0
  before = _files(out)
  # The same lines but for a trailing space: the same labels and updates, other bytes.
  train = tmp_path / "data" / "train.tsv"
  _write(train, task["rows"][:15] + [task["rows"][15] + " "])
  changed = classify(task, out, **flags)
  assert changed.returncode == 2
  assert changed.stderr.strip().splitlines()[-1] == (
      "run_classifier: error: --output_dir=%s holds a fine-tune of other inputs: %s changed "
      "since it was trained (another sha256); pass a new --output_dir, or the files it was "
      "trained on" % (out, train))
  _write(train, task["rows"][:16])
  tokens = vocab.read_text(encoding="utf-8").splitlines()
  _write(vocab, tokens[:-2] + tokens[:-3:-1])  # the last two tokens swapped
  changed = classify(task, out, **flags)
  assert changed.returncode == 2
  assert ("holds a fine-tune of other inputs: --vocab_file=%s changed since it was trained"
          % vocab) in changed.stderr.strip().splitlines()[-1]
  assert _files(out) == before
  # Evaluated elsewhere with that vocab: its ids would name other tokens.
  elsewhere = classify(task, tmp_path / "eval", "--nodo_train",
                       **dict(flags, init_checkpoint=str(out)))
  assert elsewhere.returncode == 2
  assert elsewhere.stderr.strip().splitlines()[-1] == (
      "run_classifier: error: --vocab_file=%s is not the vocab the fine-tune "
      "--init_checkpoint=%s was trained with (another sha256): its ids would name other "
      "tokens; pass that vocab.txt" % (vocab, checkpoints.resolve_checkpoint(str(out))))
  assert not (tmp_path / "eval").exists()
  # A fine-tune of a version that recorded no digests is taken up as before.
  record = json.loads((out / checkpoints.RUN_MARKER).read_text())
  del record["train_sha256"], record["vocab_sha256"]
  checkpoints.write_run_marker(str(out), record)
  older = classify(task, out, **flags)
  assert older.returncode == 0, older.stderr
  assert "already holds this fine-tune" in older.stdout


def test_a_damaged_run_marker_beside_the_init_checkpoint_is_said_and_does_not_stop_a_fine_tune(
    task, tmp_path):
  pretrained = tmp_path / "pretrained"
  pretrained.mkdir()
  for name in os.listdir(os.path.dirname(task["init"])):
    shutil.copy(os.path.join(os.path.dirname(task["init"]), name), str(pretrained))
  marker = pretrained / checkpoints.RUN_MARKER
  marker.write_text('{"bert_config": {')
  init = str(pretrained / os.path.basename(task["init"]))
  data = _task_folder(tmp_path / "data", task["rows"][:16], task["rows"][16:24])
  result = classify(task, tmp_path / "out", data_dir=data, init_checkpoint=init,
                    num_train_epochs=1)
  assert result.returncode == 0, result.stderr
  assert ("run_classifier: warning: %s is damaged: --vocab_file and --do_lower_case are not "
          "checked against the ones --init_checkpoint=%s was trained with" % (marker, init)
          ) in result.stderr
  assert marker.read_text() == '{"bert_config": {'


def test_pretraining_and_fine_tuning_refuse_each_others_output_dir(task, tmp_path):
  pretrained = tmp_path / "pretrained"
  pretrained.mkdir()
  for name in os.listdir(os.path.dirname(task["init"])):
    shutil.copy(os.path.join(os.path.dirname(task["init"]), name), str(pretrained))
  checkpoints.write_run_marker(str(pretrained), {"bert_config": TINY_CONFIG,
                                                 "max_seq_length": 64})
  result = classify(task, pretrained, init_checkpoint=task["init"])
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "run_classifier: error: --output_dir=%s holds the checkpoints of run_pretraining, not "
      "of run_classifier; pass another --output_dir (and one of them as --init_checkpoint "
      "to start from it)" % pretrained)
  assert sorted(os.listdir(str(pretrained))) == [
      checkpoints.RUN_MARKER, "checkpoint", "model.ckpt-0.data-00000-of-00001",
      "model.ckpt-0.index"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_fine_tune_ends_it_with_one_line(task, tmp_path, signum):
  out = tmp_path / "out"
  log = tmp_path / "log.txt"
  values = dict(task_name="tsv", data_dir=task["data"], vocab_file=task["vocab"],
                bert_config_file=task["config"], output_dir=str(out), max_seq_length=64,
                train_batch_size=8, num_train_epochs=1000, display_loss_steps=1,
                init_checkpoint=task["init"], intra_op_threads=1)
  process = start_command("bert_pretrain.run_classifier",
                          *["--%s=%s" % item for item in values.items()],
                          stdout=log, stderr=log)
  status = signal_when(process, lambda: "Step 1," in log.read_text(), signum, log)  # training
  output = log.read_text()
  assert "Traceback" not in output, output
  said = ("run the same command again (a fine-tune is saved at its end: one stopped before "
          "it starts over)\n")
  if signum == signal.SIGTERM:
    assert status == 143 and output.endswith("\nrun_classifier: terminated (SIGTERM); " + said)
  else:
    assert status == 130 and output.endswith("\nrun_classifier: interrupted; " + said), output
  assert not [n for n in os.listdir(str(out)) if n.startswith("model.ckpt")]


def test_a_second_run_on_an_output_dir_in_use_is_refused(task, tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  (out / "eval_results.txt").write_text("accuracy = 0.9\n")
  lock = checkpoints.OutputDirLock(str(out))
  lock.acquire()  # As a live run does.
  try:
    result = classify(task, out, init_checkpoint=task["init"])
  finally:
    lock.release()
  assert result.returncode == 2
  assert ("run_classifier: error: --output_dir=%s is in use by another run (pid %d on "
          % (out, os.getpid())) in result.stderr
  assert (out / "eval_results.txt").read_text() == "accuracy = 0.9\n"


HOROVODRUN_2 = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"]


def _job(task, out, launcher, *flags):
  """The command of a fine-tune of `task` into `out` under `launcher`; flags added."""
  return launcher + [sys.executable, "-m", "bert_pretrain.run_classifier",
                     "--task_name=tsv", "--data_dir=" + task["data"],
                     "--vocab_file=" + task["vocab"], "--bert_config_file=" + task["config"],
                     "--init_checkpoint=" + task["init"], "--output_dir=" + str(out),
                     "--max_seq_length=64", "--train_batch_size=4",
                     "--intra_op_threads=1"] + list(flags)


@pytest.mark.parametrize("launcher,engine", [
    (HOROVODRUN_2, ["--horovod"]), ([], ["--distribution=mirrored", "--cpu_devices=2"])],
                         ids=["horovod", "mirrored"])
def test_two_ranks_fine_tune_with_the_global_batch_and_rank_0_evaluates(task, tmp_path,
                                                                         launcher, engine):
  command = _job(task, tmp_path / "out", launcher, *engine + [
      "--num_train_epochs=30", "--learning_rate=1e-3", "--seed=1", "--do_predict"])
  result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300, env=forking_env(horovod_env()))
  assert result.returncode == 0, result.stdout[-3000:]
  # 40 examples x 30 epochs / (4 x 2 ranks): the updates of one card with batch 8.
  assert "2 rank(s), batch 4 x 2 ranks, 150 updates" in result.stdout
  assert result.stdout.count("***** Eval results *****") == 1
  assert float(_results(tmp_path / "out")["accuracy"]) >= 0.9
  assert len(open(str(tmp_path / "out" / "test_results.tsv")).readlines()) == 8


def test_a_frozen_rank_of_a_fine_tune_is_named_and_the_job_ends(task, tmp_path):
  """Each rank's heartbeat in output_dir/.ranks, as run_pretraining's: a rank that stops
  answering is named by its peer, which ends the job instead of waiting for ever."""
  out = tmp_path / "out"
  proc = subprocess.Popen(_job(task, out, HOROVODRUN_2, "--horovod", "--stall_timeout_s=10",
                               "--num_train_epochs=100000"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, env=horovod_env())
  rank_1 = None
  try:
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
      heartbeat = stacks.read_heartbeat(str(out / ".ranks"), 1)
      rank_1 = heartbeat and stacks.parse_heartbeat(heartbeat[0])
      if rank_1 and rank_1[2].startswith("fine-tuning: "):
        break
      time.sleep(0.5)
    assert rank_1 and rank_1[2].startswith("fine-tuning: "), proc.poll()
    os.kill(rank_1[0], signal.SIGSTOP)
    stopped_at = time.time()
    text = proc.communicate(timeout=120)[0]
    elapsed = time.time() - stopped_at
  finally:
    if rank_1:
      try:
        os.kill(rank_1[0], signal.SIGKILL)
      except ProcessLookupError:  # horovodrun ended it
        pass
    kill_tree(proc.pid)
    proc.wait()
  assert proc.returncode != 0
  assert elapsed < 10 + 40, elapsed
  print([line for line in text.splitlines() if "error:" in line])
  assert "run_classifier: error: rank 1 stalled: no sign of life for 10 s" in text, text
  assert ("doing at its last heartbeat: fine-tuning: 500000 updates, each with the "
          "gradients' all-reduce") in (out / "stall-rank-1.txt").read_text()


def test_a_second_fine_tune_job_on_a_folder_in_use_leaves_the_live_jobs_heartbeats_alone(
    task, tmp_path):
  out = tmp_path / "out"
  (out / ".ranks").mkdir(parents=True)
  live = "4242 7 host2\nfine-tuning: 150 updates, each with the gradients' all-reduce\n"
  (out / ".ranks" / "rank-1").write_text(live)
  lock = checkpoints.OutputDirLock(str(out))
  lock.acquire()  # As a live job's rank 0 does.
  try:
    in_use = subprocess.run(_job(task, out, HOROVODRUN_2, "--horovod", "--stall_timeout_s=10"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True, timeout=300,
                            env=forking_env(horovod_env()))
  finally:
    lock.release()
  assert in_use.returncode != 0
  assert "--output_dir=%s is in use by another run" % out in in_use.stdout, in_use.stdout
  assert os.listdir(str(out / ".ranks")) == ["rank-1"]
  assert (out / ".ranks" / "rank-1").read_text() == live


def test_a_worker_whose_chief_is_refused_ends_naming_the_chiefs_error(task, tmp_path):
  """multi_worker_mirrored: only the chief checks the lock (a worker would see its own
  chief's); its heartbeat then ends the worker, which would wait for ever in the
  weights' broadcast."""
  out = tmp_path / "out"
  out.mkdir()
  workers = ["localhost:%d" % port for port in processes.free_ports(2)]
  lock = checkpoints.OutputDirLock(str(out))
  lock.acquire()  # As a live run does.
  procs = []
  try:
    for index in range(2):
      procs.append(subprocess.Popen(
          _job(task, out, [], "--distribution=multi_worker_mirrored", "--stall_timeout_s=10"),
          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
          env=horovod_env(TF_CONFIG=json.dumps({"cluster": {"worker": workers}, "task": {
              "type": "worker", "index": index}}))))
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
  finally:
    lock.release()
    for proc in procs:
      kill_tree(proc.pid)
      proc.wait()
  refusal = "--output_dir=%s is in use by another run (pid %d on " % (out, os.getpid())
  assert procs[0].returncode == 2 and refusal in outputs[0], outputs[0]
  # Its error when the worker started before the chief's heartbeat said it; else (an
  # earlier run's file, for all it can tell) the chief's silence.
  assert procs[1].returncode == 3, outputs[1]
  assert ("run_classifier: error: worker 0 (%s) ended at its error (%s" % (
      workers[0], refusal) in outputs[1] or
          "run_classifier: error: worker 0 (%s) stalled: no sign of life for 10 s" % workers[0]
          in outputs[1]), (
              outputs[1])
