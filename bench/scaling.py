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
also goes to --out_dir/scaling.md (+ .json).

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
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

from bert_pretrain import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MEDIUM_CONFIG = {
    "vocab_size": 4096, "hidden_size": 512, "num_hidden_layers": 8,
    "num_attention_heads": 8, "intermediate_size": 2048, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
}
# model -> (batch per rank, training steps, warm-up steps left out of the FPS)
DEFAULTS = {"tiny": (32, 60, 10), "medium": (8, 24, 6)}
ENGINES = ("horovod", "mirrored", "multi_worker_mirrored")
THROUGHPUT = re.compile(r"Throughput Average \(sentences/sec\) = ([0-9.]+)")
EVAL_TIME = re.compile(r"eval time: ([0-9.]+) s")

flags.DEFINE_list("models", ["tiny", "medium"], "Models to run: tiny (the demo's), medium.")
flags.DEFINE_bool("independent", True, "Also run 2 single-rank jobs at once (no all-reduce "
                  "between them): the efficiency the shared machine allows without it.")
flags.DEFINE_integer("train_batch_size", 0, "Sentences per step on each rank (0: per model).")
flags.DEFINE_integer("num_train_steps", 0, "Training steps per run (0: per model).")
flags.DEFINE_integer("fps_warmup_steps", 0, "Steps left out of the FPS (0: per model).")
flags.DEFINE_integer("intra_op_threads", 1, "Threads per op in each rank.")
flags.DEFINE_integer("inter_op_threads", 1, "Ops run at once in each rank.")
flags.DEFINE_string("horovod_args", "--gloo", "Controller flags for horovodrun (--gloo, --mpi).")
flags.DEFINE_list("engines", list(ENGINES), "Engines of the 2-rank runs: %s."
                  % ", ".join(ENGINES))
flags.DEFINE_string("out_dir", os.path.join(ROOT, "bench_results"),
                    "Where the demo data, the logs and the table go.")
FLAGS = flags.FLAGS


def log(message):
  print("[scaling] " + message, file=sys.stderr, flush=True)


def prepare_demo(cache_dir):
  """The demo's vocab, TFRecords, bert_config.json and init checkpoint (cached)."""
  with open(os.path.join(FLAGS.out_dir, "logs", "scaling-demo.log"), "w") as log_file:
    subprocess.check_call([sys.executable, "-m", "bert_pretrain.demo",
                           "--cache_dir=" + cache_dir], cwd=ROOT, env=run_env(),
                          stdout=log_file, stderr=subprocess.STDOUT)
  medium_config = os.path.join(cache_dir, "bert_config_medium.json")
  with open(medium_config, "w") as f:
    json.dump(MEDIUM_CONFIG, f, indent=2)
  return {"tiny": (os.path.join(cache_dir, "bert_config.json"),
                   os.path.join(cache_dir, "init", "model.ckpt-0")),
          "medium": (medium_config, None)}


def run_env():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
  if os.getuid() == 0:
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
  return env


