"""Training-step benchmark of this recipe's BERT on the CPU, side by side with two peers.

  python3 -m bench.benchmark                       # the full table (90 minutes, 2 cores)
  python3 -m bench.benchmark --configs=tiny,base --seq_lengths=128 --skip_peer

(from the repository root; after init_tf.sh, python3 bench/benchmark.py works too)

For each BERT size (tiny .. base), sequence length (128, 512) and precision (fp32, amp =
bfloat16 compute with float32 weights, as run_pretraining --amp_dtype=bfloat16) it
measures, each side in its own subprocess (so the memory and threads are its own), the
sides taking turns for --rounds rounds within the row:

  - our training step, built by bert_pretrain.training.pretraining.build_train_graph as
    run_pretraining builds it (the model, LAMB, the learning-rate schedule, the update
    op), fed by input_pipeline.make_dataset from real TFRecords (its shuffle seeded, so
    every run trains on the same batches), and the same step fed those batches held in
    memory, their timing windows interleaved;
  - our step with --optimizer=adam (AdamWeightDecay instead of LAMB), from TFRecords;
  - Google's: google-research/bert's code (PyPI bert-tensorflow), see google_peer.py;
  - Hugging Face transformers' BertForPreTraining with AdamW in PyTorch, same config,
    batch, sequence length, bf16 autocast for amp;
  - sentences/s (median and range of the timing windows of all rounds, after warm-up),
    model TFLOP/s from an analytic count of the forward + backward FLOPs, MFU against
    the matmul peak this run measures for that precision, the input pipeline's cost, the
    peak RSS of each side, the load average at the start and end of the row;

and whether BERT-Large at sequence 512, batch 1 can take a training step here, and
BERT-Large at 512 in mixed precision in MLPerf's configuration (--mlperf_batch
sequences a micro-batch, accumulated into updates of 64), per core beside Intel's MLPerf
submission. The table
is printed and written to --out_dir (benchmark.md, benchmark.json, benchmark.png), and
a card (bench/card.py) to benchmark_card.json: the environment, each side's config hash,
mean and spread over its timing windows, and the anchors' published rows of the same
configuration.
bench/README.md explains the columns.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import functools
import importlib.util
import itertools
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time

from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
  from bench import card  # python3 -m bench.benchmark, from the repository root
  from bench import google_peer
except ImportError:
  import card  # python3 bench/benchmark.py: bench/ is the script's own folder
  import google_peer
from bert_pretrain import errors
from bert_pretrain.training import timing  # the FLOP count the runs' MFU uses too
from bert_pretrain import processes

CORPUS = os.path.join(ROOT, "bert_pretrain", "demo_data", "corpus.txt")

VOCAB_SIZE = 30522
# name -> (layers, hidden, heads, intermediate), Google's BERT sizes.
CONFIGS = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "medium": (8, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}
# Masked positions per sequence and passes over the corpus for the TFRecords.
PREDICTIONS = {128: 20, 512: 76}
DUPE_FACTOR = {128: 2, 512: 5}
NUM_RECORD_FILES = 4
# Sentences per step of each row: what keeps a step around a second on 2 cores.
BATCH_SIZES = {
    ("tiny", 128): 16, ("tiny", 512): 8,
    ("mini", 128): 16, ("mini", 512): 8,
    ("small", 128): 16, ("small", 512): 4,
    ("medium", 128): 8, ("medium", 512): 4,
    ("base", 128): 8, ("base", 512): 2,
    ("large", 512): 1,
}
LEARNING_RATE = 1e-4
# Our step's seed, as run_pretraining's --seed: the input pipeline's shuffle (every run
# reads the same batches), the initialization and the dropout masks (the seeded masks
# every run_pretraining run draws, not TensorFlow's unseeded ones).
SEED = 12345
# Intel's MLPerf Training v3.0 BERT on Xeon 8480+, BERT-Large at 512 in bfloat16 on AMX:
# about 32 samples/s a 56-core socket (bench/published.json, intel_mlperf_v3.0).
INTEL_SENTENCES_PER_CORE = 32.0 / 56
# The learning-rate schedule decays to 0 at this step; a row runs far fewer.
TRAIN_STEPS = 100000
PEER_HINT = ("HF's peer (Hugging Face BertForPreTraining in PyTorch) skipped: install it "
             "with `pip install torch==2.13.0 transformers`")
RESULT_PREFIX = "BENCH_RESULT "

flags.DEFINE_list("configs", ["tiny", "mini", "small", "medium", "base"],
                  "BERT sizes to run: %s." % ", ".join(n for n in CONFIGS if n != "large"))
flags.DEFINE_list("seq_lengths", ["128", "512"], "Sequence lengths (128 and/or 512).")
flags.DEFINE_list("precisions", ["fp32", "amp"], "fp32 and/or amp (bfloat16 compute).")
flags.DEFINE_integer("steps", 0, "Steps per timing window (0: as many as fill "
                     "--window_seconds and hold --window_sequences).")
flags.DEFINE_integer("windows", 3, "Timing windows per measurement; the median is reported.")
flags.DEFINE_float("window_seconds", 1.0, "Length of a timing window when --steps=0.")
flags.DEFINE_integer("window_sequences", 16, "Sentences a timing window holds at least when "
                     "--steps=0 (our step's time depends on its batches' real tokens).",
                     lower_bound=0)
flags.DEFINE_integer("matmul_size", 4096, "Side of the square matmul that measures the "
                     "machine's peak (large enough to reach it; the tests use a small one).")
flags.DEFINE_integer("warmup_steps", 1, "Steps before timing starts, after the first.")
flags.DEFINE_integer("batch_size", 0, "Sentences per step in every row (0: per-row defaults).")
flags.DEFINE_integer("rounds", 2, "Rounds per row: in each, every side runs once, in its own "
                     "process, the sides taking turns.")
flags.DEFINE_list("optimizers", ["lamb", "adam"], "Optimizers of our step, each a side of "
                  "its own: lamb and/or adam (run_pretraining --optimizer).")
flags.DEFINE_bool("skip_peer", False, "Leave out HF's peer (PyTorch / transformers).")
flags.DEFINE_bool("skip_google", False, "Leave out Google's peer (bert-tensorflow).")
flags.DEFINE_bool("skip_large", False, "Leave out the BERT-Large seq 512 rows (the batch 1 "
                  "check and MLPerf's configuration).")
flags.DEFINE_integer("mlperf_batch", 16, "BERT-Large in MLPerf's configuration: the micro-batch "
                     "(the largest power of two that fits in 24 GiB here).")
flags.DEFINE_integer("mlperf_accumulation", 4, "BERT-Large in MLPerf's configuration: "
                     "micro-batches accumulated into one update (batch x this >= 64).")
flags.DEFINE_integer("intra_threads", 2, "intra_op_parallelism_threads (and torch threads).")
flags.DEFINE_integer("inter_threads", 2, "inter_op_parallelism_threads (run_pretraining's "
                     "default is 2).")
flags.DEFINE_bool("xla", False, "Turn XLA JIT on for our step (run_pretraining --use_xla).")
flags.DEFINE_string("out_dir", os.path.join(ROOT, "bench_results"),
                    "Where the table, its JSON, the chart, the logs and the data go.")
flags.DEFINE_integer("row_timeout", 900, "Seconds one row's subprocess may take.")
# Internal: the subprocess of one row.
flags.DEFINE_enum("worker", None, ["ours", "google", "peer", "peak"],
                  "(internal) run one measurement.")
flags.DEFINE_string("row", None, "(internal) JSON of the row a --worker measures.")
FLAGS = flags.FLAGS


# ---------------------------------------------------------------------------------------
# FLOPs

def train_flops_per_sequence(config, seq_length, predictions, vocab_size=VOCAB_SIZE,
                             tokens=None, tokens_squared=None):
  """Forward + backward FLOPs of one training sequence of our step by part of the model,
  for a size of CONFIGS: training/timing.py's count, which the runs' MFU uses too."""
  layers, hidden, _, intermediate = CONFIGS[config]
  return timing.training_flops_per_sequence(layers, hidden, intermediate, vocab_size,
                                            seq_length, predictions, tokens, tokens_squared)


def bert_config_dict(config, vocab_size=VOCAB_SIZE):
  layers, hidden, heads, intermediate = CONFIGS[config]
  return {"vocab_size": vocab_size, "hidden_size": hidden, "num_hidden_layers": layers,
          "num_attention_heads": heads, "intermediate_size": intermediate,
          "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
          "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512,
          "type_vocab_size": 2, "initializer_range": 0.02}


# ---------------------------------------------------------------------------------------
# Timing, shared by the workers

def peak_rss_gib():
  """The high-water mark of this process's resident memory (Linux: ru_maxrss in KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / float(2 ** 20)


