"""The embedded default: everything a pretraining run needs, built from the shipped corpus.

`bash run_1card_FPS.sh` without --input_files_dir is the demo: run_pretraining, given a
script's preset and no --input_files_dir (or --preset=demo), calls set_up_run, which
builds what is missing in --demo_cache_dir and fills the run's data flags and a new
output_dir. From bert_pretrain/demo_data/corpus.txt (public-domain books, see SOURCE.md)
it builds, only what is not there yet:

  vocab.txt            a WordPiece vocab trained on the corpus
  train/, eval/        TFRecords (max_seq_length 128, 20 predictions); the eval set is
                       made from held-out documents, never seen in training
  bert_config.json     a small BERT (2 layers, hidden 128)
  init/model.ckpt-0    a fresh checkpoint of it, the run's --init_checkpoint
  train_packed/        with --enable_packed_data_mode (prepare's packed): the training records
                       packed by bert_pretrain.pack_records, up to 3 sequences a record,
                       which the run then trains on

Each artefact is written under a temporary name and renamed when complete, so an
interrupted preparation is redone, never half-used; the cache is built under a lock, so a
second demo started meanwhile (or another rank) waits and then finds it built.

After a run of one process, run_pretraining calls finetune, the downstream step. It
first prints the run's masked-LM accuracy beside what predicting the most frequent token
everywhere scores on the same eval set; then it fine-tunes run_classifier on word order:
is a sentence as written, or are its words shuffled (word_order/train.tsv,
word_order/dev.tsv, the held-out documents). A bag of words cannot tell the two apart,
so the task needs what pretraining learns about word order; it is fine-tuned from the
run's checkpoint and from random weights, both accuracies printed side by side.

As a command, `python3 -m bert_pretrain.demo` builds the cache (--demo_cache_dir); with
--finetune_from=OUTPUT_DIR it runs the downstream step on a pretraining run.
"""

import collections
import functools
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time

from absl import flags
from absl import logging
import tensorflow.compat.v1 as tf

from bert_pretrain.training import checkpoints
from bert_pretrain import config
from bert_pretrain import create_pretraining_data
from bert_pretrain import errors
from bert_pretrain.data import input_pipeline
from bert_pretrain.distributed import launch
from bert_pretrain.distributed import ranks
from bert_pretrain.model import modeling
from bert_pretrain import pack_records
from bert_pretrain import processes
from bert_pretrain.training import pretraining
from bert_pretrain.data import records
from bert_pretrain.data import tokenization
from bert_pretrain.wiki import workdir

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_data", "corpus.txt")

# The demo's model and data settings, in one place. run_1card_FPS.sh passes the same
# sequence lengths to run_pretraining.
DEMO_CONFIG = {
    "vocab_size": 4096,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 512,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
}
MAX_SEQ_LENGTH = config.PRESETS["demo"]["max_seq_length"]
MAX_PREDICTIONS_PER_SEQ = config.PRESETS["demo"]["max_predictions_per_seq"]
EVAL_DOCUMENT_FRACTION = 0.1
NUM_TRAIN_FILES = 4


# The downstream step: is a sentence as written (label "original") or are its words
# shuffled ("shuffled"), half of them at random. Not which book a passage comes from:
# random weights learn that from the words alone as well as the pretrained model
# (docs/performance.md). A sentence gives its first WORD_ORDER_MAX_WORDS words, which fit
# max_seq_length but for a rare few; shorter than WORD_ORDER_MIN_WORDS it is left out.
WORD_ORDER_LABELS = ("original", "shuffled")
WORD_ORDER_MIN_WORDS = 6
WORD_ORDER_MAX_WORDS = 30
WORD_ORDER_SEED = 12345
# A fine-tune from the pretrained checkpoint less than this above the most frequent
# label's accuracy stayed near chance (some pretraining seeds).
CHANCE_MARGIN = 0.1
# A masked-LM accuracy less than this above the most frequent token's learned nothing yet
# (too few updates), whatever the seed.
MASKED_LM_MARGIN = 0.01
# Fine-tuned with these run_classifier flags, once from the pretrained checkpoint and once
# from random weights.
FINETUNE_FLAGS = {
    "task_name": "tsv",
    "max_seq_length": 64,
    "train_batch_size": 32,
    "eval_batch_size": 64,
    "learning_rate": 2e-4,  # why not 1e-4: docs/performance.md, The demo
    "num_train_epochs": config.default(config.Demo, "demo_finetune_epochs"),
    "display_loss_steps": 25,
    "seed": 12345,
}

