"""bench/benchmark.py: the FLOP count matches the model's matmuls; a one-row run of every
side writes its table and JSON; Google's peer (bench/google_peer.py, bert-tensorflow)
builds and trains, its amp is a real bfloat16 rewrite, and its layer_norm stand-in is
contrib's.

CI installs bert-tensorflow (.ci/run); without it the tests of Google's step skip and say
how to install it."""

import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import types

import numpy as np
import pytest

from bench import card
from bench import google_peer
from bert_pretrain.distributed import device
from bert_pretrain.distributed import stacks
from bert_pretrain.model import kernels as fused_kernels
from conftest import gone
from conftest import signal_when

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_google = pytest.mark.skipif(not google_peer.available(), reason=google_peer.HINT)


@pytest.fixture(scope="module")
def bench_module():
  # Imported once per process: its module-level flags cannot be defined twice.
  from bench import benchmark  # pylint: disable=g-import-not-at-top
  return benchmark


def test_encoder_flops_count_every_dense_kernel_of_the_model(bench_module):
  import tensorflow.compat.v1 as tf
  from bert_pretrain.data import input_pipeline
  from bert_pretrain.model import modeling
  from bert_pretrain.training import pretraining
  seq, preds, batch = 16, 3, 2
  config = modeling.BertConfig.from_dict(bench_module.bert_config_dict("tiny", vocab_size=50))
  with tf.Graph().as_default():
    features = input_pipeline.constant_features(batch, seq, preds)
    pretraining.build_model(config, features, True, tf.float32)
    kernels = {v.op.name: v.shape.num_elements() for v in tf.trainable_variables()
               if v.op.name.endswith("kernel")}
  # Every position goes through every kernel, but in the last layer only the keys and
  # values: its other kernels see the [CLS] and the masked positions.
  last = "layer_%d/" % (config.num_hidden_layers - 1)
  encoder = sum(seq * n if last not in name or "/key/" in name or "/value/" in name
                else (1 + preds) * n for name, n in kernels.items() if "/encoder/" in name)
  flops = bench_module.train_flops_per_sequence("tiny", seq, preds, vocab_size=50)
  assert flops["encoder_dense"] == 3 * 2 * encoder
  # With 10 real tokens a sequence, the dense layers run on those rows only.
  unpadded = sum(10 * n if last not in name or "/key/" in name or "/value/" in name
                 else (1 + preds) * n for name, n in kernels.items() if "/encoder/" in name)
  fewer = bench_module.train_flops_per_sequence("tiny", seq, preds, vocab_size=50, tokens=10)
  assert fewer["encoder_dense"] == 3 * 2 * unpadded
  # And the attention among a sequence's real tokens: the last layer's 1 + preds queries.
  layers, hidden = config.num_hidden_layers, config.hidden_size
  assert flops["attention"] == 3 * 4 * hidden * ((layers - 1) * seq * seq + (1 + preds) * seq)
  assert fewer["attention"] == 3 * 4 * hidden * ((layers - 1) * 100 + (1 + preds) * 10)
  spread = bench_module.train_flops_per_sequence("tiny", seq, preds, vocab_size=50, tokens=10,
                                                 tokens_squared=120)
  assert spread["attention"] - fewer["attention"] == 3 * 4 * hidden * (layers - 1) * 20
  # The MLM head: its transform kernel and the tied [vocab, hidden] projection.
  transform = kernels["cls/predictions/transform/dense/kernel"]
  assert flops["mlm_head"] == 3 * 2 * preds * (transform + 50 * 128)
  assert flops["total"] == sum(v for k, v in flops.items() if k != "total")


CPUINFO = """processor\t: 0
vendor_id\t: SomeVendor
{numbers}model name\t: {model}
flags\t\t: fpu sse2 avx2 {flags}

processor\t: 1
model name\t: {model}
flags\t\t: fpu sse2 avx2 {flags}
"""


@pytest.mark.parametrize("model, numbers, flags, expected", [
    ("AMD EPYC", (26, 2), "avx512f avx512_bf16 avx512_vnni",
     "AMD EPYC, family 26 model 2 (avx512f, avx512_bf16)"),
    ("Intel(R) Xeon(R) Platinum 8480+", (6, 143), "avx512f avx512_bf16 amx_bf16 amx_tile",
     "Intel(R) Xeon(R) Platinum 8480+, family 6 model 143 (avx512f, avx512_bf16, amx_bf16)"),
    ("Intel(R) Core(TM) i7", None, "fma", "Intel(R) Core(TM) i7 (no AVX-512)"),
])
def test_the_machine_line_names_the_cpu_and_its_matmul_extensions(tmp_path, model, numbers,
                                                                  flags, expected):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text(CPUINFO.format(model=model, flags=flags, numbers="cpu family\t: %d\n"
                                    "model\t\t: %d\n" % numbers if numbers else ""))
  assert card.cpu_description(str(cpuinfo)) == expected
  assert card.cpu_description(str(tmp_path / "missing")) == platform.machine()
  info = card.cpu_info(str(cpuinfo))
  assert info["model"] == model and info["description"] == expected
  assert info["flags"] == sorted(("fpu sse2 avx2 " + flags).split())


