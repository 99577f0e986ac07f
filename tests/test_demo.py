"""The demo's downstream step (bert_pretrain/demo.py): the word-order task it writes, the
most-frequent-token baseline of the masked-LM accuracy, and the lines it prints after a
real (short) pretraining run of the demo."""

import collections
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import config
from bert_pretrain import demo
from bert_pretrain.data import records
from bert_pretrain.training import checkpoints
from bert_pretrain.training import report
from conftest import AMP_ON_THIS_CPU, base_flags, run_pretraining, tool_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_task(folder):
  """{split: [(text, label)]} of a TSV task folder."""
  task = {}
  for split in ("train", "dev"):
    with open(os.path.join(str(folder), split + ".tsv"), encoding="utf-8") as f:
      task[split] = [tuple(line.rstrip("\n").rsplit("\t", 1)) for line in f]
  return task


def test_the_word_order_task_shuffles_about_half_the_sentences_of_the_held_out_documents(
    tmp_path):
  num_train, num_dev, majority = demo.write_word_order_task(str(tmp_path / "task"))
  task = read_task(tmp_path / "task")
  assert (len(task["train"]), len(task["dev"])) == (num_train, num_dev)
  documents = demo.read_documents(demo.CORPUS)
  sentences = {split: [s.split()[:demo.WORD_ORDER_MAX_WORDS] for i, d in enumerate(documents)
                       for s in d if len(s.split()) >= demo.WORD_ORDER_MIN_WORDS
                       and demo.is_held_out(i) == (split == "dev")]
               for split in ("train", "dev")}
  for split in ("train", "dev"):
    # One line per long enough sentence, in corpus order, of its own split's documents.
    assert len(task[split]) == len(sentences[split])
    for (text, label), words in zip(task[split], sentences[split]):
      assert sorted(text.split()) == sorted(words)
      assert (text.split() == words) == (label == "original"), (text, label)
    labels = collections.Counter(label for _, label in task[split])
    assert set(labels) == set(demo.WORD_ORDER_LABELS)
    assert 0.4 < labels["shuffled"] / float(len(task[split])) < 0.6
  dev_labels = collections.Counter(label for _, label in task["dev"])
  assert majority == max(dev_labels.values()) / float(num_dev)
  # The same sentences are shuffled the same way on every run.
  demo.write_word_order_task(str(tmp_path / "again"))
  assert read_task(tmp_path / "again") == task


def write_records(path, masked):
  """Writes one pretraining record per (masked_lm_ids, masked_lm_weights) of `masked`."""
  with tf.io.TFRecordWriter(path) as writer:
    for ids, weights in masked:
      writer.write(records.serialize_example({
          "input_ids": [2, 5, 3] + [0] * 5, "input_mask": [1] * 3 + [0] * 5,
          "segment_ids": [0] * 8, "masked_lm_positions": [1, 2, 0, 0],
          "masked_lm_ids": ids, "masked_lm_weights": weights, "next_sentence_labels": [0]}))


def test_the_most_frequent_token_counts_only_the_positions_the_accuracy_counts(tmp_path):
  """Padding (weight 0) outnumbers every token but is no prediction: token 9 is masked 3
  times with weight 1, token 7 twice."""
  (tmp_path / "eval").mkdir()
  write_records(str(tmp_path / "eval" / "part-0"), [
      ([7, 7, 9, 0], [1.0, 1.0, 1.0, 0.0]),
      ([9, 9, 0, 0], [1.0, 1.0, 0.0, 0.0]),
      ([7, 0, 0, 0], [0.0, 0.0, 0.0, 0.0])])
  assert demo.most_frequent_token(str(tmp_path / "eval")) == (9, 3 / 5.0, 3)


@pytest.fixture(scope="module")
def short_demo_run(tmp_path_factory):
  """The demo's cache and a pretraining run of the demo, 2 updates long, without its
  fine-tuning step."""
  root = tmp_path_factory.mktemp("demo")
  paths = demo.prepare(str(root / "cache"), log=lambda line: None)
  output_dir = str(root / "results" / "demo-test")
  flags = ["--preset=demo", "--demo_cache_dir=%s" % (root / "cache"), "--noamp",
           "--output_dir=" + output_dir, "--num_train_steps=2", "--nodraw_report",
           "--intra_op_threads=1", "--demo_finetune_epochs=0"]
  result = subprocess.run(
      [sys.executable, "-m", "bert_pretrain.run_pretraining"] + flags, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, universal_newlines=True, timeout=300,
      env=tool_env())
  assert result.returncode == 0, result.stdout[-3000:]
  return {"cache": str(root / "cache"), "output_dir": output_dir, "paths": paths}


