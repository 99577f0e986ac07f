"""bench/benchmark.py: the FLOP count matches the model's matmuls; a one-row run writes
its table and JSON."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARK = os.path.join(ROOT, "bench", "benchmark.py")


@pytest.fixture(scope="module")
def bench_module():
  spec = importlib.util.spec_from_file_location("bench_benchmark", BENCHMARK)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_encoder_flops_count_every_dense_kernel_of_the_model(bench_module):
  import tensorflow.compat.v1 as tf
  from bert_pretrain import input_pipeline
  from bert_pretrain import modeling
  from bert_pretrain import run_pretraining
  seq, preds, batch = 16, 3, 2
  config = modeling.BertConfig.from_dict(bench_module.bert_config_dict("tiny", vocab_size=50))
  with tf.Graph().as_default():
    features = input_pipeline.constant_features(batch, seq, preds)
    run_pretraining.build_model(config, features, True, tf.float32)
    kernels = {v.op.name: v.shape.num_elements() for v in tf.trainable_variables()
               if v.op.name.endswith("kernel")}
  encoder = sum(n for name, n in kernels.items() if "/encoder/" in name)
  flops = bench_module.train_flops_per_sequence("tiny", seq, preds, vocab_size=50)
  assert flops["encoder_dense"] == 3 * 2 * seq * encoder
  # The MLM head: its transform kernel and the tied [vocab, hidden] projection.
  transform = kernels["cls/predictions/transform/dense/kernel"]
  assert flops["mlm_head"] == 3 * 2 * preds * (transform + 50 * 128)
  assert flops["total"] == sum(v for k, v in flops.items() if k != "total")


def test_one_row_run_writes_table_and_json(tmp_path):
  out_dir = str(tmp_path)
  result = subprocess.run(
      [sys.executable, BENCHMARK, "--configs=tiny", "--seq_lengths=128",
       "--precisions=fp32", "--skip_peer", "--skip_large", "--windows=1", "--steps=1",
       "--warmup_steps=1", "--window_seconds=0.2", "--out_dir=" + out_dir],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      timeout=600)
  assert result.returncode == 0, result.stdout[-3000:]
  assert "| tiny | 128 | 16 | fp32 |" in result.stdout
  with open(os.path.join(out_dir, "benchmark.json")) as f:
    results = json.load(f)
  (row,) = results["rows"]
  assert row["ours"]["fps_records"] > 0 and row["ours"]["fps_memory"] > 0
  assert row["ours"]["rss_gib"] > 0.1
  assert results["peak"]["fp32"] > 0 and results["peak"]["bf16"] > 0
  assert 0 < row["mfu"] < 1.5
  assert os.path.exists(os.path.join(out_dir, "benchmark.md"))