def test_a_negative_window_sequences_is_refused_before_any_work(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "bench.benchmark", "--window_sequences=-1",
       "--out_dir=" + str(tmp_path / "out")],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      cwd=ROOT, timeout=300)
  assert result.returncode != 0
  assert "--window_sequences=-1: -1 is not a non-negative integer" in result.stdout
  assert not os.path.exists(str(tmp_path / "out"))


def run_tool(module, *args, env=None, timeout=300):
  return subprocess.run([sys.executable, "-m", module] + list(args),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        universal_newlines=True, cwd=ROOT, timeout=timeout, env=env)


@pytest.mark.parametrize("module, flag, line", [
    ("bench.benchmark", "--windows=0", "benchmark: error: --windows: 0; use 1 or more"),
    ("bench.benchmark", "--batch_size=-1",
     "benchmark: error: --batch_size: -1; use 0 (each row's default) or more"),
    ("bench.benchmark", "--steps=-2",
     "benchmark: error: --steps: -2; use 0 (as many as fill --window_seconds) or more"),
    ("bench.packing", "--precisions=fp16",
     "bench.packing: error: --precisions: 'fp16' is not fp32 or amp"),
    ("bench.packing", "--configs=huge",
     "bench.packing: error: --configs: unknown 'huge'; use tiny,mini,small,medium,base"),
    ("bench.packing", "--windows=0", "bench.packing: error: --windows: 0; use 1 or more"),
    ("bench.benchmark", "--mlperf_accumulation=0",
     "benchmark: error: --mlperf_accumulation: 0; use 1 or more"),
    ("bench.benchmark", "--intra_threads=0", "benchmark: error: --intra_threads: 0; use 1 or more"),
    ("bench.packing", "--row_timeout=-5",
     "bench.packing: error: --row_timeout: -5; use 1 or more seconds"),
    ("bench.profile_step", "--config=huge", "profile_step: error: --config: unknown 'huge'; "
     "use tiny, mini, small, medium, base, large"),
    ("bench.profile_step", "--seq=256", "profile_step: error: --seq: 256 is not one of 128, 512"),
    ("bench.profile_step", "--traced_steps=0",
     "profile_step: error: --traced_steps: 0; use 1 or more"),
    ("bench.profile_step", "--batch=0", "profile_step: error: --batch: 0; use 1 or more"),
    ("bench.profile_step", "--top_ops=-1", "profile_step: error: --top_ops: -1; use 1 or more"),
    ("bench.profile_step", "--accumulation=0",
     "profile_step: error: --accumulation: 0; use 1 or more"),
])
def test_flags_that_would_measure_nothing_are_refused_in_one_line_before_any_work(
    tmp_path, module, flag, line):
  out_dir = tmp_path / "out"
  result = run_tool(module, flag, "--out_dir=" + str(out_dir))
  assert (result.returncode, result.stdout.splitlines()) == (2, [line])
  assert not out_dir.exists()


@pytest.mark.parametrize("module", ["bench.benchmark", "bench.packing", "bench.profile_step"])
def test_an_out_dir_that_cannot_be_written_is_said_in_one_line_before_any_work(tmp_path,
                                                                               module):
  in_the_way = tmp_path / "a-file"
  in_the_way.write_text("")
  for out_dir in (str(in_the_way / "out"), "/proc/benchmark-out"):
    result = run_tool(module, "--out_dir=" + out_dir)
    assert result.returncode == 2, result.stdout
    assert result.stdout.splitlines() == [
        "%s: error: --out_dir=%s: cannot write %s (%s); pass a folder you can write to" % (
            {"bench.benchmark": "benchmark", "bench.profile_step": "profile_step"}.get(
                module, module), out_dir, out_dir,
            "Not a directory" if out_dir.startswith(str(tmp_path)) else
            "No such file or directory")]


@pytest.fixture(scope="module")
def bench_out(bench_module, tmp_path_factory):
  """An --out_dir whose data/ holds the benchmark's seq-128 TFRecords."""
  out_dir = str(tmp_path_factory.mktemp("bench"))
  bench_module.prepare_data(os.path.join(out_dir, "data"), [128])
  return out_dir


def test_our_step_is_seeded_as_a_run_and_its_replay_reads_the_same_batches_in_every_run(
    bench_module, bench_out):
  row = {"config": "tiny", "seq": 128, "preds": 20, "batch": 4, "precision": "fp32",
         "intra": 2, "inter": 2, "xla": False, "data_dir": os.path.join(bench_out, "data")}
  one, other = bench_module.TrainStep(row), bench_module.TrainStep(row)
  # The same weights, batches and dropout masks: the same losses, step by step.
  losses = []
  for step in (one, other):
    losses.append([])
    for _ in range(2):
      step()
      losses[-1].append(step.loss)
  assert losses[0] == losses[1], losses
  # Its dropout masks are the seeded ones of a run_pretraining run, not TensorFlow's
  # unseeded dropout.
  kinds = {op.type for op in one.graph.get_operations()}
  assert any(kind.startswith("StatelessRandomUniform") or kind == "BertKeepMask"
             for kind in kinds), sorted(kinds)
  assert not kinds & {"RandomUniform", "RandomUniformInt"}, sorted(kinds)
  trained = [one.session.run(one.features) for _ in range(3)]
  for batches in (one.read_batches(5)[2:], other.read_batches(5)[2:]):
    for read, expected in zip(batches, trained):
      assert sorted(read) == sorted(expected)
      for name in expected:
        np.testing.assert_array_equal(read[name], expected[name])
  assert not np.array_equal(trained[0]["input_ids"], trained[1]["input_ids"])