def test_the_first_update_that_fetches_the_losses_is_left_out_of_the_steady_fps(
    pretraining_data, tmp_path):
  # Updates 1-10 warm up, 11 is traced, 12-13 are steady; 14, the last, is the first to
  # fetch the losses (its session call is set up then: the demo's model takes longer for
  # it than for several updates), so the steady figure counts 12 and 13 alone. The run's
  # own count is asserted, on the tiny model: comparing the speeds would test the
  # machine's load.
  output_dir = tmp_path / "run"
  result = run_pretraining(*base_flags(pretraining_data, output_dir, num_train_steps=14,
                                       display_loss_steps=50, fps_warmup_steps=10,
                                       nodo_eval=None))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Update time (update 11 traced" in result.stdout, result.stdout[-3000:]
  (summary,) = [r for r in report.read_records(str(output_dir / "dllog.json"))
                if r["type"] == "summary"]
  assert summary["training_sentences"] == 14 * 8  # no update skipped
  assert summary["steady_sentences"] == 2 * 8 and summary["steady_time_s"] > 0
  assert ("Throughput Average (sentences/sec) = %.2f (after 10 warm-up steps"
          % summary["throughput"]) in result.stdout, result.stdout[-3000:]


# run_pretraining.run on a stand-in loop whose last update a SIGTERM came during (the loop
# itself ended normally): a stop ends the process, here before the demo's fine-tuning.
_STOPPED_IN_THE_LAST_UPDATE = """
import signal, sys, types
from bert_pretrain import run_pretraining
from bert_pretrain.training import loop

def last_update(cfg, inputs, ranks, device, stop, notes):
  stop.signum = signal.SIGTERM
  return 0

loop.run = last_update
cfg = types.SimpleNamespace(run=types.SimpleNamespace(output_dir="results/demo-1"))
ranks = types.SimpleNamespace(is_chief=False, stop=lambda: None, parts=False,
                              part=lambda status: None)
stop = types.SimpleNamespace(requested=True, signum=0, disarm=lambda when: None)
then = sys.argv[1] if len(sys.argv) > 1 else None
sys.exit(run_pretraining.run(cfg, None, ranks, None, stop, [], then))
"""


@pytest.mark.parametrize("then", [None, "the demo's fine-tuning step"])
def test_a_stop_during_the_last_update_says_that_it_skips_the_fine_tuning(then):
  result = subprocess.run([sys.executable, "-c", _STOPPED_IN_THE_LAST_UPDATE] +
                          ([then] if then else []), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
  if then is None:  # nothing follows the training: the run is complete
    assert (result.returncode, result.stdout) == (0, ""), result.stderr[-3000:]
    return
  assert result.returncode == 143, result.stderr[-3000:]
  assert result.stdout == (
      "SIGTERM: the training is complete; the demo's fine-tuning step is skipped: run the "
      "same command with --output_dir=results/demo-1 to run it\n")


def test_conformance_with_the_demos_command_line_checks_the_demos_model_on_its_records(
    short_demo_run):
  cache = short_demo_run["cache"]
  result = subprocess.run(
      [sys.executable, "-m", "bert_pretrain.conformance", "--preset=demo",
       "--demo_cache_dir=" + cache, "--train_batch_size=8"], stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  # The preset's lengths and precision, as the demo's run computes.
  assert ("conformance: batch: the first 8 records of %s: 8 x %d, "
          % (os.path.join(cache, "train"), config.PRESETS["demo"]["max_seq_length"])
          in result.stdout)
  assert "conformance: weights: %s" % os.path.join(cache, "init", "model.ckpt-0") in result.stdout
  assert AMP_ON_THIS_CPU in result.stdout
  assert "conformance: PASS" in result.stdout


def test_the_anchors_eval_checkpoint_path_names_the_checkpoint_a_demo_evaluates(
    short_demo_run, tmp_path):
  trained = os.path.join(short_demo_run["output_dir"], "model.ckpt-2")
  for (path, status, line) in (
      (trained, 0, "Loaded 46 of 46 model variables from %s" % trained),
      (str(tmp_path / "missing" / "model.ckpt-9"), 2, "no checkpoint there")):
    result = subprocess.run(
        [sys.executable, "-m", "bert_pretrain.run_pretraining", "--preset=demo",
         "--demo_cache_dir=" + short_demo_run["cache"], "--noamp", "--nodo_train",
         "--eval_checkpoint_path=" + path, "--output_dir=" + str(tmp_path / "eval"),
         "--nodraw_report", "--intra_op_threads=1", "--max_eval_steps=2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
        timeout=300, env=tool_env())
    assert result.returncode == status, result.stdout[-3000:]
    assert line in result.stdout, result.stdout[-3000:]


def test_the_downstream_step_prints_the_baseline_and_both_word_order_accuracies(
    short_demo_run, monkeypatch):
  # A few updates each: the lines, not the accuracies, are under test here.
  monkeypatch.setitem(demo.FINETUNE_FLAGS, "num_train_epochs", 0.03)
  lines = []
  accuracy = demo.finetune(short_demo_run["cache"], short_demo_run["output_dir"],
                           log=lines.append)
  demo_lines = [line for line in lines if line.startswith("demo: ")]
  with open(os.path.join(short_demo_run["output_dir"], "eval_results.txt")) as f:
    results = dict(line.strip().split(" = ") for line in f)
  token, share, _ = demo.most_frequent_token(short_demo_run["paths"]["eval_files_dir"])
  vocab = open(short_demo_run["paths"]["vocab_file"], encoding="utf-8").read().splitlines()
  assert demo_lines[0] == (
      "demo: masked-LM accuracy on held-out documents: %.4f after 2 updates; predicting the "
      "most frequent token (\"%s\") at every masked position: %.4f"
      % (float(results["masked_lm_accuracy"]), vocab[token], share))
  task = read_task(os.path.join(short_demo_run["cache"], "word_order"))
  assert demo_lines[1] == (
      "demo: downstream task: is a sentence as written or are its words shuffled; %d "
      "training sentences, %d from held-out documents" % (len(task["train"]),
                                                          len(task["dev"])))
  assert [line.split(": python3 -m bert_pretrain.run_classifier --", 1)[0]
          for line in demo_lines[2:4]] == [
      "demo: fine-tuning from %s" % os.path.join(short_demo_run["output_dir"],
                                                 "model.ckpt-2"),
      "demo: fine-tuning from random weights"]
  dev_labels = collections.Counter(label for _, label in task["dev"])
  majority = max(dev_labels.values()) / float(len(task["dev"]))
  assert demo_lines[4] == (
      "demo: word-order accuracy on held-out documents: %.3f fine-tuned from the pretrained "
      "checkpoint, %.3f from random weights (the most frequent label alone: %.3f)"
      % (accuracy["pretrained"], accuracy["random"], majority))
  # After 2 updates of pretraining the fine-tune may well stay near chance: said if so,
  # and why.
  masked_lm = (float(results["masked_lm_accuracy"]), share, "2")
  assert demo_lines[5:] == [line for line in [demo.near_chance_line(
      accuracy["pretrained"], majority, masked_lm)] if line], demo_lines
  assert re.search(r"^  accuracy = [\d.]+$", "\n".join(lines), re.M)
  for name in ("finetune-model.ckpt-2", "finetune-random"):
    assert os.path.isfile(os.path.join(short_demo_run["output_dir"], name,
                                       "eval_results.txt"))


def test_a_fine_tune_near_chance_blames_a_pretraining_that_learned_nothing_else_the_seed():
  short = (0.0556, 0.0556, "100")  # the most frequent token's accuracy, after 100 updates
  assert demo.near_chance_line(0.52, 0.515, short) == (
      "demo: the fine-tune from the pretrained checkpoint stayed near chance, as the "
      "pretraining did: its masked-LM accuracy 0.0556 after 100 updates is no better than "
      "the most frequent token's 0.0556; train longer (--num_train_steps; the demo's preset "
      "trains 500 updates)")
  trained = (0.0928, 0.0556, "500")
  assert demo.near_chance_line(0.506, 0.515, trained).startswith(
      "demo: this time the fine-tune from the pretrained checkpoint stayed near chance, as "
      "it does for some seeds of this small model")
  assert demo.near_chance_line(0.506, 0.515, None).startswith("demo: this time")
  for masked_lm in (short, trained, None):
    assert demo.near_chance_line(0.812, 0.515, masked_lm) is None


def test_fine_tuning_a_run_again_takes_the_cache_its_first_fine_tune_read(tmp_path):
  """A run made with another --demo_cache_dir: `demo --finetune_from=RUN` alone fine-tunes
  from that cache, not from ./demo_cache built anew (whose task its fine-tunes refuse)."""
  run = tmp_path / "results" / "demo-1"
  (run / "finetune-random").mkdir(parents=True)
  assert demo.run_cache_dir(str(run)) is None  # no fine-tune yet: the flag's default
  task = tmp_path / "other_cache" / "word_order"
  checkpoints.write_run_marker(str(run / "finetune-random"),
                               {"tool": "run_classifier", "data_dir": str(task)})
  assert demo.run_cache_dir(str(run)) is None  # the cache is gone
  task.mkdir(parents=True)
  assert demo.run_cache_dir(str(run)) == str(tmp_path / "other_cache")


def test_fine_tuning_a_run_again_takes_demo_finetune_epochs_and_names_an_earlier_fine_tune(
    short_demo_run, tmp_path):
  run = tmp_path / "demo-run"
  shutil.copytree(short_demo_run["output_dir"], str(run))
  for name in os.listdir(str(run)):
    if name.startswith("finetune-"):
      shutil.rmtree(str(run / name))

  def finetune_from(epochs):
    return subprocess.run(
        [sys.executable, "-m", "bert_pretrain.demo", "--finetune_from=%s" % run,
         "--demo_cache_dir=" + short_demo_run["cache"], "--demo_finetune_epochs=%g" % epochs],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=600,
        cwd=ROOT, env=tool_env())
  first = finetune_from(0.05)
  assert first.returncode == 0, first.stderr[-3000:]
  assert "--num_train_epochs=0.05 " in first.stdout
  other = finetune_from(0.1)
  assert other.returncode == 2
  assert other.stderr.strip().endswith(
      "(an earlier fine-tune is in %s: pass the --demo_finetune_epochs it was run with, or "
      "move it away)" % (run / "finetune-model.ckpt-2")), other.stderr
  none = finetune_from(0)
  assert (none.returncode, none.stderr) == (2, (
      "demo: error: --demo_finetune_epochs=0 leaves --finetune_from nothing to do; pass a "
      "positive number of epochs (default 3)\n"))


def _listing(folder):
  """Every path under folder with its size, to tell that nothing was written there."""
  return sorted((os.path.relpath(os.path.join(root, name), folder),
                 os.path.getsize(os.path.join(root, name)))
                for root, _, names in os.walk(folder) for name in names)


def test_fine_tuning_from_a_folder_that_is_not_a_pretraining_run_is_an_error_writing_nothing(
    short_demo_run, tmp_path):
  cache, paths = short_demo_run["cache"], short_demo_run["paths"]
  # A fine-tune run_classifier wrote: a checkpoint and a run marker of its own.
  demo.write_word_order_task(str(tmp_path / "task"))
  classifier = str(tmp_path / "classifier")
  values = dict(demo.FINETUNE_FLAGS, data_dir=str(tmp_path / "task"), output_dir=classifier,
                bert_config_file=paths["bert_config_file"], vocab_file=paths["vocab_file"],
                num_train_epochs=0.01,
                init_checkpoint=os.path.join(short_demo_run["output_dir"], "model.ckpt-2"))
  env = tool_env()
  trained = subprocess.run([sys.executable, "-m", "bert_pretrain.run_classifier"] + [
      "--%s=%s" % item for item in sorted(values.items())], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True, env=env,
                           timeout=300)
  assert trained.returncode == 0, trained.stdout[-3000:]
  fix = "; pass the --output_dir of the demo's pretraining run (results/demo-<time>)"
  for folder, problem in (
      (classifier, "holds a fine-tune of run_classifier, not a pretraining run"),
      # The lock file of the cache is no run's.
      (cache, "holds neither a checkpoint nor a pretraining run"),
      (os.path.dirname(paths["init_checkpoint"]), "holds a checkpoint but no pretraining run "
       "(no bert_pretrain_run.json or dllog.json)")):
    before = _listing(folder)
    result = subprocess.run(
        [sys.executable, "-m", "bert_pretrain.demo", "--demo_cache_dir=" + cache,
         "--finetune_from=" + folder], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, env=env, timeout=300)
    assert result.returncode == 2, result.stdout[-3000:]
    assert result.stderr == "demo: error: --finetune_from=%s %s%s\n" % (folder, problem, fix)
    assert _listing(folder) == before


@pytest.mark.parametrize("tool,sig,status,said", [
    ("demo", signal.SIGINT, 130, "demo: interrupted; run the same command again (what it "
     "finished building is kept)"),
    ("demo", signal.SIGTERM, 143, "demo: terminated (SIGTERM); run the same command again "
     "(what it finished building is kept)"),
    ("conformance", signal.SIGINT, 130, "conformance: interrupted; it writes nothing (the "
     "demo's cache keeps what it finished); run the same command again")])
def test_a_stop_while_the_demo_builds_its_cache_is_one_line_and_keeps_what_it_built(
    tmp_path, tool, sig, status, said):
  cache = tmp_path / "cache"
  proc = subprocess.Popen([sys.executable, "-m", "bert_pretrain." + tool,
                           "--demo_cache_dir=%s" % cache] +
                          (["--preset=demo"] if tool == "conformance" else []),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
  try:
    assert proc.stdout.readline().startswith("demo: building a ")  # the vocab, seconds long
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == status, err[-3000:]
  assert err.splitlines()[-1] == said, err[-3000:]
  assert "Traceback" not in err
  assert not (cache / "vocab.txt").exists()  # written whole or not at all