def steps_per_window(step, row):
  """Runs one step and returns how many make a window: row["steps"] when set, otherwise
  as many as fill row["window_seconds"] and hold at least row["window_sequences"]
  sentences (our step's time depends on the real tokens of its batches: a window of a
  few batches would time those few)."""
  start = time.perf_counter()
  step()
  seconds = time.perf_counter() - start
  if row["steps"] > 0:
    return row["steps"]
  least = -(-row.get("window_sequences", 0) // row.get("batch", 1))  # rounded up
  return max(1, least, int(round(row["window_seconds"] / max(seconds, 1e-6))))


def interleaved_fps(steps_by_name, batch_size, windows, steps):
  """Sentences/s per timing window of each step function, their windows taking turns
  so that the machine's load falls on all of them alike.

  Returns:
    dict name -> list of sentences/s, one per window.
  """
  fps = {name: [] for name in steps_by_name}
  for _ in range(windows):
    for name, step in sorted(steps_by_name.items()):
      start = time.perf_counter()
      for _ in range(steps):
        step()
      fps[name].append(steps * batch_size / (time.perf_counter() - start))
  return fps


def emit(result):
  print(RESULT_PREFIX + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------
# Worker: our training step (TensorFlow)

def _import_tf():
  # Imported here, not at the top: the peer's subprocess must not load TensorFlow
  # (a second oneDNN / OpenMP runtime in its process), nor the parent pin threads.
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  tf.disable_v2_behavior()
  tf.logging.set_verbosity(tf.logging.ERROR)
  return tf


def session_config(row):
  """The session config of one CPU rank, with the row's thread counts."""
  from bert_pretrain.training import pretraining  # pylint: disable=g-import-not-at-top
  return pretraining.session_config(row["intra"], row["inter"], use_xla=row["xla"])


def record_files(data_dir, seq_length):
  folder = os.path.join(data_dir, "seq%d" % seq_length)
  return [os.path.join(folder, "part-%02d.tfrecord" % i) for i in range(NUM_RECORD_FILES)]


class TrainStep(object):
  """One graph and session of our training step (pretraining.build_train_graph, LAMB),
  fed by input_pipeline.make_dataset from TFRecords.

  Calling it runs one step. It is seeded as a run_pretraining run is (SEED), so every
  run of a row, with LAMB or Adam, in every round, trains on the same batches in the same
  order, from the same weights, with the same dropout masks: the step's time depends on
  its batches' real tokens (the encoder skips the padding). A second iterator of the
  same dataset (read_batches) reads those batches again as numpy arrays; a step made by
  in_memory feeds them in place of the iterator's output, so the input pipeline does not
  run, and the model, weights and session are the same.
  """

  def __init__(self, row):
    tf = _import_tf()
    from bert_pretrain import config  # pylint: disable=g-import-not-at-top
    from bert_pretrain.data import input_pipeline  # pylint: disable=g-import-not-at-top
    from bert_pretrain.model import modeling  # pylint: disable=g-import-not-at-top
    from bert_pretrain.training import pretraining  # pylint: disable=g-import-not-at-top
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(SEED)

      def batches():
        dataset = input_pipeline.make_dataset(
            record_files(row["data_dir"], row["seq"]), row["batch"], row["seq"],
            row["preds"], is_training=True, seed=SEED)
        return tf.data.make_one_shot_iterator(dataset).get_next()
      self.features = batches()
      self.replay = batches()
      bert_config = modeling.BertConfig.from_dict(bert_config_dict(row["config"]))
      dtype = tf.bfloat16 if row["precision"] == "amp" else tf.float32
      self.accumulation = row.get("accumulation", 1)
      train = pretraining.build_train_graph(
          bert_config, self.features, dtype,
          config.Optimizer(optimizer=row.get("optimizer", "lamb"), learning_rate=LEARNING_RATE,
                           num_train_steps=TRAIN_STEPS,
                           num_accumulation_steps=self.accumulation),
          attention_per_sequence=pretraining.attends_per_sequence(row["seq"], dtype, True,
                                                                  row["xla"]),
          seed=SEED)
      self.fetches = [train.update_op, train.outputs["total_loss"]]
      self.accumulate = train.accumulate_op
      self.micro_batch = train.micro_batch
      init = [tf.global_variables_initializer(), tf.local_variables_initializer()]
      self.graph.finalize()
    self.session = tf.Session(graph=self.graph, config=session_config(row))
    self.session.run(init)
    self.loss = None

  def read_batches(self, count):
    """The next `count` batches of the second iterator: list of dicts name -> numpy
    array, the batches the steps have trained on or will, in the same order."""
    return [self.session.run(self.replay) for _ in range(count)]

  def in_memory(self, batches):
    """A step function that trains on `batches` (from read_batches) held in memory, the
    next of them at each call, in turn."""
    feeds = [{self.features[name]: value for name, value in batch.items()}
             for batch in batches]
    calls = itertools.count()

    def step():
      feed_dict = feeds[next(calls) % len(feeds)]
      self.loss = float(self.session.run(self.fetches, feed_dict=feed_dict)[1])
    return step

  def runs(self):
    """One update's (fetches, feed) for session.run, its micro-batches in order, as the
    training loop runs them."""
    return [(self.accumulate, {self.micro_batch: i}) for i in range(self.accumulation - 1)] + [
        (self.fetches, {self.micro_batch: self.accumulation - 1})]

  def __call__(self):
    """One update: accumulation - 1 micro-batches accumulated, then the update's."""
    for fetches, feed in self.runs():
      result = self.session.run(fetches, feed)
    self.loss = float(result[1])


def ours_worker(row):
  """Measures our step from TFRecords and, unless row["records_only"], from memory, on
  the same batches: memory window i feeds the batches record window i read.

  The peak RSS is read after the TFRecord step's warm-up, so it is what a training run
  of this row holds. tokens_per_sequence is the mean real tokens of a sequence of the
  timed batches, tokens_squared_per_sequence the mean of their square.
  """
  start = time.perf_counter()
  records = TrainStep(row)
  result = {"build_s": time.perf_counter() - start}
  start = time.perf_counter()
  records()
  result["first_step_s"] = time.perf_counter() - start
  for _ in range(row["warmup"]):
    records()
  steps = steps_per_window(records, row)
  result.update(rss_gib=peak_rss_gib(), steps_per_window=steps)
  micro = records.accumulation  # micro-batches an update
  untimed = (2 + row["warmup"]) * micro  # the first update, the warm-up, steps_per_window's
  timed = records.read_batches(untimed + row["windows"] * steps * micro)[untimed:]
  lengths = [int(n) for batch in timed for n in batch["input_mask"].sum(axis=1)]
  result["tokens_per_sequence"] = float(statistics.mean(lengths))
  result["tokens_squared_per_sequence"] = float(statistics.mean(n * n for n in lengths))
  steps_by_name = {"records": records}
  if not row["records_only"]:
    warm = records.in_memory(timed[:1])
    for _ in range(row["warmup"]):
      warm()
    steps_by_name["memory"] = records.in_memory(timed)
  fps = interleaved_fps(steps_by_name, row["batch"] * micro, row["windows"], steps)
  for name, values in fps.items():
    result["fps_" + name] = statistics.median(values)
    result["windows_" + name] = values
  result["loss"] = records.loss
  result["step_s"] = row["batch"] * micro / result["fps_records"]
  emit(result)


def peak_worker(row):
  """The matmul peak of this machine at the row's thread count: the best of several
  windows of a large square tf.matmul, float32 and bfloat16."""
  tf = _import_tf()
  n = row["matmul_size"]
  result = {"tensorflow": tf.__version__}
  for name, dtype in (("fp32", tf.float32), ("bf16", tf.bfloat16)):
    with tf.Graph().as_default() as graph:
      a = tf.Variable(tf.cast(tf.random.uniform([n, n]), dtype))
      b = tf.Variable(tf.cast(tf.random.uniform([n, n]), dtype))
      product = tf.matmul(a, b)
      with tf.Session(graph=graph, config=session_config(row)) as session:
        session.run(tf.global_variables_initializer())
        step = lambda: session.run(product.op)  # pylint: disable=cell-var-from-loop
        for _ in range(2):
          step()
        steps = steps_per_window(step, dict(row, steps=0))
        fps = interleaved_fps({name: step}, 1, row["windows"], steps)[name]
        result[name] = max(fps) * 2.0 * n ** 3 / 1e12
  emit(result)


# ---------------------------------------------------------------------------------------
# Worker: Google's peer (bert-tensorflow, see google_peer.py)

def google_worker(row):
  """Training steps of Google's BERT code, one batch held in memory. Its first step
  returns the graph the session ran, and the count of its ops that compute in bfloat16
  shows whether amp's rewrite took place."""
  tf = _import_tf()
  start = time.perf_counter()
  try:
    step = google_peer.GoogleStep(
        bert_config_dict(row["config"]), row["batch"], row["seq"], row["preds"],
        LEARNING_RATE, row["intra"], row["inter"], amp=row["precision"] == "amp")
  except ValueError as error:  # amp on a TensorFlow without the bfloat16 rewrite
    emit({"error": str(error), "not_here": True})
    return
  result = {"build_s": time.perf_counter() - start, "contrib_shim": step.shim,
            "rewrite": step.rewrite, "tensorflow": tf.__version__}
  result["bf16_ops"] = step.bfloat16_ops()
  result["first_loss"] = step.loss
  if step.rewrite and not result["bf16_ops"]:
    # TensorFlow applies the rewrite only where oneDNN runs bfloat16 (AVX-512 CPUs):
    # elsewhere "amp" would time float32.
    emit({"error": "amp: grappler's %s rewrite changed no op to bfloat16 on this CPU "
                   "(oneDNN's bfloat16 needs AVX-512); measure Google's peer in fp32 here"
                   % step.rewrite, "not_here": True})
    return
  for _ in range(row["warmup"]):
    step()
  steps = steps_per_window(step, row)
  fps = interleaved_fps({"google": step}, row["batch"], row["windows"], steps)["google"]
  result.update(fps=statistics.median(fps), windows=fps, rss_gib=peak_rss_gib(),
                loss=step.loss, steps_per_window=steps)
  emit(result)


# ---------------------------------------------------------------------------------------
# Worker: HF's peer (PyTorch + transformers)

def peer_available():
  return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def peer_batch(torch, row):
  """Random token ids with ~15% masked-LM labels (row["preds"] positions a sequence)."""
  generator = torch.Generator().manual_seed(0)
  shape = (row["batch"], row["seq"])
  input_ids = torch.randint(5, VOCAB_SIZE, shape, generator=generator)
  token_type_ids = torch.zeros(shape, dtype=torch.long)
  token_type_ids[:, row["seq"] // 2:] = 1
  labels = torch.full(shape, -100, dtype=torch.long)
  for i in range(row["batch"]):
    positions = torch.randperm(row["seq"] - 1, generator=generator)[:row["preds"]] + 1
    labels[i, positions] = input_ids[i, positions]
  return {"input_ids": input_ids, "token_type_ids": token_type_ids,
          "attention_mask": torch.ones(shape, dtype=torch.long), "labels": labels,
          "next_sentence_label": torch.randint(0, 2, (row["batch"],), generator=generator)}


def peer_worker(row):
  """Training steps of transformers' BertForPreTraining: AdamW, gradients clipped to
  norm 1 (as ours), bf16 autocast for amp."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(row["intra"])
  torch.manual_seed(0)
  config = transformers.BertConfig(**bert_config_dict(row["config"]))
  model = transformers.BertForPreTraining(config)
  model.train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
  batch = peer_batch(torch, row)
  losses = []

  def step():
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=row["precision"] == "amp"):
      loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    losses.append(float(loss.detach()))

  for _ in range(row["warmup"]):
    step()
  steps = steps_per_window(step, row)
  fps = interleaved_fps({"peer": step}, row["batch"], row["windows"], steps)["peer"]
  emit({"fps": statistics.median(fps), "windows": fps, "rss_gib": peak_rss_gib(),
        "loss": losses[-1], "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attention": getattr(config, "_attn_implementation", None)})


# ---------------------------------------------------------------------------------------
# The parent: data, rows, table

def prepare_data(data_dir, seq_lengths):
  """WordPiece vocab (up to 30522 tokens) and TFRecords of the demo corpus, once. Their
  makers are imported only when one is missing: they import TensorFlow, which this
  process goes without (_import_tf)."""
  if not os.path.isdir(data_dir):
    os.makedirs(data_dir)
  vocab_file = os.path.join(data_dir, "vocab.txt")
  if not os.path.exists(vocab_file):
    from bert_pretrain.data import tokenization  # pylint: disable=g-import-not-at-top
    tokenization.build_wordpiece_vocab([CORPUS], VOCAB_SIZE, vocab_file)
  for seq in seq_lengths:
    files = record_files(data_dir, seq)
    if all(os.path.exists(f) for f in files):
      continue
    from bert_pretrain import create_pretraining_data  # pylint: disable=g-import-not-at-top
    if not os.path.isdir(os.path.dirname(files[0])):
      os.makedirs(os.path.dirname(files[0]))
    log("making TFRecords of seq %d in %s" % (seq, os.path.dirname(files[0])))
    create_pretraining_data.create_pretraining_data(
        [CORPUS], files, vocab_file, max_seq_length=seq,
        max_predictions_per_seq=PREDICTIONS[seq], dupe_factor=DUPE_FACTOR[seq])


def log(message):
  print("[benchmark] " + message, file=sys.stderr, flush=True)


def run_worker(kind, row, log_name, script=None, row_flag="--row"):
  """Runs one measurement in a subprocess: this script's --worker=kind, or `script`
  with row_flag=<the row's JSON> (bench/packing.py's); returns its result dict, or
  {"error": ...}."""
  log_path = os.path.join(FLAGS.out_dir, "logs", log_name + ".log")
  command = ([sys.executable, os.path.abspath(__file__), "--worker=" + kind]
             if script is None else [sys.executable, script]) + [
                 row_flag + "=" + json.dumps(row)]
  env = card.run_env()
  start = time.time()
  with open(log_path, "w") as log_file:
    try:
      finished = processes.run(command, FLAGS.row_timeout, stdout=subprocess.PIPE,
                               stderr=log_file, env=env, universal_newlines=True,
                               preexec_fn=functools.partial(processes.end_with_parent,
                                                            os.getpid(), signal.SIGKILL))
    except subprocess.TimeoutExpired:
      return {"error": "timed out after %d s" % FLAGS.row_timeout}
    log_file.write(finished.stdout)
  for line in reversed(finished.stdout.splitlines()):
    if line.startswith(RESULT_PREFIX):
      result = json.loads(line[len(RESULT_PREFIX):])
      result["wall_s"] = time.time() - start
      return result
  if finished.returncode in (-9, 137):
    reason = "killed (out of memory?)"
  elif finished.returncode < 0:
    reason = "ended by %s" % errors.signal_name(-finished.returncode)
  else:
    reason = "exit status %d" % finished.returncode
  return {"error": "%s, see %s" % (reason, log_path)}


def base_row(config, seq, precision):
  return {"config": config, "seq": seq, "preds": PREDICTIONS[seq],
          "batch": FLAGS.batch_size or BATCH_SIZES[(config, seq)], "precision": precision,
          "warmup": FLAGS.warmup_steps, "windows": FLAGS.windows, "steps": FLAGS.steps,
          "window_seconds": FLAGS.window_seconds, "window_sequences": FLAGS.window_sequences,
          "intra": FLAGS.intra_threads, "inter": FLAGS.inter_threads, "xla": FLAGS.xla,
          "data_dir": os.path.join(FLAGS.out_dir, "data"), "records_only": False,
          "optimizer": "lamb"}


# The sides of a row: name -> what it is called in the table. Ours with LAMB, ours with
# Adam, Google's, HF's; in each round every side that runs takes its turn.
SIDES = (("ours", "ours LAMB"), ("ours_adam", "ours Adam"), ("google", "Google"),
         ("hf", "HF"))


def row_sides(with_google, with_peer):
  """The sides to run in each row: list of (side, worker kind, changes to the row)."""
  sides = []
  if "lamb" in FLAGS.optimizers:
    sides.append(("ours", "ours", {"optimizer": "lamb"}))
  if "adam" in FLAGS.optimizers:
    sides.append(("ours_adam", "ours", {"optimizer": "adam", "records_only": True}))
  if with_google:
    sides.append(("google", "google", {}))
  if with_peer:
    sides.append(("hf", "peer", {}))
  return sides


def summarize(runs):
  """One side's runs of a row (one a round) -> its summary: the timing windows of all
  rounds pooled, their median ("fps") and range ("fps_min", "fps_max"), the largest peak
  RSS, the last run's other fields; {"error": ...} when no run succeeded."""
  good = [r for r in runs if "error" not in r]
  if not good:
    return {"error": runs[0]["error"], "runs": runs}
  key = "windows_records" if "windows_records" in good[0] else "windows"
  windows = [w for r in good for w in r[key]]
  summary = dict(good[-1], fps=statistics.median(windows), fps_min=min(windows),
                 fps_max=max(windows), windows=windows, rounds=len(good),
                 rss_gib=max(r["rss_gib"] for r in good), runs=runs)
  if key == "windows_records":
    summary["fps_records"] = summary["fps"]
    memory = [w for r in good for w in r.get("windows_memory", [])]
    summary["fps_memory"] = statistics.median(memory) if memory else None
  return summary


def measure_row(config, seq, precision, peak, sides):
  """Every side of one row, --rounds rounds of turns, with the derived columns."""
  row = base_row(config, seq, precision)
  name = "%s-seq%d-%s" % (config, seq, precision)
  load_start = os.getloadavg()[0]
  log("row %s: batch %d, load average %.2f at its start" % (name, row["batch"], load_start))
  runs = {side: [] for side, _, _ in sides}
  changes_by_side = {side: changes for side, _, changes in sides}
  ours_steps = {}  # our step's windows: as many steps in every run, so the same batches
  for round_index in range(FLAGS.rounds):
    # Each round starts with the next side, so that none always runs first.
    first = round_index % len(sides)
    for side, kind, changes in sides[first:] + sides[:first]:
      run_row = dict(row, **changes)
      if kind == "ours":
        run_row.update(ours_steps)
      run = run_worker(kind, run_row, "%s-%s-r%d" % (name, side, round_index + 1))
      if kind == "ours" and "error" not in run:
        ours_steps.setdefault("steps", run["steps_per_window"])
      runs[side].append(run)
  load_end = os.getloadavg()[0]
  result = dict(row, load_average=[load_start, load_end])
  for side, _ in SIDES:
    result[side] = dict(summarize(runs[side]), **changes_by_side[side]) if side in runs \
        else None
  ours = result["ours"]
  if ours and "error" not in ours:
    result["tokens_per_sequence"] = ours["tokens_per_sequence"]
    flops = train_flops_per_sequence(config, seq, row["preds"],
                                     tokens=ours["tokens_per_sequence"],
                                     tokens_squared=ours["tokens_squared_per_sequence"])
    result["flops_per_sequence"] = flops
    result["tflops"] = ours["fps"] * flops["total"] / 1e12
    set_mfu(result, peak)
    if ours["fps_memory"]:
      result["pipeline_cost"] = 1.0 - ours["fps"] / ours["fps_memory"]
  for mine, theirs in (("ours", "google"), ("ours_adam", "google"), ("ours", "hf")):
    if all(result[side] and "error" not in result[side] for side in (mine, theirs)):
      result["%s_over_%s" % (mine, theirs)] = result[mine]["fps"] / result[theirs]["fps"]
  log("row %s done, load average %.2f at its end: %s" % (name, load_end, format_row(result)))
  return result


def set_mfu(row, peak):
  """row["mfu"]: its TFLOP/s over the matmul peak of its precision."""
  peak_tflops = peak.get("bf16" if row["precision"] == "amp" else "fp32")
  row["mfu"] = row["tflops"] / peak_tflops if peak_tflops and "tflops" in row else None


def measure_peak(name):
  log("matmul peak (%s)" % name)
  peak = run_worker("peak", dict(base_row(FLAGS.configs[0], int(FLAGS.seq_lengths[0]), "fp32"),
                                 matmul_size=FLAGS.matmul_size, window_sequences=0), name)
  if "error" in peak:
    log("matmul peak failed: %s" % peak["error"])
  return peak


def best_peak(*peaks):
  best = {"measurements": list(peaks)}
  for peak in peaks:
    for key, value in peak.items():
      if key in ("fp32", "bf16"):
        best[key] = max(best.get(key, 0.0), value)
      elif key == "tensorflow":
        best[key] = value
  return best


def measure_large(precision):
  row = dict(base_row("large", 512, precision), warmup=1, windows=2, steps=1,
             records_only=True)
  log("BERT-Large seq 512 batch 1, %s" % precision)
  return dict(row, ours=run_worker("ours", row, "large-seq512-%s-ours" % precision))


def measure_mlperf_large(peak):
  """BERT-Large at 512 in mixed precision as MLPerf trains it: the largest micro-batch,
  accumulated into updates of at least 64 sequences; one warm-up update, one timed."""
  row = dict(base_row("large", 512, "amp"), batch=FLAGS.mlperf_batch,
             accumulation=FLAGS.mlperf_accumulation, warmup=0, windows=1, steps=1,
             records_only=True, cores=FLAGS.intra_threads)
  log("BERT-Large seq 512 amp, MLPerf's configuration: batch %d x %d accumulated"
      % (row["batch"], row["accumulation"]))
  result = dict(row, ours=run_worker("ours", row, "large-seq512-mlperf-ours"))
  ours = result["ours"]
  if "error" not in ours:
    flops = train_flops_per_sequence("large", 512, row["preds"],
                                     tokens=ours["tokens_per_sequence"],
                                     tokens_squared=ours["tokens_squared_per_sequence"])
    result["tflops"] = ours["fps_records"] * flops["total"] / 1e12
    set_mfu(result, peak)
  return result


# ---------------------------------------------------------------------------------------
# Output

COLUMNS = ("config", "seq", "batch", "prec", "load start-end") + tuple(
    "%s sent/s" % label for _, label in SIDES) + (
        "ours/Google LAMB", "ours/Google Adam", "ours/HF", "in-memory sent/s",
        "pipeline cost", "TFLOP/s", "MFU", "RSS GiB ours / Google / HF")


def _num(value, fmt):
  return fmt % value if value is not None else "-"


def _fps_cell(side):
  """median (min-max) of a side's windows, "-" when it did not run."""
  if side is None:
    return "-"
  if "error" in side:
    return "failed: " + side["error"]
  return "%.2f (%.2f-%.2f)" % (side["fps"], side["fps_min"], side["fps_max"])


def format_row(r):
  ours = r["ours"] if r["ours"] and "error" not in r["ours"] else {}
  rss = [(r[side] or {}).get("rss_gib") for side in ("ours", "google", "hf")]
  cells = [r["config"], str(r["seq"]), str(r["batch"]), r["precision"],
           "%.1f-%.1f" % tuple(r["load_average"])]
  cells += [_fps_cell(r[side]) for side, _ in SIDES]
  cells += [_num(r.get(key), "%.2fx") for key in
            ("ours_over_google", "ours_adam_over_google", "ours_over_hf")]
  cells += [_num(ours.get("fps_memory"), "%.2f"),
            _num(r.get("pipeline_cost") and 100 * r["pipeline_cost"], "%.1f%%"),
            _num(r.get("tflops"), "%.3f"), _num(r.get("mfu") and 100 * r["mfu"], "%.0f%%"),
            " / ".join(_num(value, "%.2f") for value in rss)]
  return " | ".join(cells)


def markdown(results):
  lines = ["# Benchmark: training steps on this CPU", ""]
  env = results["environment"]
  lines.append("Machine: %s, %s cores, %d intra / %d inter-op threads%s; load average "
               "%.1f at the start, %.1f at the end. %s." % (
                   env["machine"], env["cores"], FLAGS.intra_threads, FLAGS.inter_threads,
                   ", XLA on" if FLAGS.xla else "", env["load_average"][0],
                   env["load_average"][1], ", ".join("%s %s" % kv for kv in
                                                     sorted(env["versions"].items()))))
  peak = results["peak"]
  lines.append("Matmul peak measured in this run (best of its start and end): %s TFLOP/s "
               "fp32, %s TFLOP/s bf16." % (
      _num(peak.get("fp32"), "%.3f"), _num(peak.get("bf16"), "%.3f")))
  lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  lines += ["| " + format_row(r) + " |" for r in results["rows"]]
  lines += ["", "Sent/s: the median of the timing windows of %d round(s), the range in "
            "brackets; the load average is the row's at its start and end." % FLAGS.rounds]
  for note in results["peer_notes"]:
    lines += ["", note]
  google = [r for r in results["rows"] if r["google"] and "error" not in r["google"]]
  if google:
    note = "Google's step: bert-tensorflow's code%s." % (
        " with the benchmark's tensorflow.contrib.layers.layer_norm (TensorFlow 2 has no "
        "contrib)" if google[0]["google"]["contrib_shim"] else "")
    amp = [r for r in google if r["precision"] == "amp"]
    if amp:
      note += " Ops computing in bfloat16 after grappler's %s rewrite: %s (fp32 rows: %s)." % (
          amp[0]["google"]["rewrite"], ", ".join(str(r["google"]["bf16_ops"]) for r in amp),
          ", ".join(str(r["google"]["bf16_ops"]) for r in google if r not in amp) or "-")
    lines += ["", note]
  lines += ["", "FLOPs per training sequence (forward + backward) that our step computes, "
            "and their shares; the encoder's dense layers run on the real tokens only, the "
            "data's mean number of them:", "",
            "| config | seq | real tokens | GFLOP | encoder dense | attention | MLM head |",
            "|---|---|---|---|---|---|---|"]
  seen = set()
  for r in results["rows"]:
    key = (r["config"], r["seq"])
    if key in seen or "flops_per_sequence" not in r:
      continue
    seen.add(key)
    f = r["flops_per_sequence"]
    lines.append("| %s | %d | %.1f | %.1f | %.0f%% | %.0f%% | %.0f%% |" % (
        r["config"], r["seq"], r["tokens_per_sequence"], f["total"] / 1e9,
        100.0 * f["encoder_dense"] / f["total"], 100.0 * f["attention"] / f["total"],
        100.0 * f["mlm_head"] / f["total"]))
  for r in results["large"]:
    lines += ["", large_line(r)]
  return "\n".join(lines) + "\n"


def large_line(r):
  """The line of a BERT-Large row: the batch-1 check, or MLPerf's configuration."""
  ours = r["ours"]
  what = ("in MLPerf's configuration" if r.get("accumulation") else "batch 1")
  if "error" in ours:
    return "BERT-Large seq 512 %s %s: no training step (%s)." % (r["precision"], what,
                                                                   ours["error"])
  if not r.get("accumulation"):
    return ("BERT-Large seq 512 batch 1 %s: trains, %.1f s a step, peak RSS %.2f GiB "
            "(graph built in %.0f s)." % (r["precision"], ours["step_s"], ours["rss_gib"],
                                         ours["build_s"]))
  return ("BERT-Large seq 512 %s %s (batch %d x %d accumulated = %d an update): %.3f "
          "sent/s, %.3f a core on %d cores (Intel's MLPerf v3.0 on Xeon 8480+: %.2f a core), "
          "%s of the bfloat16 peak, peak RSS %.2f GiB." % (
              r["precision"], what, r["batch"], r["accumulation"],
              r["batch"] * r["accumulation"], ours["fps_records"],
              ours["fps_records"] / r["cores"], r["cores"], INTEL_SENTENCES_PER_CORE,
              "%.0f%%" % (100 * r["mfu"]) if r.get("mfu") else "-", ours["rss_gib"]))


def draw_chart(results, path):
  """Sentences/s of every side (log scale) and our MFU, per row; False without matplotlib."""
  if importlib.util.find_spec("matplotlib") is None:
    print("No chart: install matplotlib (`pip install matplotlib`) to draw %s" % path)
    return False
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rows = [r for r in results["rows"] if r["ours"] and "error" not in r["ours"]]
  if not rows:
    return False
  labels = ["%s/%d/%s" % (r["config"], r["seq"], r["precision"]) for r in rows]
  x = list(range(len(rows)))
  figure, (top, bottom) = plt.subplots(2, 1, figsize=(max(6, 0.7 * len(rows)), 6),
                                       sharex=True)
  drawn = [(side, label) for side, label in SIDES
           if any(r[side] and "fps" in r[side] for r in rows)]
  width = 0.8 / len(drawn)
  for k, (side, label) in enumerate(drawn):
    fps = [r[side]["fps"] if r[side] and "fps" in r[side] else 0 for r in rows]
    top.bar([i + width * (k - (len(drawn) - 1) / 2.0) for i in x], fps, width, label=label)
  top.set_yscale("log")
  top.set_ylabel("sentences/s")
  top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
  bottom.bar(x, [100 * (r["mfu"] or 0) for r in rows], 0.6, color="tab:green")
  bottom.set_ylabel("MFU % (ours)")
  bottom.set_xticks(x)
  bottom.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  plt.close(figure)
  return True


def environment(peak, rows, load_at_start):
  versions = {"python": platform.python_version(), "tensorflow": peak.get("tensorflow")}
  for r in rows:
    if r["hf"] and "torch" in r["hf"]:
      versions.update(torch=r["hf"]["torch"], transformers=r["hf"]["transformers"])
      break
  if any(r["google"] and "error" not in r["google"] for r in rows):
    versions["bert-tensorflow"] = google_peer.PACKAGE.split("==")[1]
  return {"machine": card.cpu_description(), "cores": os.cpu_count(),
          "versions": versions, "load_average": [load_at_start, os.getloadavg()[0]]}


def check_flags(tool):
  """Refuses, in one line, the flags shared with bench/packing.py that would make a run
  measure nothing or something else than asked; returns the sequence lengths."""
  for name in FLAGS.configs:
    if name not in CONFIGS or name == "large":
      errors.usage_error(tool, "--configs: unknown %r; use %s" % (
          name, ",".join(n for n in CONFIGS if n != "large")))
  for seq in FLAGS.seq_lengths:
    if not seq.isdigit() or int(seq) not in PREDICTIONS:
      errors.usage_error(tool, "--seq_lengths: %s is not one of 128, 512" % seq)
  for precision in FLAGS.precisions:
    if precision not in ("fp32", "amp"):
      errors.usage_error(tool, "--precisions: %r is not fp32 or amp" % precision)
  # Each a whole data preparation and peak measurement ahead of a row that cannot run.
  for name, value, least, meaning in (
      ("rounds", FLAGS.rounds, 1, "1 or more"), ("windows", FLAGS.windows, 1, "1 or more"),
      ("steps", FLAGS.steps, 0, "0 (as many as fill --window_seconds) or more"),
      ("warmup_steps", FLAGS.warmup_steps, 0, "0 or more"),
      ("batch_size", FLAGS.batch_size, 0, "0 (each row's default) or more"),
      ("intra_threads", FLAGS.intra_threads, 1, "1 or more"),
      ("inter_threads", FLAGS.inter_threads, 1, "1 or more"),
      ("row_timeout", FLAGS.row_timeout, 1, "1 or more seconds"),
      ("mlperf_batch", FLAGS.mlperf_batch, 1, "1 or more"),
      ("mlperf_accumulation", FLAGS.mlperf_accumulation, 1, "1 or more")):
    if value < least:
      errors.usage_error(tool, "--%s: %d; use %s" % (name, value, meaning))
  return [int(s) for s in FLAGS.seq_lengths]


def stoppable(tool, body, fix="the rows it had not finished are not in its table; run the "
              "same command again"):
  """body(), with SIGTERM raised as Ctrl-C is: either ends the tool with one line (`fix`
  after the signal's name) and its exit status (run_worker kills the worker it waits
  on), not a traceback."""
  errors.take_stop_signals()
  try:
    return body()
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM's errors.Terminated
    sys.exit(errors.stopped_by_signal(tool, e, fix))


def failed_cells_line(count, total, out_dir):
  """The closing line of a run some of whose measurements failed (the exit status is 1)."""
  return ("%d of %d measurements failed; their cells say why, their logs are in %s"
          % (count, total, os.path.join(out_dir, "logs")))


def run_benchmark():
  seq_lengths = check_flags("benchmark")
  if not FLAGS.optimizers or not set(FLAGS.optimizers) <= {"lamb", "adam"}:
    errors.usage_error("benchmark", "--optimizers: %r; use lamb and/or adam, e.g. "
                       "--optimizers=lamb,adam" % ",".join(FLAGS.optimizers))
  errors.make_output_folders("benchmark", "--out_dir", FLAGS.out_dir, ("logs", "data"))

  load_at_start = os.getloadavg()[0]
  with_google = not FLAGS.skip_google and google_peer.available()
  with_peer = not FLAGS.skip_peer and peer_available()
  peer_notes = []
  if not (with_google or FLAGS.skip_google):
    peer_notes.append(google_peer.HINT)
  if not (with_peer or FLAGS.skip_peer):
    peer_notes.append(PEER_HINT)
  for note in peer_notes:
    print(note, flush=True)
  sides = row_sides(with_google, with_peer)
  prepare_data(os.path.join(FLAGS.out_dir, "data"),
               sorted(set(seq_lengths + ([] if FLAGS.skip_large else [512]))))
  peak_start = measure_peak("peak-start")
  rows = [measure_row(config, seq, precision, peak_start, sides)
          for config in FLAGS.configs for seq in seq_lengths for precision in FLAGS.precisions]
  large = [] if FLAGS.skip_large else [
      measure_large("fp32" if "fp32" in FLAGS.precisions else "amp"),
      measure_mlperf_large(peak_start)]
  # Other work on the machine lowers a peak measurement; the best of two is closer.
  peak = best_peak(peak_start, measure_peak("peak-end"))
  for row in rows + [r for r in large if "tflops" in r]:
    set_mfu(row, peak)
  results = {"environment": environment(peak, rows, load_at_start), "peak": peak, "rows": rows,
             "large": large, "peer_notes": peer_notes}
  table = markdown(results)
  print(table)
  with open(os.path.join(FLAGS.out_dir, "benchmark.md"), "w") as f:
    f.write(table)
  with open(os.path.join(FLAGS.out_dir, "benchmark.json"), "w") as f:
    json.dump(results, f, indent=1)
  drawn = draw_chart(results, os.path.join(FLAGS.out_dir, "benchmark.png"))
  written = write_card(results, os.path.join(FLAGS.out_dir, "benchmark_card.json"))
  for line in card.published_lines(written):
    print("Published beside ours: " + line)
  print("Written: %s/benchmark.md, benchmark.json, benchmark_card.json%s"
        % (FLAGS.out_dir, ", benchmark.png" if drawn else ""), flush=True)
  failed, measured = failed_measurements(rows, large)
  if failed:
    errors.print_error("benchmark", failed_cells_line(failed, measured, FLAGS.out_dir))
    sys.exit(1)


def failed_measurements(rows, large):
  """(failed, measured) cells of the rows and the BERT-Large check. A peer's amp that
  this TensorFlow or CPU cannot compute says so in its cell and is neither."""
  measured = [r[side] for r in rows for side, _ in SIDES
              if r[side] and not all(run.get("not_here") for run in r[side]["runs"])] + [
                  r["ours"] for r in large]
  return sum("error" in m for m in measured), len(measured)


def row_config(row, side):
  """What a side of a row measured, as a user chooses it (the card's config)."""
  layers, hidden, heads, intermediate = CONFIGS[row["config"]]
  config = {"tool": "bench.benchmark", "side": side,
            "model": {"name": row["config"], "layers": layers, "hidden": hidden,
                      "heads": heads, "intermediate": intermediate, "vocab": VOCAB_SIZE},
            "seq": row["seq"], "predictions": row["preds"], "batch": row["batch"],
            "precision": row["precision"],
            "compute": "bfloat16" if row["precision"] == "amp" else "float32",
            "intra_threads": row["intra"], "inter_threads": row["inter"],
            "xla": row["xla"] if side.startswith("ours") else False,
            "data": ("the demo corpus's TFRecords, shuffle seed %d" % SEED
                     if side.startswith("ours") else "random token ids held in memory")}
  if side.startswith("ours"):
    config["optimizer"] = "adam" if side == "ours_adam" else "lamb"
  return config


def write_card(results, path):
  """The benchmark card (bench/card.py): every side of every row and the BERT-Large
  check, the timing windows of all rounds as the repeats."""
  env = card.environment()
  published = card.load_published()
  entries = []
  for row in results["rows"]:
    for side, label in SIDES:
      measured = row[side]
      if measured and "error" not in measured:
        entries.append(card.entry(
            "%s-seq%d-%s %s" % (row["config"], row["seq"], row["precision"], label),
            row_config(row, side), measured["windows"], 1, env, published))
  for row in results["large"]:
    ours = row["ours"]
    if "error" not in ours:
      entries.append(card.entry(
          "large-seq%d-%s ours LAMB (batch %d%s, %d steps a window)" % (
              row["seq"], row["precision"], row["batch"],
              " x %d accumulated" % row["accumulation"] if row.get("accumulation") else "",
              ours["steps_per_window"]),
          row_config(row, "ours"), ours["windows_records"], 1, env, published))
  return card.write_card(path, "bench.benchmark", card.tool_flags(FLAGS, "configs"),
                         entries, env)


def main(argv):
  if len(argv) > 1:
    errors.unexpected_arguments("benchmark", argv[1:])
  if FLAGS.worker:
    row = json.loads(FLAGS.row)
    {"ours": ours_worker, "google": google_worker, "peer": peer_worker,
     "peak": peak_worker}[FLAGS.worker](row)
    return
  stoppable("benchmark", run_benchmark)


if __name__ == "__main__":
  errors.run_main("benchmark", main)