FLAGS = flags.FLAGS


def define_flags():
  """The flags of `python3 -m bert_pretrain.demo` (not of the runs that import this)."""
  config.define_flags([config.Demo])  # --demo_cache_dir, --demo_finetune_epochs
  flags.DEFINE_string("finetune_from", None, "The downstream step: the output_dir of the "
                      "demo's pretraining run, whose checkpoint is fine-tuned to tell "
                      "sentences from their words shuffled (and random weights beside it).")
  flags.DEFINE_string("finetune_bert_config_file", None, "With --finetune_from: the run's "
                      "--bert_config_file (default: the demo's).")
  flags.DEFINE_string("finetune_vocab_file", None, "With --finetune_from: the run's "
                      "--vocab_file (default: the demo's).")


def read_documents(path):
  """Returns the documents of a text file: lists of sentences split by blank lines."""
  documents, current = [], []
  with open(path, encoding="utf-8") as f:
    for line in f:
      line = line.strip()
      if line:
        current.append(line)
      elif current:
        documents.append(current)
        current = []
  if current:
    documents.append(current)
  return documents


def is_held_out(document_index):
  """Held-out documents (every 10th) make the eval sets, the rest the training sets."""
  step = int(round(1 / EVAL_DOCUMENT_FRACTION))
  return document_index % step == step - 1


def write_documents(documents, path):
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(doc) for doc in documents) + "\n")


def say(line):
  """The demo's lines, flushed at once: a pipe (tee) shows each before the minutes that
  follow it."""
  print(line, flush=True)


def prepare(cache_dir, log=say, packed=False):
  """Builds whatever of the demo artefacts is missing in cache_dir (under its lock: another
  demo building it meanwhile is waited for); returns their paths. packed: the training
  records packed too (<cache_dir>/train_packed), which input_files_dir then names."""
  if not os.path.exists(CORPUS):
    raise ValueError("the demo corpus %s is missing; restore it with git checkout" % CORPUS)
  os.makedirs(cache_dir, exist_ok=True)
  lock = checkpoints.OutputDirLock(cache_dir)
  try:
    lock.acquire()
  except ValueError:
    log("demo: %s is in use (another demo, or another rank of this one, checks or builds "
        "it); waiting for it" % cache_dir)
    lock.acquire(wait=True)
  try:
    paths = _prepare(cache_dir, log)
    if packed:
      folder = os.path.join(cache_dir, "train_packed")
      summary = pack_records.pack(paths["input_files_dir"], folder, jobs=1)
      if not summary["done_before"]:
        log("demo: " + pack_records.summary_line(summary, folder))
      paths["input_files_dir"] = folder
    return paths
  finally:
    lock.release()