def test_our_step_in_mlperfs_configuration_accumulates_micro_batches_into_one_update(
    bench_module, bench_out):
  import tensorflow.compat.v1 as tf
  row = {"config": "tiny", "seq": 128, "preds": 20, "batch": 2, "precision": "fp32",
         "intra": 2, "inter": 2, "xla": False, "data_dir": os.path.join(bench_out, "data"),
         "accumulation": 3}
  step = bench_module.TrainStep(row)
  step()
  with step.graph.as_default():
    assert step.session.run(tf.train.get_global_step()) == 1
  # The update read three micro-batches: the next one is the replay's fourth.
  fourth = step.read_batches(4)[3]
  np.testing.assert_array_equal(step.session.run(step.features)["input_ids"],
                                fourth["input_ids"])


def test_the_mlperf_row_puts_our_sentences_a_core_beside_intels(bench_module):
  row = dict(config="large", seq=512, precision="amp", batch=4, accumulation=16, cores=2,
             mfu=0.35, ours={"fps_records": 0.64, "rss_gib": 14.8})
  assert bench_module.large_line(row) == (
      "BERT-Large seq 512 amp in MLPerf's configuration (batch 4 x 16 accumulated = 64 an "
      "update): 0.640 sent/s, 0.320 a core on 2 cores (Intel's MLPerf v3.0 on Xeon 8480+: "
      "0.57 a core), 35% of the bfloat16 peak, peak RSS 14.80 GiB.")


def test_a_peers_amp_this_tensorflow_cannot_compute_is_no_failed_measurement(bench_module):
  def cell(*runs):
    return {"runs": list(runs), **({"error": runs[0]["error"]} if "error" in runs[0] else {})}
  ran = cell({"fps": 10.0})
  not_here = cell({"error": "amp: this TensorFlow (1.15.0) has no oneDNN bfloat16 "
                            "auto-mixed-precision rewrite", "not_here": True})
  crashed = cell({"error": "exit status 1, see row.log"})
  rows = [dict({side: None for side, _ in bench_module.SIDES}, ours=ran, google=not_here),
          dict({side: None for side, _ in bench_module.SIDES}, ours=ran, google=crashed)]
  assert bench_module.failed_measurements(rows, []) == (1, 3)
  assert bench_module.failed_measurements(rows[:1], [{"ours": crashed}]) == (1, 2)


