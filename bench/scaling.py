"""Scaling benchmark: training FPS of 1 rank and 2 ranks on this machine, with each
engine (Horovod, TensorFlow's mirrored and multi_worker_mirrored) on the same rows.

  python3 bench/scaling.py                      # demo-size (tiny) and medium BERT
  python3 bench/scaling.py --models=tiny --num_train_steps=40

Runs the real entry point, `horovodrun -np N -H localhost:N --gloo python3 -m
bert_pretrain.run_pretraining --horovod --intra_op_threads=1 ...`, once with 1 rank and
once with 2, on the demo's data (`python3 -m bert_pretrain.demo`, sequence 128, 20
predictions), with the same batch per rank: 2 ranks train twice the sentences per
step. It reads "Throughput Average (sentences/sec) = X" (all ranks, after the warm-up
steps) from the output and prints each model's FPS and the scaling efficiency
FPS(2 ranks) / (2 x FPS(1 rank)). Each run ends with one evaluation of the demo's eval
set (each rank reads its part, the sums are all-reduced), and the table gives its time
("eval time: X s"): with 2 ranks it should not take longer than with one. The table
also goes to --out_dir/scaling.md (+ .json), and a card (bench/card.py) to
scaling_card.json: the environment, each run's config hash, and with --repeats=N the
mean and spread of N runs of each configuration (the tables give the mean).

Models: "tiny" is the demo's BERT (2 layers, hidden 128) from its init checkpoint;
"medium" (8 layers, hidden 512, 8 heads, 2048) has the demo's vocab (4096) and starts
from random weights. A tiny model's step is short next to an all-reduce, so its
efficiency shows the all-reduce's latency; the medium one shows the compute's scaling.

With --independent (the default) it also runs two single-rank jobs at once, which share
the cores and memory but never all-reduce: their summed FPS over 2 x FPS(1 rank) is the
efficiency the machine itself allows, so the gap to the 2-rank job is the all-reduce's.

--engines (default all three) adds, beside Horovod's 2 ranks, the same 2 replicas with
--distribution=mirrored (one process over 2 logical CPU devices, given the threads of 2
ranks) and multi_worker_mirrored (2 local processes, TF_CONFIG naming them), one after
the other on each row.

--tables adds the seed projects' tables (../shared/seeds/001):
  speed      sentences/s of 1 and 2 Horovod ranks x --precisions x --batch_sizes (per
             rank), on the demo's data (sequence 128);
  max_batch  the largest batch per rank one card fits, for each model and
             --max_batch_seq_lengths, found by trying: doubling from 1 until a 1-step,
             1-rank run fails for lack of memory, then halving the gap. A run fails so
             when run_pretraining reports "out of memory" (TensorFlow's
             ResourceExhaustedError, caught there), or ends by bad_alloc, MemoryError or
             SIGKILL (the kernel's OOM killer); any other failure stops the search and is
             reported. On a GPU the card's memory is the limit; on a CPU TensorFlow's
             tensors are held to --memory_limit_gib by its BFC allocator, as on a card
             (a trial that crashes inside that limit and runs without it counts as out
             of memory too).
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

from absl import flags

try:
  from bench import card  # python3 -m bench.scaling, from the repository root
except ImportError:
  import card  # python3 bench/scaling.py: bench/ is the script's own folder
from bert_pretrain import errors
from bert_pretrain.distributed import launch
from bert_pretrain import processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MEDIUM_CONFIG = {
    "vocab_size": 4096, "hidden_size": 512, "num_hidden_layers": 8,
    "num_attention_heads": 8, "intermediate_size": 2048, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
}
# model -> (batch per rank, training steps, warm-up steps left out of the FPS)
DEFAULTS = {"tiny": (32, 60, 10), "medium": (8, 24, 6)}
# model -> batches per rank of the speed table
SPEED_BATCHES = {"tiny": (16, 64), "medium": (4, 16)}
PREDICTIONS = {128: 20, 512: 76}  # masked positions a sequence, as MLPerf's data has them
ENGINES = ("horovod", "mirrored", "multi_worker_mirrored")
TABLES = ("engines", "speed", "max_batch")
PRECISIONS = ("fp32", "amp")
# How a trial run ends when its batch does not fit: run_pretraining's one line for
# TensorFlow's ResourceExhaustedError, C++'s or Python's allocation failure.
OUT_OF_MEMORY = re.compile(r"error: out of memory|std::bad_alloc|MemoryError")
THROUGHPUT = re.compile(r"Throughput Average \(sentences/sec\) = ([0-9.]+)")
EVAL_TIME = re.compile(r"eval time: ([0-9.]+) s")
# The run's device line says what it computed in: "device: CPU, 2 cores, compute bfloat16"
# (under horovodrun after a "[1,0]<stdout>:" prefix).
COMPUTE = re.compile(r"device: .*?compute (\w+)")

flags.DEFINE_list("models", ["tiny", "medium"], "Models to run: tiny (the demo's), medium.")
flags.DEFINE_bool("independent", True, "Also run 2 single-rank jobs at once (no all-reduce "
                  "between them): the efficiency the shared machine allows without it.")
flags.DEFINE_integer("train_batch_size", 0, "Sentences per step on each rank (0: per model).")
flags.DEFINE_integer("num_train_steps", 0, "Training steps per run (0: per model).")
flags.DEFINE_integer("fps_warmup_steps", 0, "Steps left out of the FPS (0: per model).")
flags.DEFINE_integer("repeats", 1, "Runs of each configuration of the engines and speed "
                     "tables: their tables give the mean FPS, scaling_card.json the mean "
                     "and the spread.", lower_bound=1)
flags.DEFINE_integer("intra_op_threads", 1, "Threads per op in each rank.")
flags.DEFINE_integer("inter_op_threads", 1, "Ops run at once in each rank.")
flags.DEFINE_string("horovod_args", "--gloo", "Controller flags for horovodrun (--gloo, --mpi).")
flags.DEFINE_list("engines", list(ENGINES), "Engines of the 2-rank runs: %s."
                  % ", ".join(ENGINES))
flags.DEFINE_list("tables", list(TABLES), "Tables to make: engines (1 vs 2 ranks of each "
                  "engine), speed (ranks x precision x batch), max_batch (the largest "
                  "batch that fits).")
flags.DEFINE_list("precisions", list(PRECISIONS), "Precisions of the speed table: fp32, amp "
                  "(run_pretraining --amp: float16 on GPUs, bfloat16 on CPUs where TensorFlow "
                  "computes it faster than float32, float32 on others).")
flags.DEFINE_list("batch_sizes", [], "Batches per rank of the speed table (default per "
                  "model: %s)." % "; ".join("%s %s" % (m, ",".join(map(str, b)))
                                           for m, b in sorted(SPEED_BATCHES.items())))
flags.DEFINE_list("max_batch_seq_lengths", ["128", "512"], "Sequence lengths of the "
                  "largest-batch search (128, 512).")
flags.DEFINE_integer("max_batch_limit", 4096, "The largest batch the search tries.",
                     lower_bound=1)
flags.DEFINE_float("memory_limit_gib", -1, "A card's memory in the largest-batch search: "
                   "on a CPU, the GiB TensorFlow's tensors may take (its BFC allocator, "
                   "TF_CPU_BFC_MEM_LIMIT_IN_MB); 0: no limit (on GPUs, whose memory is "
                   "the limit); -1: 0 where a GPU's device file exists (/dev/nvidia0, "
                   "/dev/iluvatar0), else 8.")
flags.DEFINE_string("out_dir", os.path.join(ROOT, "bench_results"),
                    "Where the demo data, the logs and the table go.")
FLAGS = flags.FLAGS


def log(message):
  print("[scaling] " + message, file=sys.stderr, flush=True)


# What a Ctrl-C or SIGTERM leaves to end: the running subprocesses (horovodrun ends its
# ranks on SIGTERM) and the runs' output folders in the temporary folder.
_CHILDREN = []
_FOLDERS = []
# Seconds a child has to end after SIGTERM before it is killed.
STOP_SECONDS = 30


def start_child(command, **kwargs):
  """subprocess.Popen, the child recorded before a Ctrl-C or SIGTERM can end this
  process (end_children ends it then); the child itself takes them at once."""
  return processes.start(command, _CHILDREN, **kwargs)


def wait_child(process):
  processes.communicate(process)  # not process.wait(): processes.communicate says why
  status = process.returncode
  _CHILDREN.remove(process)
  return status


def run_child(command, **kwargs):
  """subprocess.call, the child ended with this process when it is stopped."""
  return wait_child(start_child(command, **kwargs))


def temporary_folder(prefix):
  _FOLDERS.append(tempfile.mkdtemp(prefix=prefix))
  return _FOLDERS[-1]


def remove_folder(folder):
  shutil.rmtree(folder, ignore_errors=True)
  _FOLDERS.remove(folder)


def end_children():
  """SIGTERM to the running subprocesses, SIGKILL to those alive STOP_SECONDS later; then
  removes the runs' folders."""
  for process in _CHILDREN:
    if process.poll() is None:
      process.terminate()
  for process in list(_CHILDREN):
    try:
      process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
    _CHILDREN.remove(process)
  for folder in list(_FOLDERS):
    remove_folder(folder)