def _prepare(cache_dir, log):
  """prepare's work, under the lock."""
  paths = {
      "vocab_file": os.path.join(cache_dir, "vocab.txt"),
      "input_files_dir": os.path.join(cache_dir, "train"),
      "eval_files_dir": os.path.join(cache_dir, "eval"),
      "bert_config_file": os.path.join(cache_dir, "bert_config.json"),
      "init_checkpoint": os.path.join(cache_dir, "init", "model.ckpt-0"),
  }

  documents = read_documents(CORPUS)
  eval_docs = [d for i, d in enumerate(documents) if is_held_out(i)]
  train_docs = [d for i, d in enumerate(documents) if not is_held_out(i)]
  text_dir = os.path.join(cache_dir, "text")
  os.makedirs(text_dir, exist_ok=True)
  train_text = os.path.join(text_dir, "train.txt")
  eval_text = os.path.join(text_dir, "eval.txt")
  write_documents(train_docs, train_text)
  write_documents(eval_docs, eval_text)

  if not os.path.exists(paths["vocab_file"]):
    log("demo: building a %d-token WordPiece vocab from %s" % (DEMO_CONFIG["vocab_size"], CORPUS))
    tokenization.build_wordpiece_vocab([train_text], DEMO_CONFIG["vocab_size"],
                                       paths["vocab_file"] + ".tmp")
    os.rename(paths["vocab_file"] + ".tmp", paths["vocab_file"])

  for name, text, num_files, dupe_factor, seed in (
      ("input_files_dir", train_text, NUM_TRAIN_FILES, 5, 12345),
      ("eval_files_dir", eval_text, 1, 5, 54321)):
    folder = paths[name]
    if os.path.isdir(folder):
      continue
    log("demo: writing TFRecords to %s" % folder)
    tmp_folder = folder + ".tmp"
    shutil.rmtree(tmp_folder, ignore_errors=True)
    os.makedirs(tmp_folder)
    outputs = [os.path.join(tmp_folder, "part-%05d-of-%05d" % (i, num_files))
               for i in range(num_files)]
    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.WARNING)  # the line below says what it wrote
    try:
      stats = create_pretraining_data.create_pretraining_data(
          [text], outputs, paths["vocab_file"], do_lower_case=True,
          max_seq_length=MAX_SEQ_LENGTH, max_predictions_per_seq=MAX_PREDICTIONS_PER_SEQ,
          dupe_factor=dupe_factor, random_seed=seed)
    finally:
      logging.set_verbosity(verbosity)
    log("demo: %d documents -> %d instances" % (stats["num_documents"], stats["num_instances"]))
    os.rename(tmp_folder, folder)

  if not os.path.exists(paths["bert_config_file"]):
    with open(paths["bert_config_file"] + ".tmp", "w") as f:
      json.dump(DEMO_CONFIG, f, indent=2, sort_keys=True)
    os.rename(paths["bert_config_file"] + ".tmp", paths["bert_config_file"])

  if not tf.gfile.Exists(paths["init_checkpoint"] + ".index"):
    log("demo: writing a freshly initialized checkpoint %s" % paths["init_checkpoint"])
    write_fresh_checkpoint(modeling.BertConfig.from_dict(DEMO_CONFIG), paths["init_checkpoint"])
  return paths


def write_fresh_checkpoint(bert_config, prefix, seed=12345):
  """Saves a randomly initialized BERT with its pretraining heads at `prefix`."""
  with tf.Graph().as_default():
    tf.set_random_seed(seed)
    features = input_pipeline.constant_features(1, MAX_SEQ_LENGTH, MAX_PREDICTIONS_PER_SEQ)
    pretraining.build_model(bert_config, features, False, tf.float32)
    saver = tf.train.Saver(tf.trainable_variables())
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      tmp_dir = os.path.dirname(prefix) + ".tmp"
      shutil.rmtree(tmp_dir, ignore_errors=True)
      saver.save(sess, os.path.join(tmp_dir, os.path.basename(prefix)), write_meta_graph=False)
  shutil.rmtree(os.path.dirname(prefix), ignore_errors=True)
  os.rename(tmp_dir, os.path.dirname(prefix))