def training_commands(engine, ranks, cache_dir, config_file, init_checkpoint, output_dir,
                      settings):
  """The processes of one run: a list of (command, environment variables to add)."""
  batch, steps, warmup = settings
  flags_ = [sys.executable, "-m", "bert_pretrain.run_pretraining",
            "--input_files_dir=" + os.path.join(cache_dir, "train"),
            "--bert_config_file=" + config_file, "--output_dir=" + output_dir,
            # One evaluation, at the end, of the demo's eval set shared by the ranks.
            "--eval_files_dir=" + os.path.join(cache_dir, "eval"),
            "--samples_start_eval=%d" % 10 ** 15, "--eval_batch_size=64",
            "--max_seq_length=128", "--max_predictions_per_seq=20",
            "--train_batch_size=%d" % batch, "--num_train_steps=%d" % steps,
            "--fps_warmup_steps=%d" % warmup, "--display_loss_steps=%d" % steps,
            "--save_checkpoints_steps=100000", "--stop_threshold=0", "--learning_rate=1e-4"]
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
  workers = ["localhost:%d" % port for port in launch.free_ports(ranks)]
  return [(flags_ + ["--distribution=multi_worker_mirrored"] + threads,
           {"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                     "task": {"type": "worker", "index": i}})})
          for i in range(ranks)]


def start_training(model, ranks, cache_dir, config_file, init_checkpoint, settings, tag,
                   engine="horovod"):
  """Starts one training run; returns (processes, log path of the first, output dir)."""
  output_dir = tempfile.mkdtemp(prefix="scaling-%s-%s-" % (model, tag))
  log_path = os.path.join(FLAGS.out_dir, "logs", "scaling-%s-%s.log" % (model, tag))
  processes = []
  for i, (command, env) in enumerate(training_commands(
      engine, ranks, cache_dir, config_file, init_checkpoint, output_dir, settings)):
    log("%s, %s: %s%s" % (model, tag, "".join("%s=%s " % kv for kv in env.items()),
                          " ".join(command)))
    with open(log_path if i == 0 else "%s.%d" % (log_path, i), "w") as log_file:
      processes.append(subprocess.Popen(command, cwd=ROOT, env=dict(run_env(), **env),
                                        stdout=log_file, stderr=subprocess.STDOUT))
  return processes, log_path, output_dir


def finish_training(processes, log_path, output_dir):
  """Waits for a run; returns its FPS (all ranks) and the time of its evaluation, or an
  error."""
  status = max(process.wait() for process in processes)
  shutil.rmtree(output_dir, ignore_errors=True)
  with open(log_path) as f:
    text = f.read()
  found, eval_time = THROUGHPUT.findall(text), EVAL_TIME.findall(text)
  if status != 0 or not found or not eval_time:
    return {"error": "exit status %d, see %s" % (status, log_path)}
  return {"fps": float(found[-1]), "eval_s": float(eval_time[-1])}


def run_training(model, ranks, *args, engine="horovod"):
  """One job of `ranks` replicas with `engine`."""
  tag = "np%d" % ranks if engine == "horovod" else "np%d-%s" % (ranks, engine)
  return finish_training(*start_training(model, ranks, *args, tag=tag, engine=engine))


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
          "eval_s": max(r["eval_s"] for r in results)}


def model_settings(model):
  batch, steps, warmup = DEFAULTS[model]
  return (FLAGS.train_batch_size or batch, FLAGS.num_train_steps or steps,
          FLAGS.fps_warmup_steps or warmup)


def efficiency(fps_n, fps_1, n=2):
  return fps_n / (n * fps_1) if fps_n and fps_1 else None


def markdown(rows, load_average):
  engines = [e for e in ENGINES if e != "horovod" and e in FLAGS.engines]
  lines = ["# Scaling on this machine", "",
           "%d cores, %d intra / %d inter-op threads a rank, horovodrun %s, load average "
           "%.1f at the start. Efficiency = FPS(2 ranks) / (2 x FPS(1 rank)), 1 rank "
           "being a 1-rank Horovod job. Eval: seconds of the final evaluation of the "
           "demo's eval set." % (os.cpu_count(), FLAGS.intra_op_threads,
                                 FLAGS.inter_op_threads, FLAGS.horovod_args, load_average),
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("unexpected arguments: %s" % " ".join(argv[1:]))
  for model in FLAGS.models:
    if model not in DEFAULTS:
      raise app.UsageError("--models: unknown %r; use tiny, medium" % model)
  for engine in FLAGS.engines:
    if engine not in ENGINES:
      raise app.UsageError("--engines: unknown %r; use %s" % (engine, ", ".join(ENGINES)))
  for sub in ("logs", "scaling_demo"):
    if not os.path.isdir(os.path.join(FLAGS.out_dir, sub)):
      os.makedirs(os.path.join(FLAGS.out_dir, sub))
  load_average = os.getloadavg()[0]
  cache_dir = os.path.join(FLAGS.out_dir, "scaling_demo")
  models = prepare_demo(cache_dir)
  rows = []
  for model in FLAGS.models:
    config_file, init_checkpoint = models[model]
    settings = model_settings(model)
    args = (cache_dir, config_file, init_checkpoint, settings)
    runs = {"1": run_training(model, 1, *args)}
    if "horovod" in FLAGS.engines:
      runs["2"] = run_training(model, 2, *args)
    if FLAGS.independent:
      runs["2x1"] = run_independent(model, 2, *args)
    for engine in FLAGS.engines:
      if engine != "horovod":
        runs["2-" + engine] = run_training(model, 2, *args, engine=engine)
    rows.append({"model": model, "batch": settings[0], "steps": settings[1],
                 "warmup": settings[2], "runs": runs})
    log("%s: %s" % (model, json.dumps(runs)))
  table = markdown(rows, load_average)
  print(table)
  with open(os.path.join(FLAGS.out_dir, "scaling.md"), "w") as f:
    f.write(table)
  with open(os.path.join(FLAGS.out_dir, "scaling.json"), "w") as f:
    json.dump(rows, f, indent=1)


if __name__ == "__main__":
  app.run(main)