def check_child(status, what, log_path):
  """A preparation's subprocess that failed: one line naming its log, exit status 1."""
  if status != 0:
    errors.print_error("scaling", "%s failed (exit status %d); see %s" % (what, status,
                                                                        log_path))
    sys.exit(1)


def prepare_demo(cache_dir):
  """The demo's vocab, TFRecords, bert_config.json and init checkpoint (cached)."""
  log_path = os.path.join(FLAGS.out_dir, "logs", "scaling-demo.log")
  with open(log_path, "w") as log_file:
    check_child(run_child([sys.executable, "-m", "bert_pretrain.demo",
                           "--demo_cache_dir=" + cache_dir], cwd=ROOT, env=run_env(),
                          stdout=log_file, stderr=subprocess.STDOUT),
                "the demo's data (python3 -m bert_pretrain.demo)", log_path)
  medium_config = os.path.join(cache_dir, "bert_config_medium.json")
  with open(medium_config, "w") as f:
    json.dump(MEDIUM_CONFIG, f, indent=2)
  return {"tiny": (os.path.join(cache_dir, "bert_config.json"),
                   os.path.join(cache_dir, "init", "model.ckpt-0")),
          "medium": (medium_config, None)}


def run_env():
  env = card.run_env()
  if os.getuid() == 0:
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
  return env