def write_word_order_task(folder):
  """Writes the downstream task as a plain TSV task in folder (train.tsv, dev.tsv): each
  sentence of the corpus (its first WORD_ORDER_MAX_WORDS words) labelled "original", or,
  chosen at random (always the same), its words shuffled and labelled "shuffled"; dev.tsv
  holds the sentences of the held-out documents (those of the pretraining eval set).

  Returns:
    (train examples, dev examples, the share of the dev set's most frequent label).
  """
  rng = random.Random(WORD_ORDER_SEED)
  splits = {"train": [], "dev": []}
  for i, document in enumerate(read_documents(CORPUS)):
    for sentence in document:
      words = sentence.split()[:WORD_ORDER_MAX_WORDS]
      if len(words) < WORD_ORDER_MIN_WORDS:
        continue
      label = rng.choice(WORD_ORDER_LABELS)
      if label == "shuffled":
        original = list(words)
        while words == original:  # Six words or more: another order comes soon.
          rng.shuffle(words)
      splits["dev" if is_held_out(i) else "train"].append("%s\t%s" % (" ".join(words), label))
  os.makedirs(folder, exist_ok=True)
  for split, lines in splits.items():
    # A name per process: two demos at once each write the same file whole.
    temporary = os.path.join(folder, "%s.tsv.tmp-%d" % (split, os.getpid()))
    with open(temporary, "w", encoding="utf-8") as f:
      f.write("".join(line + "\n" for line in lines))
    os.replace(temporary, os.path.join(folder, split + ".tsv"))
  dev_labels = collections.Counter(line.rsplit("\t", 1)[1] for line in splits["dev"])
  majority = max(dev_labels.values()) / float(len(splits["dev"]))
  return len(splits["train"]), len(splits["dev"]), majority


def most_frequent_token(eval_files_dir):
  """What predicting one token at every masked position scores on an eval set: the token
  the eval set masks most often (the baseline a masked-LM accuracy must beat).

  Args:
    eval_files_dir: a folder of pretraining TFRecords (records.FEATURES).

  Returns:
    (token id, its share of the masked positions, sequences read); the positions are
    those of masked_lm_weight 1, as the masked-LM accuracy counts them.
  """
  counts = collections.Counter()
  sequences = 0
  for path in input_pipeline.list_record_files(eval_files_dir, "--eval_files_dir"):
    offsets, problem = records.record_offsets(path)
    if problem:
      raise ValueError("%s is %s; delete the demo's eval folder to have it made again"
                       % (path, problem))
    for _, _, serialized in records.read_records(path, offsets):
      values = records.parse_example(serialized)
      sequences += 1
      for token, weight in zip(values["masked_lm_ids"], values["masked_lm_weights"]):
        counts[int(token)] += float(weight)
  token, count = counts.most_common(1)[0]
  return token, count / sum(counts.values()), sequences


def log_masked_lm_baseline(pretrained_dir, eval_files_dir, vocab_file, log):
  """Logs the run's last masked-LM accuracy (its eval_results.txt) beside what the most
  frequent token of the eval set scores, in one line. Returns (the run's accuracy, the
  most frequent token's, the run's step), or None when the run has no evaluation."""
  token, share, sequences = most_frequent_token(eval_files_dir)
  vocab = {i: t for t, i in tokenization.load_vocab(vocab_file).items()}
  baseline = "predicting the most frequent token (%s) at every masked position: %.4f" % (
      json.dumps(vocab.get(token, str(token)), ensure_ascii=False), share)
  path = os.path.join(pretrained_dir, "eval_results.txt")
  results = {}
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      results = dict(line.strip().split(" = ") for line in f if " = " in line)
  if "masked_lm_accuracy" not in results:
    log("demo: %s has no evaluation; on the demo's eval set %s" % (pretrained_dir, baseline))
    return None
  other = ""
  if int(float(results.get("eval_samples", sequences))) != sequences:
    other = " (the run evaluated %s of the %d sequences)" % (results["eval_samples"],
                                                            sequences)
  accuracy, step = float(results["masked_lm_accuracy"]), results.get("global_step", "?")
  log("demo: masked-LM accuracy on held-out documents: %.4f after %s updates; %s%s"
      % (accuracy, step, baseline, other))
  return accuracy, share, step