def test_one_row_run_of_every_side_writes_table_and_json(bench_out):
  out_dir = bench_out
  # --window_sequences=48 at batch 16: 3 steps a window, in every run of our step.
  result = subprocess.run(
      [sys.executable, "-m", "bench.benchmark", "--configs=tiny", "--seq_lengths=128",
       "--precisions=fp32", "--skip_peer", "--skip_large", "--rounds=1", "--windows=1",
       "--steps=0", "--window_sequences=48", "--warmup_steps=1", "--window_seconds=0.01",
       "--matmul_size=256", "--out_dir=" + out_dir],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      cwd=ROOT, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:]
  assert "| tiny | 128 | 16 | fp32 |" in result.stdout
  # The CPU is named, since the same code gave other ratios on other CPUs.
  assert re.search(r"Machine: .+ \((avx512f|no AVX-512).*\), \d+ cores", result.stdout)
  assert re.search(r"row tiny-seq128-fp32: batch 16, load average [0-9.]+ at its start",
                   result.stdout)
  assert re.search(r"row tiny-seq128-fp32 done, load average [0-9.]+ at its end",
                   result.stdout)
  with open(os.path.join(out_dir, "benchmark.json")) as f:
    results = json.load(f)
  (row,) = results["rows"]
  assert len(row["load_average"]) == 2
  for side in ("ours", "ours_adam"):
    assert row[side]["fps_min"] <= row[side]["fps"] <= row[side]["fps_max"]
    assert row[side]["rounds"] == 1
  assert row["ours"]["optimizer"] == "lamb" and row["ours_adam"]["optimizer"] == "adam"
  assert row["ours"]["fps_records"] > 0 and row["ours"]["fps_memory"] > 0
  # LAMB's and Adam's runs timed the same batches.
  assert row["ours"]["steps_per_window"] == row["ours_adam"]["steps_per_window"] == 3
  assert row["ours"]["tokens_per_sequence"] == row["ours_adam"]["tokens_per_sequence"]
  # The mean square of the lengths is at least the square of their mean.
  assert row["ours"]["tokens_squared_per_sequence"] >= row["tokens_per_sequence"] ** 2
  assert 20 < row["tokens_per_sequence"] <= 128
  assert row["ours"]["rss_gib"] > 0.1
  assert row["hf"] is None and "ours_over_hf" not in row
  assert results["peak"]["fp32"] > 0 and results["peak"]["bf16"] > 0
  # Its TFLOP/s over the float32 peak of the same run (the peak's tiny probe can read
  # low on a loaded machine, so no upper bound here).
  assert row["mfu"] > 0 and row["mfu"] == pytest.approx(row["tflops"] / results["peak"]["fp32"])
  assert os.path.exists(os.path.join(out_dir, "benchmark.md"))
  if google_peer.available():
    google = row["google"]
    assert "error" not in google, google
    assert google["fps"] > 0 and google["bf16_ops"] == 0
    assert math.isfinite(google["loss"]) and google["loss"] < google["first_loss"]
    assert row["ours_over_google"] == row["ours"]["fps"] / google["fps"]
    assert row["ours_adam_over_google"] == row["ours_adam"]["fps"] / google["fps"]
  else:
    assert google_peer.HINT in result.stdout and row["google"] is None
  # The card: the same measurements with their environment, config hash and spread.
  assert "benchmark_card.json" in result.stdout
  with open(os.path.join(out_dir, "benchmark_card.json")) as f:
    written = json.load(f)
  assert written["tool"] == "bench.benchmark" and written["flags"]["configs"] == ["tiny"]
  assert written["flags"]["window_sequences"] == 48
  env = written["environment"]
  import tensorflow as tf
  assert env["versions"]["tensorflow"] == tf.__version__
  assert env["versions"]["horovod"] == __import__("horovod").__version__
  assert env["cpu"]["cores"] == os.cpu_count() and "model" in env["cpu"]
  assert set(card.MATMUL_FLAGS) & set(env["cpu"]["flags"]) or "no AVX-512" in \
      env["cpu"]["description"]
  entries = {e["name"]: e for e in written["entries"]}
  lamb, adam = entries["tiny-seq128-fp32 ours LAMB"], entries["tiny-seq128-fp32 ours Adam"]
  for e, side in ((lamb, "ours"), (adam, "ours_adam")):
    assert e["stats"]["values"] == row[side]["windows"] and e["stats"]["n"] == 1
    assert e["stats"]["mean"] == row[side]["fps"] and e["stats"]["stdev"] is None
    assert e["config_hash"] == card.config_hash(e["config"])
    assert e["published"] == []  # no anchor published BERT-tiny
  assert lamb["config"]["optimizer"] == "lamb" and adam["config"]["optimizer"] == "adam"
  assert lamb["config"]["compute"] == "float32" and lamb["config"]["batch"] == 16
  assert lamb["config_hash"] != adam["config_hash"]
  assert ("tiny-seq128-fp32 Google" in entries) == google_peer.available()


@pytest.mark.parametrize("signum,status,said", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                (signal.SIGINT, 130, "interrupted")])
def test_a_signal_ends_the_benchmark_and_its_worker_with_one_line(bench_out, tmp_path, signum,
                                                                 status, said):
  import psutil  # pylint: disable=g-import-not-at-top
  out_dir = tmp_path / "out"
  shutil.copytree(os.path.join(bench_out, "data"), str(out_dir / "data"))
  log = tmp_path / "log.txt"
  with open(str(log), "w") as output:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.benchmark", "--configs=tiny", "--seq_lengths=128",
         "--precisions=fp32", "--skip_peer", "--skip_large", "--rounds=1", "--windows=100",
         "--out_dir=%s" % out_dir], stdout=output, stderr=subprocess.STDOUT, cwd=ROOT)
  workers, armed = [], []

  def measuring():
    # The worker once it has armed its stacks, measuring (a stop in the fork itself is the
    # next test's). Its arguments first: before the exec a child has the benchmark's, and
    # its handler.
    workers[:] = []
    for child in psutil.Process(process.pid).children():
      try:
        if any(arg.startswith("--worker=") for arg in child.cmdline()) and \
            stacks._catches_stack_signal(child.pid):  # pylint: disable=protected-access
          workers.append(child)
      except psutil.Error:  # it has just ended
        pass
    armed[:] = [stacks._catches_stack_signal(process.pid)]  # pylint: disable=protected-access
    return bool(workers)

  try:
    assert signal_when(process, measuring, signum, log) == status
    assert armed == [True]  # kill -USR2 would have shown its stacks
    output = log.read_text()
    assert "Traceback" not in output, output
    assert output.splitlines()[-1] == ("benchmark: %s; the rows it had not finished are not "
                                       "in its table; run the same command again" % said), output
    # Ended with it, not left measuring (SIGKILLed, a worker ends when next scheduled).
    assert [worker.pid for worker in workers if not gone(worker.pid)] == []
  finally:
    for worker in workers:
      if worker.is_running():
        worker.kill()