def pretraining_command(train_dir, config_file, output_dir, seq, batch, steps, warmup,
                        amp=False):
  """run_pretraining's words for `steps` steps of `batch` sequences a rank."""
  return [sys.executable, "-m", "bert_pretrain.run_pretraining",
          "--input_files_dir=" + train_dir, "--bert_config_file=" + config_file,
          "--output_dir=" + output_dir, "--max_seq_length=%d" % seq,
          "--max_predictions_per_seq=%d" % PREDICTIONS[seq],
          "--train_batch_size=%d" % batch, "--num_train_steps=%d" % steps,
          # The first update that logs the losses sets that call up: within the warm-up.
          "--fps_warmup_steps=%d" % warmup, "--display_loss_steps=%d" % max(1, warmup),
          "--save_checkpoints_steps=100000", "--stop_threshold=0", "--learning_rate=1e-4",
          "--amp" if amp else "--noamp"]


def training_commands(engine, ranks, cache_dir, config_file, init_checkpoint, output_dir,
                      settings):
  """The processes of one run: a list of (command, environment variables to add).
  settings: (batch per rank, steps, warm-up steps, amp)."""
  batch, steps, warmup, amp = settings
  flags_ = pretraining_command(os.path.join(cache_dir, "train"), config_file, output_dir,
                               128, batch, steps, warmup, amp) + [
      # One evaluation, at the end, of the demo's eval set shared by the ranks.
      "--eval_files_dir=" + os.path.join(cache_dir, "eval"),
      "--samples_start_eval=%d" % 10 ** 15, "--eval_batch_size=64"]
  if init_checkpoint:
    flags_.append("--init_checkpoint=" + init_checkpoint)
  threads = ["--intra_op_threads=%d" % FLAGS.intra_op_threads,
             "--inter_op_threads=%d" % FLAGS.inter_op_threads]
  if engine == "horovod":
    launcher = ["horovodrun", "-np", str(ranks), "-H", "localhost:%d" % ranks]
    return [(launcher + FLAGS.horovod_args.split() + flags_ + ["--horovod"] + threads, {})]
  if engine == "mirrored":
    # One process for all replicas: the threads of `ranks` ranks.
    return [(flags_ + ["--distribution=mirrored", "--cpu_devices=%d" % ranks,
                       "--intra_op_threads=%d" % (ranks * FLAGS.intra_op_threads),
                       "--inter_op_threads=%d" % (ranks * FLAGS.inter_op_threads)], {})]
  workers = ["localhost:%d" % port for port in processes.free_ports(ranks)]
  return [(flags_ + ["--distribution=multi_worker_mirrored"] + threads,
           {"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                     "task": {"type": "worker", "index": i}})})
          for i in range(ranks)]


def start_training(model, ranks, cache_dir, config_file, init_checkpoint, settings, tag,
                   engine="horovod"):
  """Starts one training run; returns (children, log path of the first, output dir)."""
  output_dir = temporary_folder("scaling-%s-%s-" % (model, tag))
  log_path = os.path.join(FLAGS.out_dir, "logs", "scaling-%s-%s.log" % (model, tag))
  children = []
  for i, (command, env) in enumerate(training_commands(
      engine, ranks, cache_dir, config_file, init_checkpoint, output_dir, settings)):
    log("%s, %s: %s%s" % (model, tag, "".join("%s=%s " % kv for kv in env.items()),
                          " ".join(command)))
    with open(log_path if i == 0 else "%s.%d" % (log_path, i), "w") as log_file:
      children.append(start_child(command, cwd=ROOT, env=dict(run_env(), **env),
                                  stdout=log_file, stderr=subprocess.STDOUT))
  return children, log_path, output_dir


def finish_training(children, log_path, output_dir):
  """Waits for a run; returns its FPS (all ranks) and the time of its evaluation, or an
  error."""
  status = max([wait_child(process) for process in children])
  remove_folder(output_dir)
  with open(log_path) as f:
    text = f.read()
  found, eval_time = THROUGHPUT.findall(text), EVAL_TIME.findall(text)
  if status != 0 or not found or not eval_time:
    return {"error": "exit status %d, see %s" % (status, log_path)}
  compute = COMPUTE.findall(text)
  return {"fps": float(found[-1]), "eval_s": float(eval_time[-1]),
          "compute": compute[-1] if compute else None, "log": log_path}


def repeated(run_once):
  """Runs a measurement --repeats times: the first error, or the last run's result with
  "fps" and "eval_s" the means of all runs and "fps_runs" every run's FPS."""
  results = [run_once() for _ in range(FLAGS.repeats)]
  for result in results:
    if "error" in result:
      return result
  return dict(results[-1], fps=statistics.mean(r["fps"] for r in results),
              eval_s=statistics.mean(r["eval_s"] for r in results),
              fps_runs=[r["fps"] for r in results])


_DONE = {}  # (model, ranks, engine, args) -> the result: a run two tables share runs once


def run_training(model, ranks, *args, engine="horovod", tag=None):
  """One job of `ranks` replicas with `engine` (--repeats times); args: start_training's
  (cache_dir, config_file, init_checkpoint, settings). A job already run gives its result
  again."""
  tag = tag or ("np%d" % ranks if engine == "horovod" else "np%d-%s" % (ranks, engine))
  key = (model, ranks, engine) + args
  if key in _DONE:
    log("%s, %s: the same run as %s, its result taken"
        % (model, tag, _DONE[key].get("log", "an earlier one")))
  else:
    _DONE[key] = repeated(lambda: finish_training(*start_training(
        model, ranks, *args, tag=tag, engine=engine)))
  return _DONE[key]


def run_independent(model, copies, *args):
  """`copies` single-rank jobs at once, sharing the machine but never all-reducing with
  each other: their summed FPS is what N ranks could reach without the all-reduce."""
  started = [start_training(model, 1, *args, tag="%dx1-%d" % (copies, i))
             for i in range(copies)]
  results = [finish_training(*s) for s in started]
  errors = [r["error"] for r in results if "error" in r]
  if errors:
    return {"error": errors[0]}
  return {"fps": sum(r["fps"] for r in results),
          "eval_s": max(r["eval_s"] for r in results), "compute": results[0]["compute"]}


def model_settings(model, batch=None, amp=False):
  """(batch per rank, steps, warm-up steps, amp) of a model's runs."""
  default_batch, steps, warmup = DEFAULTS[model]
  return (batch or FLAGS.train_batch_size or default_batch, FLAGS.num_train_steps or steps,
          FLAGS.fps_warmup_steps or warmup, amp)


def speed_runs(model, cache_dir, config_file, init_checkpoint):
  """The seed's speed table for one model: {"<ranks>-<precision>-<batch>": result}."""
  runs = {}
  for batch in [int(b) for b in FLAGS.batch_sizes] or SPEED_BATCHES[model]:
    for precision in FLAGS.precisions:
      settings = model_settings(model, batch, amp=precision == "amp")
      for ranks in (1, 2):
        runs["%d-%s-%d" % (ranks, precision, batch)] = run_training(
            model, ranks, cache_dir, config_file, init_checkpoint, settings,
            tag="np%d-%s-b%d" % (ranks, precision, batch))
  return runs


# ---------------------------------------------------------------------------------------
# The largest batch that fits

def memory_limit_gib(flag_value, device_files):
  """The GiB a trial's tensors may take on a CPU (0: no limit): the flag, or for -1, no
  limit where a GPU's device file exists (the card's memory is the limit), else 8."""
  if flag_value >= 0:
    return flag_value
  return 0 if device_files else 8


def gpu_device_files():
  return glob.glob("/dev/nvidia[0-9]*") + glob.glob("/dev/iluvatar[0-9]*")


def make_records(cache_dir, seq):
  """TFRecords of the demo's training text at sequence `seq` (the demo's own are 128)."""
  if seq == 128:
    return os.path.join(cache_dir, "train")
  folder = os.path.join(cache_dir, "train%d" % seq)
  if not os.path.isdir(folder):
    log_path = os.path.join(FLAGS.out_dir, "logs", "scaling-records%d.log" % seq)
    with open(log_path, "w") as log_file:
      check_child(run_child(
          [sys.executable, "-m", "bert_pretrain.create_pretraining_data",
           "--input_file=" + os.path.join(cache_dir, "text", "train.txt"),
           "--output_file=" + os.path.join(folder + ".tmp", "part-00000-of-00001"),
           "--vocab_file=" + os.path.join(cache_dir, "vocab.txt"),
           "--max_seq_length=%d" % seq, "--max_predictions_per_seq=%d" % PREDICTIONS[seq],
           "--dupe_factor=1"], cwd=ROOT, env=run_env(), stdout=log_file,
          stderr=subprocess.STDOUT), "the records of sequence %d" % seq, log_path)
    os.rename(folder + ".tmp", folder)
  return folder


def try_batch(model, config_file, train_dir, seq, batch, limit_gib):
  """One training step of `batch` sequences in one process: "fits", "out of memory" (or
  "out of memory (crash)", below) or another failure ("exit status N, see LOG")."""
  def run(env, tag):
    output_dir = temporary_folder("scaling-%s-max-batch-" % model)
    log_path = os.path.join(FLAGS.out_dir, "logs",
                            "scaling-%s-seq%d-b%d%s.log" % (model, seq, batch, tag))
    command = pretraining_command(train_dir, config_file, output_dir, seq, batch, 1, 0) + [
        "--nodo_eval", "--intra_op_threads=%d" % FLAGS.intra_op_threads,
        "--inter_op_threads=%d" % FLAGS.inter_op_threads]
    with open(log_path, "w") as log_file:
      status = run_child(command, cwd=ROOT, env=env, stdout=log_file,
                         stderr=subprocess.STDOUT)
    remove_folder(output_dir)
    with open(log_path) as f:
      return status, f.read(), log_path

  log("%s seq %d: batch %d%s" % (model, seq, batch,
                                 " in %g GiB" % limit_gib if limit_gib else ""))
  env = run_env()
  if limit_gib:
    # TensorFlow's CPU tensors from a BFC allocator of that size, as on a GPU: a tensor
    # beyond it raises ResourceExhaustedError.
    env.update(TF_CPU_ALLOCATOR_USE_BFC="true",
               TF_CPU_BFC_MEM_LIMIT_IN_MB=str(int(limit_gib * 1024)))
  status, text, log_path = run(env, "")
  if status == 0:
    return "fits"
  if OUT_OF_MEMORY.search(text) or status in (-9, 137):
    return "out of memory"
  if limit_gib and status in (-signal.SIGSEGV, -signal.SIGABRT):
    # Just past the limit, some allocations are not checked and the process crashes
    # instead of reporting; when the same batch runs without the limit, the limit did it.
    log("%s seq %d: batch %d crashed inside the limit; again without it" % (
        model, seq, batch))
    if run(run_env(), "-nolimit")[0] == 0:
      return "out of memory (crash)"
  return "exit status %d, see %s" % (status, log_path)


def largest_batch(attempt, cap):
  """The largest batch b <= cap for which attempt(b) is "fits", found by doubling from 1
  to the first that does not fit, then halving the gap until it is within 1/8 of the
  largest that fits. Returns {"batch": b (0: not even 1), "tried": {b: outcome}} and,
  when a trial failed otherwise than for memory, "error"."""
  tried = {}

  def fits(batch):
    tried[batch] = attempt(batch)
    if tried[batch] != "fits" and not tried[batch].startswith("out of memory"):
      raise RuntimeError(tried[batch])
    return tried[batch] == "fits"

  good, bad = 0, None
  try:
    batch = 1
    while batch <= cap and fits(batch):
      good, batch = batch, batch * 2
    bad = batch if batch <= cap else None
    while bad is not None and bad - good > max(1, good // 8):
      middle = (good + bad) // 2
      if fits(middle):
        good = middle
      else:
        bad = middle
  except RuntimeError as e:
    return {"batch": good, "tried": tried, "error": str(e)}
  return {"batch": good, "tried": tried, "capped": bad is None}


def max_batch_rows(models, cache_dir):
  limit_gib = memory_limit_gib(FLAGS.memory_limit_gib, gpu_device_files())
  rows = []
  for seq in [int(s) for s in FLAGS.max_batch_seq_lengths]:
    train_dir = make_records(cache_dir, seq)
    for model in FLAGS.models:
      config_file = models[model][0]
      found = largest_batch(
          lambda b: try_batch(model, config_file, train_dir, seq, b, limit_gib),
          FLAGS.max_batch_limit)
      rows.append(dict(found, model=model, seq=seq, limit_gib=limit_gib))
      log("%s seq %d: largest batch %s" % (model, seq, json.dumps(found)))
  return rows


def efficiency(fps_n, fps_1, n=2):
  return fps_n / (n * fps_1) if fps_n and fps_1 else None


def markdown(rows, load_average):
  engines = [e for e in ENGINES if e != "horovod" and e in FLAGS.engines]
  lines = ["# Scaling on this machine", "",
           "%d cores, %d intra / %d inter-op threads a rank, horovodrun %s, load average "
           "%.1f at the start." % (os.cpu_count(), FLAGS.intra_op_threads,
                                   FLAGS.inter_op_threads, FLAGS.horovod_args, load_average)]
  if not rows:
    return "\n".join(lines) + "\n"
  lines += ["Efficiency = FPS(2 ranks) / (2 x FPS(1 rank)), 1 rank being a 1-rank Horovod "
            "job. Eval: seconds of the final evaluation of the demo's eval set.",
            "",
            "| model | batch/rank | 1 rank sent/s | 2 ranks sent/s | efficiency | "
            "2 x 1 rank at once sent/s | efficiency without all-reduce | " +
            "".join("2 %s sent/s | efficiency | " % e for e in engines) +
            "eval s 1 rank | eval s 2 ranks |",
            "|---|---|---|---|---|---|---|" + "---|---|" * len(engines) + "---|---|"]
  for row in rows:
    cells = [row["model"], str(row["batch"])]
    fps = {}
    for name in ["1", "2", "2x1"] + ["2-" + e for e in engines]:
      result = row["runs"].get(name, {})
      fps[name] = result.get("fps")
      if fps[name] is None and "error" not in result:
        cells.append("-")  # Not run.
      elif fps[name] is None:
        cells.append("failed: " + result["error"])
      else:
        cells.append("%.2f" % fps[name])
      if name != "1":
        value = efficiency(fps[name], fps["1"])
        cells.append("%.0f%%" % (100 * value) if value else "-")
    for name in ("1", "2"):
      seconds = row["runs"].get(name, {}).get("eval_s")
      cells.append("%.2f" % seconds if seconds is not None else "-")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def speed_markdown(rows):
  """The seed's table: a model's sentences/s by ranks (rows) x precision and batch."""
  lines = []
  for row in rows:
    columns = sorted({key.split("-", 1)[1] for key in row["runs"]},
                     key=lambda c: (FLAGS.precisions.index(c.split("-")[0]),
                                    int(c.split("-")[1])))
    lines += ["", "%s, sentences/s (%d steps, the first %d left out):"
              % (row["model"], row["steps"], row["warmup"]), "",
              "| ranks | " + " | ".join("%s (batch %s)" % tuple(c.split("-"))
                                       for c in columns) + " |",
              "|---|" + "---|" * len(columns)]
    for ranks in (1, 2):
      cells = []
      for column in columns:
        result = row["runs"]["%d-%s" % (ranks, column)]
        cells.append("%.2f" % result["fps"] if "fps" in result
                     else "failed: " + result["error"])
      lines.append("| %d | %s |" % (ranks, " | ".join(cells)))
  return "\n".join(lines) + "\n"


def max_batch_markdown(rows):
  lines = ["", "The largest batch per card (1 rank, one training step, fp32; doubling, "
           "then halving the gap to within 1/8). OOM: TensorFlow's out-of-memory error; "
           "OOM (crash): died by SIGSEGV or SIGABRT inside the limit, and ran without it:", "",
           "| model | seq | memory | largest batch that fits | tried |", "|---|---|---|---|---|"]
  for row in rows:
    largest = "%d" % row["batch"]
    if row.get("capped"):
      largest = ">= %d (--max_batch_limit)" % row["batch"]
    if "error" in row:
      largest += " (search stopped: %s)" % row["error"]
    tried = ", ".join("%s %s" % (b, {"fits": "fits", "out of memory": "OOM",
                                     "out of memory (crash)": "OOM (crash)"}.get(
                                         outcome, "failed"))
                      for b, outcome in sorted(row["tried"].items(), key=lambda i: int(i[0])))
    memory = "%g GiB of tensors" % row["limit_gib"] if row["limit_gib"] else "the card's"
    lines.append("| %s | %d | %s | %s | %s |" % (row["model"], row["seq"], memory, largest,
                                                 tried))
  return "\n".join(lines) + "\n"


def main(argv):
  if len(argv) > 1:
    errors.unexpected_arguments("scaling", argv[1:])
  for name, values, known in (("models", FLAGS.models, DEFAULTS),
                              ("engines", FLAGS.engines, ENGINES),
                              ("tables", FLAGS.tables, TABLES),
                              ("precisions", FLAGS.precisions, PRECISIONS),
                              ("max_batch_seq_lengths", FLAGS.max_batch_seq_lengths,
                               [str(seq) for seq in PREDICTIONS])):
    for value in values:
      if value not in known:
        errors.usage_error("scaling", "--%s: unknown %r; use %s" % (name, value, ", ".join(
            map(str, known))))
  for value in FLAGS.batch_sizes:
    if not value.isdigit() or int(value) < 1:
      errors.usage_error("scaling", "--batch_sizes: %r is not a positive whole number" % value)
  for name in ("train_batch_size", "num_train_steps", "fps_warmup_steps", "intra_op_threads",
               "inter_op_threads"):
    if FLAGS[name].value < 0:
      errors.usage_error("scaling", "--%s=%d; pass 0 (%s) or more" % (
          name, FLAGS[name].value,
          "chosen for the host" if "threads" in name else "the model's own"))
  # The runs start in the checkout: a relative folder is the caller's.
  FLAGS.out_dir = os.path.abspath(FLAGS.out_dir)
  for model in FLAGS.models:
    if "engines" in FLAGS.tables or "speed" in FLAGS.tables:
      _, steps, warmup, _ = model_settings(model)
      # The first update after the warm-up is traced and left out too; with no update
      # after it the run's FPS is the average with the warm-up's overhead.
      if steps < warmup + 2:
        # 0 is not a lower warm-up: it means the model's own.
        fewer = (", or --fps_warmup_steps=%d or fewer (0 is %s's %d)"
                 % (steps - 2, model, DEFAULTS[model][2]) if steps > 2 else "")
        errors.usage_error("scaling", "--num_train_steps: %s's runs train %d steps, which "
                           "leaves no update after the %d warm-up steps (--fps_warmup_steps) "
                           "and the traced one; pass --num_train_steps=%d or more%s"
                           % (model, steps, warmup, warmup + 2, fewer))
  check_horovod_args(FLAGS.horovod_args.split(), launch.horovodrun_options())
  errors.make_output_folders("scaling", "--out_dir", FLAGS.out_dir, ("logs", "scaling_demo"))
  errors.take_stop_signals()
  try:
    failed, total = measure()
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM's errors.Terminated
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
    end_children()
    sys.exit(errors.stopped_by_signal(
        "scaling", e, "its training runs are ended and their temporary folders removed; "
        "run the same command again (the demo's data in %s is kept)"
        % os.path.join(FLAGS.out_dir, "scaling_demo")))
  finally:
    end_children()
  if failed:
    errors.print_error("scaling", "%d of %d measurements failed; their cells say why and "
                       "name their logs in %s" % (failed, total,
                                                  os.path.join(FLAGS.out_dir, "logs")))
    sys.exit(1)


def check_horovod_args(words, options):
  """Refuses --horovod_args options that horovodrun does not take (options: launch's
  horovodrun_options(); {} where Horovod does not import, and the runs will say so).
  Other words are values: horovodrun's help does not say how many each option takes."""
  if not options:
    return
  after_option = False  # the word before was an option that takes a value
  for index, word in enumerate(words):
    option = word.split("=", 1)[0]
    if word.startswith("-") and not re.match(r"^-\d", word) and not after_option:
      if option not in options:
        errors.usage_error("scaling", "--horovod_args: %s is no option of horovodrun; pass "
                           "its options (horovodrun --help lists them), e.g. "
                           "--horovod_args=--gloo" % word)
      after_option = options[option] and "=" not in word
      if after_option and index + 1 == len(words):
        errors.usage_error("scaling", "--horovod_args: horovodrun's %s takes a value; pass "
                           "it after the option, e.g. --horovod_args='--gloo %s VALUE'"
                           % (option, option))
    else:
      after_option = False


def measure():
  """Runs the tables' jobs and writes them; returns (measurements failed, measured)."""
  load_average = os.getloadavg()[0]
  cache_dir = os.path.join(FLAGS.out_dir, "scaling_demo")
  models = prepare_demo(cache_dir)
  results = {"engines": [], "speed": [], "max_batch": []}
  for model in FLAGS.models:
    config_file, init_checkpoint = models[model]
    settings = model_settings(model)
    if "engines" in FLAGS.tables:
      args = (cache_dir, config_file, init_checkpoint, settings)
      runs = {"1": run_training(model, 1, *args)}
      if "horovod" in FLAGS.engines:
        runs["2"] = run_training(model, 2, *args)
      if FLAGS.independent:
        runs["2x1"] = repeated(lambda: run_independent(model, 2, *args))
      for engine in FLAGS.engines:
        if engine != "horovod":
          runs["2-" + engine] = run_training(model, 2, *args, engine=engine)
      results["engines"].append({"model": model, "batch": settings[0], "steps": settings[1],
                                 "warmup": settings[2], "runs": runs})
      log("%s: %s" % (model, json.dumps(runs)))
    if "speed" in FLAGS.tables:
      results["speed"].append({"model": model, "steps": settings[1], "warmup": settings[2],
                               "runs": speed_runs(model, cache_dir, config_file,
                                                  init_checkpoint)})
  if "max_batch" in FLAGS.tables:
    results["max_batch"] = max_batch_rows(models, cache_dir)
  table = markdown(results["engines"], load_average)
  if results["speed"]:
    table += speed_markdown(results["speed"])
  if results["max_batch"]:
    table += max_batch_markdown(results["max_batch"])
  table += "\nLoad average %.1f at the start, %.1f at the end.\n" % (
      load_average, os.getloadavg()[0])
  print(table)
  with open(os.path.join(FLAGS.out_dir, "scaling.md"), "w") as f:
    f.write(table)
  with open(os.path.join(FLAGS.out_dir, "scaling.json"), "w") as f:
    json.dump(results, f, indent=1)
  written = write_card(results, models)
  for line in card.published_lines(written):
    print("Published beside ours: " + line)
  print("Written: %s/scaling.md, scaling.json, scaling_card.json" % FLAGS.out_dir,
        flush=True)
  measured = [r for row in results["engines"] + results["speed"] for r in row["runs"].values()
              ] + results["max_batch"]
  return sum("error" in r for r in measured), len(measured)


def run_config(model, config_file, init_checkpoint, ranks, engine, batch, precision, steps,
               warmup, compute):
  """What a run measured, as a user chooses it (the card's config)."""
  with open(config_file) as f:
    bert = json.load(f)
  config = {"tool": "bench.scaling",
            "model": {"name": model, "layers": bert["num_hidden_layers"],
                      "hidden": bert["hidden_size"], "heads": bert["num_attention_heads"],
                      "intermediate": bert["intermediate_size"], "vocab": bert["vocab_size"]},
            "seq": 128, "predictions": PREDICTIONS[128], "batch_per_rank": batch,
            "ranks": ranks, "engine": engine, "precision": precision, "compute": compute,
            "steps": steps, "fps_warmup_steps": warmup,
            "intra_op_threads": FLAGS.intra_op_threads,
            "inter_op_threads": FLAGS.inter_op_threads,
            "data": "the demo's TFRecords",
            "weights": "the demo's init checkpoint" if init_checkpoint else "random"}
  if engine == "horovod":
    config["horovod_args"] = FLAGS.horovod_args
  return config


def write_card(results, models):
  """scaling_card.json (bench/card.py): every run of the engines and speed tables, the
  --repeats runs of each as its repeats."""
  env = card.environment()
  published = card.load_published()
  entries = []

  def add(name, measured, model, ranks, engine, batch, precision, steps, warmup):
    if "error" in measured or "fps" not in measured:
      return
    config = run_config(model, models[model][0], models[model][1], ranks, engine, batch,
                        precision, steps, warmup, measured.get("compute"))
    entries.append(card.entry(name, config, measured.get("fps_runs", [measured["fps"]]),
                              ranks, env, published))
  for row in results["engines"]:
    precision = "fp32"  # model_settings' default: the engines table runs --noamp
    for key, measured in sorted(row["runs"].items()):
      ranks = int(key[0])
      engine = key.split("-", 1)[1] if "-" in key else (
          "independent" if key == "2x1" else "horovod")
      add("%s %s" % (row["model"], {"1": "1 rank", "2": "2 ranks", "2x1": "2 x 1 rank at once"}
                     .get(key, "2 ranks " + engine)), measured, row["model"], ranks, engine,
          row["batch"], precision, row["steps"], row["warmup"])
  for row in results["speed"]:
    for key, measured in sorted(row["runs"].items()):
      ranks, precision, batch = key.split("-")
      add("%s %s ranks %s batch %s" % (row["model"], ranks, precision, batch), measured,
          row["model"], int(ranks), "horovod", int(batch), precision, row["steps"],
          row["warmup"])
  return card.write_card(os.path.join(FLAGS.out_dir, "scaling_card.json"), "bench.scaling",
                         card.tool_flags(FLAGS, "models"), entries, env)


if __name__ == "__main__":
  errors.run_main("scaling", main)