def finetune(cache_dir, pretrained_dir, model_files=None, log=say, epochs=None,
             known_run=False):
  """The downstream step: logs the run's masked-LM accuracy beside the most frequent
  token's, fine-tunes the latest checkpoint in pretrained_dir on the word-order task,
  then the same model from random weights, and prints both dev accuracies.

  Args:
    cache_dir: the demo's artefacts.
    pretrained_dir: the pretraining run's output_dir.
    model_files: (optional) dict with the bert_config_file and vocab_file the run used
      (default: the demo's).
    log: function taking a line.
    epochs: fine-tuning epochs (default: FINETUNE_FLAGS').
    known_run: pretrained_dir is the run that just ended (run_pretraining's call), not a
      folder to tell a run by its files: one with --dllog_path elsewhere that saved
      nothing holds neither log nor run marker.

  Returns:
    dict: "pretrained" and "random" -> dev accuracy; None when pretrained_dir holds no
    checkpoint (a run with --nodo_train).

  Raises:
    ValueError: pretrained_dir is not a pretraining run (a fine-tune's folder, the
      demo's cache...): nothing is written there.
  """
  if not os.path.isdir(pretrained_dir):
    raise ValueError("--finetune_from=%s does not exist; pass the --output_dir of the demo's "
                     "pretraining run (results/demo-<time>)" % pretrained_dir)
  # A pretraining run leaves its log and, once it saved, a run marker naming no other
  # tool; the lock file alone does not tell (the demo's cache holds one too), nor a
  # checkpoint (a fine-tune's, or the cache's initial one), and the fine-tunes would be
  # written into the folder.
  marker = checkpoints.read_run_marker(pretrained_dir)
  if marker is not None and marker.get("tool", "run_pretraining") != "run_pretraining":
    raise ValueError("--finetune_from=%s holds a fine-tune of %s, not a pretraining run; "
                     "pass the --output_dir of the demo's pretraining run "
                     "(results/demo-<time>)" % (pretrained_dir, marker["tool"]))
  is_run = known_run or marker is not None or os.path.isfile(
      os.path.join(pretrained_dir, "dllog.json"))
  has_checkpoint = bool(checkpoints.index_files(pretrained_dir))
  if not is_run:
    raise ValueError("--finetune_from=%s %s; pass the --output_dir of the demo's pretraining "
                     "run (results/demo-<time>)" % (pretrained_dir, (
                         "holds a checkpoint but no pretraining run (no %s or dllog.json)"
                         % checkpoints.RUN_MARKER) if has_checkpoint else
                     "holds neither a checkpoint nor a pretraining run"))
  if not has_checkpoint:
    log("demo: no checkpoint in %s (an evaluation-only run?): no downstream step"
        % pretrained_dir)
    return None
  paths = prepare(cache_dir, log=log)
  paths.update(model_files or {})
  checkpoint = checkpoints.resolve_checkpoint(pretrained_dir, "--finetune_from")
  masked_lm = log_masked_lm_baseline(pretrained_dir, paths["eval_files_dir"],
                                     paths["vocab_file"], log)
  task_dir = os.path.join(cache_dir, "word_order")
  num_train, num_dev, majority = write_word_order_task(task_dir)
  log("demo: downstream task: is a sentence as written or are its words shuffled; %d "
      "training sentences, %d from held-out documents" % (num_train, num_dev))
  accuracy = {}
  for start, init in (("pretrained", checkpoint), ("random", None)):
    # Named by the checkpoint: a run resumed to more steps fine-tunes its newer one anew.
    output_dir = os.path.join(pretrained_dir, "finetune-" + (
        os.path.basename(init) if init else "random"))
    values = dict(FINETUNE_FLAGS, data_dir=task_dir, output_dir=output_dir,
                  bert_config_file=paths["bert_config_file"], vocab_file=paths["vocab_file"])
    if epochs is not None:
      values["num_train_epochs"] = epochs
    if init:
      values["init_checkpoint"] = init
    command = [sys.executable, "-m", "bert_pretrain.run_classifier"] + [
        "--%s=%s" % item for item in sorted(values.items())]
    log("demo: fine-tuning from %s: %s" % (init or "random weights", " ".join(
        ["python3"] + [shlex.quote(word) for word in command[1:]])))
    earlier = os.path.isdir(output_dir)
    # The trainer ends with the demo's process (a demo stopped by a signal leaves none).
    def shown(line):  # as the trainer prints them
      if line.startswith(("Step ", "Throughput", "Loaded", "  accuracy")):
        log("  " + line.strip())
    finished = processes.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True, on_line=shown,
                             preexec_fn=functools.partial(processes.end_with_parent,
                                                          os.getpid()))
    if finished.returncode != 0:
      raise ValueError("fine-tuning from %s failed (exit %d): %s%s" % (
          init or "random weights", finished.returncode,
          finished.stdout.strip().splitlines()[-1] if finished.stdout.strip() else "",
          " (an earlier fine-tune is in %s: pass the --demo_finetune_epochs it was run "
          "with, or move it away)" % output_dir if earlier else ""))
    with open(os.path.join(output_dir, "eval_results.txt"), encoding="utf-8") as f:
      results = dict(line.strip().split(" = ") for line in f if " = " in line)
    accuracy[start] = float(results["accuracy"])
  log("demo: word-order accuracy on held-out documents: %.3f fine-tuned from the pretrained "
      "checkpoint, %.3f from random weights (the most frequent label alone: %.3f)"
      % (accuracy["pretrained"], accuracy["random"], majority))
  line = near_chance_line(accuracy["pretrained"], majority, masked_lm)
  if line:
    log(line)
  return accuracy