# The benchmark, its stop sent from the first at-fork callback of its process (its first
# worker's fork), where Python would drop the exception the stop's handler raises.
STOP_IN_FORK = """
import os, runpy, signal, sys, time, traceback
stop = int(sys.argv[1])
landed = []
def land():
  if not landed:
    landed.append(1)
    print("stop sent in a fork under " + " ".join(f.name for f in traceback.extract_stack()),
          flush=True)
    os.kill(os.getpid(), stop)
    time.sleep(0.5)
os.register_at_fork(after_in_parent=land)
sys.argv[1:2] = []
runpy.run_module("bench.benchmark", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("signum,status,said", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                (signal.SIGINT, 130, "interrupted")])
def test_a_stop_that_comes_as_the_benchmark_forks_a_worker_ends_it_with_one_line(
    bench_out, tmp_path, signum, status, said):
  os.symlink(os.path.join(bench_out, "data"), str(tmp_path / "data"))
  result = subprocess.run(
      [sys.executable, "-c", STOP_IN_FORK, str(int(signum)), "--configs=tiny",
       "--seq_lengths=128", "--precisions=fp32", "--skip_peer", "--skip_google",
       "--skip_large", "--rounds=1", "--windows=1", "--out_dir=" + str(tmp_path)],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, cwd=ROOT,
      timeout=600)
  assert re.search(r"^stop sent in a fork under .* run_worker ", result.stdout, re.M), \
      result.stdout
  assert "Exception ignored" not in result.stdout, result.stdout
  assert result.returncode == status, result.stdout[-3000:]
  assert result.stdout.splitlines()[-1] == (
      "benchmark: %s; the rows it had not finished are not in its table; run the same "
      "command again" % said)


def test_a_run_whose_measurements_failed_writes_its_table_and_exits_1(bench_out, tmp_path):
  os.symlink(os.path.join(bench_out, "data"), str(tmp_path / "data"))
  # Every worker is stopped before it has imported TensorFlow.
  result = run_tool("bench.benchmark", "--configs=tiny", "--seq_lengths=128",
                    "--precisions=fp32", "--skip_peer", "--skip_google", "--skip_large",
                    "--rounds=1", "--windows=1", "--row_timeout=1", "--out_dir=" + str(tmp_path))
  assert result.returncode == 1, result.stdout[-3000:]
  assert result.stdout.splitlines()[-1] == (
      "benchmark: error: 2 of 2 measurements failed; their cells say why, their logs are "
      "in %s" % (tmp_path / "logs"))
  table = (tmp_path / "benchmark.md").read_text()
  assert "| tiny | 128 | 16 | fp32 | " in table
  assert table.count("failed: timed out after 1 s") == 2


@pytest.mark.parametrize("ending,said", [
    ("signal.signal(signal.SIGINT, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGINT)",
     "ended by SIGINT"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "killed (out of memory?)"),
    ("sys.exit(3)", "exit status 3")])
def test_a_measurement_that_ends_without_its_result_says_how_it_ended(
    bench_module, tmp_path, monkeypatch, ending, said):
  script = tmp_path / "worker.py"
  script.write_text("import os, signal, sys\n" + ending + "\n")
  (tmp_path / "logs").mkdir()
  monkeypatch.setattr(bench_module, "FLAGS",
                      types.SimpleNamespace(out_dir=str(tmp_path), row_timeout=120))
  assert bench_module.run_worker("ours", {}, "row", script=str(script)) == {
      "error": "%s, see %s" % (said, tmp_path / "logs" / "row.log")}


def test_the_card_gives_spread_over_repeats_and_a_hash_of_the_config_alone():
  stats = card.spread([10.0, 12.0, 14.0])
  assert (stats["n"], stats["mean"], stats["stdev"], stats["min"], stats["max"]) == (
      3, 12.0, 2.0, 10.0, 14.0)
  config = {"seq": 512, "model": {"layers": 24, "hidden": 1024}}
  assert card.config_hash(config) == card.config_hash(
      {"model": {"hidden": 1024, "layers": 24}, "seq": 512})
  assert card.config_hash(config) != card.config_hash(dict(config, seq=128))
  assert len(card.config_hash(config)) == 16


LARGE = {"layers": 24, "hidden": 1024, "heads": 16, "intermediate": 4096, "vocab": 30522}


def test_the_bert_large_check_gets_the_anchors_rows_of_its_type_in_the_card(bench_module,
                                                                           tmp_path):
  row = dict(config="large", seq=512, preds=76, batch=1, precision="fp32", intra=2, inter=2,
             xla=False)
  results = {"rows": [], "large": [dict(row, ours={"windows_records": [0.4, 0.5],
                                                    "steps_per_window": 1})]}
  written = bench_module.write_card(results, str(tmp_path / "card.json"))
  (entry,) = written["entries"]
  assert entry["name"] == "large-seq512-fp32 ours LAMB (batch 1, 1 steps a window)"
  assert entry["config"]["model"] == dict(LARGE, name="large")
  assert entry["stats"]["mean"] == pytest.approx(0.45)
  assert sorted((r["device"], r["devices"], r["compute"]) for r in entry["published"]) == [
      ("A100-40G", 8, "tf32"), ("V100-16G", 8, "float32")]
  assert all(r["ours_per_device"] == pytest.approx(0.45) for r in entry["published"])
  with open(str(tmp_path / "card.json")) as f:
    assert json.load(f) == json.loads(json.dumps(written))
  assert any(line.startswith(entry["name"] + " (V100-16G x 8, float32): 8.69 sentences/s "
                                             "per device published, ours 0.45")
             for line in card.published_lines(written))


def test_the_anchors_rows_of_the_same_model_length_and_type_sit_beside_ours():
  published = card.load_published()
  xeon = {"cpu": {"model": "Intel(R) Xeon(R) Platinum 8480+"}, "gpus": None}
  a100 = {"cpu": {"model": "AMD EPYC 7742"},
          "gpus": {"model": "NVIDIA A100-SXM4-40GB", "count": 8}}

  def beside(compute, env, seq=512, model=LARGE):
    return card.published_beside({"model": model, "seq": seq, "compute": compute}, 80.0, 8,
                                 env, published)
  # bfloat16 BERT-Large at 512: Intel's MLPerf Xeon figure, per socket.
  (intel,) = beside("bfloat16", xeon)
  assert intel["source"] == "intel_mlperf_v3.0" and intel["same_device"]
  assert intel["per_device"] == 32 and intel["approximate"] and intel["ours_per_device"] == 10
  assert "Xeon Platinum 8480+" in intel["source_text"]
  # float16: NVIDIA's mixed rows; float32: its fp32 V100 row and its TF32 A100 row.
  mixed = beside("float16", a100)
  assert sorted((r["device"], r["devices"], r["sentences_per_second"]) for r in mixed) == [
      ("A100-40G", 1, 70.86), ("A100-40G", 8, 572.11), ("V100-16G", 1, 28.72),
      ("V100-16G", 8, 190.65)]
  assert [r["same_device"] for r in mixed if r["device"] == "A100-40G"] == [True, True]
  assert not any(r["same_device"] for r in mixed if r["device"] == "V100-16G")
  assert sorted((r["compute"], r["per_device"]) for r in beside("float32", a100)) == [
      ("float32", 69.53 / 8), ("tf32", 316.51 / 8)]
  # Another length or model: nothing published to compare with.
  assert beside("float16", a100, seq=128) == []
  assert beside("float16", a100, model=dict(LARGE, layers=12, hidden=768, heads=12,
                                             intermediate=3072)) == []


def run_google_worker(precision):
  row = {"config": "tiny", "seq": 128, "preds": 20, "batch": 4, "precision": precision,
         "warmup": 1, "windows": 1, "steps": 1, "window_seconds": 0.2, "intra": 2,
         "inter": 2}
  result = subprocess.run(
      [sys.executable, "-m", "bench.benchmark", "--worker=google", "--row=" + json.dumps(row)],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      cwd=ROOT, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:]
  (line,) = [l for l in result.stdout.splitlines() if l.startswith("BENCH_RESULT ")]
  return json.loads(line[len("BENCH_RESULT "):])


@needs_google
def test_google_peer_amp_runs_its_math_in_bfloat16():
  import tensorflow.compat.v1 as tf
  result = run_google_worker("amp")
  if google_peer.rewrite_options_field(tf) is None:  # TensorFlow 1.15: no such rewrite
    assert result["error"].startswith("amp: this TensorFlow (%s) has no oneDNN bfloat16"
                                      % tf.__version__)
    return
  avx512 = "avx512f" in open("/proc/cpuinfo").read().split()
  if not (device.tensorflow_uses_onednn() and avx512):
    # Machines differ: the rewrite needs oneDNN (TensorFlow 2 turns it on for CPUs with
    # VNNI, bfloat16 or AMX), which runs bfloat16 on AVX-512 CPUs only.
    assert result["error"].startswith("amp: grappler's auto_mixed_precision_onednn_bfloat16 "
                                      "rewrite changed no op to bfloat16 on this CPU")
    return
  assert result["rewrite"] == "auto_mixed_precision_onednn_bfloat16"
  # Every encoder layer's dense layers and their gradients at least.
  assert result["bf16_ops"] > 2 * 6 * 3
  assert math.isfinite(result["loss"]) and result["fps"] > 0


def test_layer_norm_stand_in_matches_numpy_with_contribs_variables():
  import numpy as np
  import tensorflow.compat.v1 as tf
  x = np.random.RandomState(0).normal(3.0, 2.0, size=(2, 5, 8)).astype(np.float32)
  with tf.Graph().as_default():
    with tf.variable_scope("layer_1"):
      output = google_peer.layer_norm(tf.constant(x), begin_norm_axis=-1,
                                      begin_params_axis=-1)
    names = sorted(v.op.name for v in tf.trainable_variables())
    model_names = sorted(v.op.name for v in tf.model_variables())
    gamma = [v for v in tf.global_variables() if v.op.name.endswith("gamma")][0]
    shift = [v for v in tf.global_variables() if v.op.name.endswith("beta")][0]
    try:
      from tensorflow.contrib import layers as contrib_layers  # TensorFlow 1.x
    except ImportError:
      contrib_layers = None
    if contrib_layers is not None:
      with tf.variable_scope("contrib"):
        reference = contrib_layers.layer_norm(tf.constant(x), begin_norm_axis=-1,
                                              begin_params_axis=-1)
      contrib_names = sorted(v.op.name for v in tf.trainable_variables()
                             if v.op.name.startswith("contrib/"))
      assert contrib_names == ["contrib/LayerNorm/beta", "contrib/LayerNorm/gamma"]
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      session.run([gamma.assign(np.linspace(0.5, 2.0, 8)), shift.assign(np.arange(8.0))])
      if contrib_layers is not None:
        contrib_vars = [v for v in tf.global_variables() if v.op.name.startswith("contrib/")]
        session.run([c.assign(session.run(v)) for c, v in
                     zip(sorted(contrib_vars, key=lambda v: v.op.name), [shift, gamma])])
        got, want_tf = session.run([output, reference])
        np.testing.assert_allclose(got, want_tf, rtol=1e-5, atol=1e-5)
      else:
        got = session.run(output)
  assert names == ["layer_1/LayerNorm/beta", "layer_1/LayerNorm/gamma"]
  assert model_names == names
  mean = x.mean(axis=-1, keepdims=True)
  variance = x.var(axis=-1, keepdims=True)
  want = (x - mean) / np.sqrt(variance + 1e-12) * np.linspace(0.5, 2.0, 8) + np.arange(8.0)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_packing_benchmark_times_padded_unpadded_and_packed_wikipedia_records(tmp_path):
  out_dir = tmp_path / "out"
  result = subprocess.run(
      [sys.executable, "-m", "bench.packing", "--configs=tiny", "--seq_lengths=128",
       "--noxla_too", "--rounds=1", "--windows=1", "--steps=2", "--warmup_steps=0",
       "--dump_mb=1", "--out_dir=" + str(out_dir)],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      cwd=ROOT, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:]
  rows = json.loads((out_dir / "packing.json").read_text())
  assert len(rows) == 1
  row = rows[0]
  # Wikipedia's articles end mid-sequence: packing leaves less padding than it found.
  assert 0 <= row["padding_after"] < row["padding_before"] and row["per_pack"] > 1
  assert row["packs"] == round(16 / row["per_pack"])
  for side in ("padded", "unpadded", "packed"):
    assert row["fps"][side]["median"] > 0, side
  table = (out_dir / "packing.md").read_text()
  assert re.search(r"^\| tiny \| 128 \| fp32 \| off \| 16 \(\d+ at [\d.]+ a pack\) \| "
                   r"[\d.]+% / [\d.]+% \|.*x \| [\d.]+x \|$", table, re.M), table
  assert table.splitlines()[0] in result.stdout  # the CPU line


def test_a_packing_cell_whose_runs_failed_says_why():
  row = {"config": "tiny", "seq": 128, "precision": "fp32", "xla": False, "batch": 16,
         "packs": 8, "per_pack": 2.0, "padding_before": 0.5, "padding_after": 0.1,
         "load_average": [0.5, 1.0], "failures": {"packed": "exit status 1, see logs/p.log"},
         "fps": {"padded": {"median": 10.0, "min": 9.0, "max": 11.0},
                 "unpadded": {"median": 12.0, "min": 11.0, "max": 13.0}, "packed": None}}
  # Its flags share names with the benchmark's this file loads: an interpreter of its own.
  result = subprocess.run(
      [sys.executable, "-c", "import json, sys\nfrom bench import packing\n"
       "print(packing.markdown([json.loads(sys.argv[1])]).splitlines()[-1])", json.dumps(row)],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
  assert result.stdout.splitlines()[-1] == (
      "| tiny | 128 | fp32 | off | 16 (8 at 2.000 a pack) | 50.0% / 10.0% | 0.50-1.00 | "
      "10.0 (9.0-11.0) | 12.0 (11.0-13.0) | failed: exit status 1, see logs/p.log | n/a | "
      "n/a |"), result.stdout


def test_the_data_benchmark_times_every_step_and_the_baseline_and_leaves_no_temporary_files(
    tmp_path):
  from bert_pretrain.data import tokenization
  vocab = str(tmp_path / "vocab.txt")
  tokenization.build_wordpiece_vocab([os.path.join(ROOT, "tests", "data", "wiki_sample.xml")],
                                     2000, vocab)
  temporary = tmp_path / "tmp"
  temporary.mkdir()
  result = run_tool("bench.benchmark_data", "--synthesize_mb=0.3", "--jobs=1",
                    "--vocab=" + vocab, "--baseline_mb=0.05", "--dupe_factor=1",
                    "--max_seq_length=128", "--max_predictions_per_seq=20", "--num_shards=2",
                    "--num_eval_articles=4", "--num_eval_samples=5",
                    env=dict(os.environ, TMPDIR=str(temporary)))
  assert result.returncode == 0, result.stdout[-3000:]
  steps = re.findall(r"^(\w+) +[\d.]+ +[\d.]+ ", result.stdout, re.M)
  # Every step of MLCommons' data; step pack (packed records, ours) is left out.
  assert steps == ["extract", "clean", "segment", "shard", "tfrecords", "eval", "manifest",
                   "total"]
  instances = [int(n) for n in re.findall(r"^(?:baseline|ours) \(.*?\) +[\d.]+ +[\d.]+ "
                                          r"+\d+ +(\d+) ", result.stdout, re.M)]
  assert len(instances) == 2 and min(instances) > 0, result.stdout[-3000:]
  assert "speed-up of ours over the baseline" in result.stdout
  assert not os.listdir(str(temporary))


# The data benchmark, its pipeline ended by a worker that died (the OOM killer).
WORKER_DIED = """
import runpy, sys
from bert_pretrain import processes
from bert_pretrain.wiki import pipeline
def died(*unused_args, **unused_kwargs):
  raise processes.WorkerDied()