def near_chance_line(finetuned, majority, masked_lm):
  """The line saying why the fine-tune from the pretrained checkpoint (accuracy
  `finetuned`) stayed near the most frequent label's (`majority`), or None when it did
  not. masked_lm: log_masked_lm_baseline's (accuracy, most frequent token's, step), or
  None."""
  if finetuned >= majority + CHANCE_MARGIN:
    return None
  if masked_lm and masked_lm[0] < masked_lm[1] + MASKED_LM_MARGIN:
    return ("demo: the fine-tune from the pretrained checkpoint stayed near chance, as the "
            "pretraining did: its masked-LM accuracy %.4f after %s updates is no better than "
            "the most frequent token's %.4f; train longer (--num_train_steps; the demo's "
            "preset trains %d updates)"
            % (masked_lm[0], masked_lm[2], masked_lm[1],
               config.PRESETS["demo"]["num_train_steps"]))
  return ("demo: this time the fine-tune from the pretrained checkpoint stayed near chance, "
          "as it does for some seeds of this small model (docs/running.md, The demo); the "
          "masked-LM accuracy above is the pretraining's result; a new demo draws another seed")


def set_up_run(flag_values, log=say):
  """Fills the demo run's flags that the command line did not give: the data, vocab,
  config and initial checkpoint of the cache (--demo_cache_dir, built where missing; the
  training records packed with --enable_packed_data_mode) and a new output_dir, one
  for all the processes of a launch.

  Returns:
    the folder it made for the run, None if it was given one (remove_unused).

  Raises:
    ValueError: several processes not started by the multi-card script, and no
      --output_dir (each would make a folder of its own).
  """
  if flag_values.demo_finetune_epochs < 0:
    raise ValueError("--demo_finetune_epochs=%g must not be negative; pass 0 for no "
                     "fine-tuning step" % flag_values.demo_finetune_epochs)
  size = ranks.launcher_size()
  if ranks.launcher_rank() not in (None, 0):
    log = lambda line: None  # rank 0 tells; the others wait for the cache it builds
  output_dir = None
  if not flag_values["output_dir"].present:
    launch_id = os.environ.get(launch.LAUNCH_ID_VARIABLE)
    if size > 1 and not launch_id:
      raise ValueError("a demo of several processes needs one folder for all; pass "
                       "--output_dir=results/demo-mine, or start it with run_multi_card_FPS.sh")
    output_dir = os.path.join("results", "demo-" + launch_id) if size > 1 else None
  cache_dir = flag_values.demo_cache_dir
  log("No --input_files_dir: running the embedded demo (artefacts in %s)" % cache_dir)
  paths = prepare(cache_dir, log=log, packed=flag_values.enable_packed_data_mode)
  if not flag_values["output_dir"].present:
    if output_dir:
      os.makedirs(output_dir, exist_ok=True)
    paths["output_dir"] = output_dir or new_output_dir()
  for name, value in paths.items():
    if not flag_values[name].present:
      setattr(flag_values, name, value)
  return None if flag_values["output_dir"].present else paths["output_dir"]