pipeline.run_pipeline = died
sys.argv = ["benchmark_data", "--synthesize_mb=0.3", "--jobs=2", "--vocab=" + sys.argv[1]]
runpy.run_module("bench.benchmark_data", run_name="__main__", alter_sys=True)
"""


def test_a_worker_that_died_in_the_data_benchmark_is_one_line_saying_what_is_kept(tmp_path):
  from bert_pretrain.data import tokenization
  vocab = str(tmp_path / "vocab.txt")
  tokenization.build_wordpiece_vocab([os.path.join(ROOT, "tests", "data", "wiki_sample.xml")],
                                     2000, vocab)
  temporary = tmp_path / "tmp"
  temporary.mkdir()
  result = subprocess.run([sys.executable, "-c", WORKER_DIED, vocab], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, cwd=ROOT,
                          timeout=300, env=dict(os.environ, TMPDIR=str(temporary)))
  assert (result.returncode, result.stdout.splitlines()[-1:]) == (1, [
      "benchmark_data: error: a worker process ended abruptly (killed, or out of memory: see "
      "dmesg); its temporary folder is removed; run the same command again, with fewer "
      "--jobs if memory ran out"]), result.stdout[-3000:]
  assert not os.listdir(str(temporary))


def test_the_data_benchmark_without_a_dump_says_how_to_give_one():
  result = run_tool("bench.benchmark_data", "--jobs=1")
  assert (result.returncode, result.stdout.splitlines()[-1:]) == (2, [
      "benchmark_data: error: no dump to measure on; pass --dump=<a MediaWiki dump> or "
      "--synthesize_mb=<MB> (one built from --synthesize_from)"])
  result = run_tool("bench.benchmark_data", "--jobs=1", "--synthesize_mb=-1")
  assert (result.returncode, result.stdout.splitlines()[-1:]) == (2, [
      "benchmark_data: error: --synthesize_mb=-1 must be positive (the MB of the dump to "
      "build)"])


def test_the_step_profile_of_accumulated_micro_batches_lists_what_the_backward_pass_keeps(
    bench_out):
  result = subprocess.run(
      [sys.executable, "-m", "bench.profile_step", "--config=tiny", "--seq=128", "--batch=4",
       "--precision=amp", "--traced_steps=1", "--accumulation=2", "--warmup_steps=0",
       "--memory", "--out_dir=" + bench_out],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      cwd=ROOT, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:]
  out = result.stdout
  assert "tiny seq 128 batch 4 x 2 accumulated amp, 2 intra / 2 inter-op threads" in out
  # One traced update is two session runs, the accumulating one and the update's.
  traced = re.search(r"^Micro-batch: [\d.]+ s wall \(traced: 2 micro-batches, 1 updates\); "
                     r"summed op time ([\d.]+) s a micro-batch$", out, re.M)
  assert traced and float(traced.group(1)) > 0, out
  # The update's op: our kernel where it is built (init_tf.sh), else TensorFlow's.
  update_op = "BertLambApply" if fused_kernels.load() is not None else "ApplyAdam"
  assert re.search(r"^\| %s \| [\d.]+%% \| [\d.]+ \|$" % update_op, out, re.M), out
  total = float(re.search(r"^Kept for the backward pass: ([\d.]+) MB a sentence$", out,
                          re.M).group(1))
  part_rows = out[out.index("| part | MB a sentence |"):out.index("| op type and dtype |")]
  parts = {name: float(mb) for name, mb in
           re.findall(r"^\| ([^|]+) \| ([\d.]+) \|$", part_rows, re.M)}
  assert parts["feed-forward 1 + gelu"] > 0 and parts["attention scores+context"] > 0
  assert sum(parts.values()) == pytest.approx(total, abs=0.1 * len(parts))
  kinds = out[out.index("| op type and dtype |"):]
  assert "bfloat16 |" in kinds and "Variable" not in kinds  # the weights are not activations
  # The attention keeps its probabilities in bfloat16, GELU its slope alone.
  assert "| Softmax float32 |" not in kinds and "| Tanh float32 |" not in kinds