def remove_unused(folder):
  """Removes `folder` (set_up_run's) if it is still empty: the run refused its flags."""
  try:
    if folder:
      os.rmdir(folder)
  except OSError:  # something was written there, or another rank removed it
    pass


def new_output_dir(root="results"):
  """Makes and returns a new folder root/demo-<time> (-2, -3, ... after it when taken),
  so that two demos started in the same second train in folders of their own."""
  stem = os.path.join(root, "demo-" + time.strftime("%Y%m%d-%H%M%S"))
  os.makedirs(root, exist_ok=True)
  number = 1
  while True:
    path = stem if number == 1 else "%s-%d" % (stem, number)
    try:
      os.mkdir(path)
      return path
    except FileExistsError:
      number += 1


def run_cache_dir(pretrained_dir):
  """The cache a run's earlier fine-tune took its task from (its run marker's data_dir,
  <cache>/word_order), if it is still there: a run made with another --demo_cache_dir
  fine-tunes again from that one, not from a cache built anew."""
  try:
    marker = checkpoints.read_run_marker(os.path.join(pretrained_dir, "finetune-random"))
  except ValueError:  # damaged: the fine-tune says so itself
    return None
  data_dir = (marker or {}).get("data_dir")
  if not data_dir or not os.path.isdir(data_dir):
    return None
  return os.path.dirname(data_dir)


def main(argv):
  del argv
  tf.logging.set_verbosity(tf.logging.ERROR)
  tf.disable_v2_behavior()
  errors.take_stop_signals()
  try:
    if not FLAGS["finetune_from"].present:
      paths = prepare(FLAGS.demo_cache_dir, log=say)
      print("demo: the cache is ready: %s" % ", ".join(
          "--%s=%s" % item for item in sorted(paths.items())))
      return 0
    if not FLAGS.finetune_from:
      raise ValueError("--finetune_from is empty; pass the pretraining run's output_dir")
    if not FLAGS.demo_finetune_epochs > 0:
      raise ValueError("--demo_finetune_epochs=%g leaves --finetune_from nothing to do; pass "
                       "a positive number of epochs (default %g)" % (
                           FLAGS.demo_finetune_epochs,
                           config.default(config.Demo, "demo_finetune_epochs")))
    cache_dir = FLAGS.demo_cache_dir
    if not FLAGS["demo_cache_dir"].present:
      cache_dir = run_cache_dir(FLAGS.finetune_from) or cache_dir
    finetune(cache_dir, FLAGS.finetune_from,
             {k: getattr(FLAGS, "finetune_" + k) for k in ("bert_config_file", "vocab_file")
              if getattr(FLAGS, "finetune_" + k)}, epochs=FLAGS.demo_finetune_epochs)
    return 0
  except (ValueError, workdir.PrepareError) as e:
    errors.print_error("demo", e)
    return 2
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM's errors.Terminated
    return errors.stopped_by_signal("demo", e, "run the same command again (%s)" % (
        "a fine-tune stopped before its end starts over" if FLAGS["finetune_from"].present
        else "what it finished building is kept"))
  except (EnvironmentError, tf.errors.OpError) as e:
    if not errors.is_file_error(e):
      raise
    errors.print_error("demo", errors.os_error_message(e))
    return 2


if __name__ == "__main__":
  define_flags()
  errors.run_main("demo", main)
