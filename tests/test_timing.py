"""training/timing.py and the summary lines: where a run's time goes (the padding, one
traced update split into input, compute and all-reduce, the MFU), with the hints."""

import json
import os
import re

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain.distributed import device
from bert_pretrain.model import bert_config as bert_config_lib
from bert_pretrain.training import pretraining
from bert_pretrain.training import report
from bert_pretrain.training import runlog
from bert_pretrain.training import timing
from conftest import SEQ_LENGTH, TINY_CONFIG, base_flags, run_pretraining

PADDED = 16  # the last positions of every record made padding below


@pytest.fixture(scope="module")
def padded_data(pretraining_data, tmp_path_factory):
  """The fixture records with their last PADDED positions turned into padding (mask and
  ids 0, no prediction there) and the others real: every record SEQ_LENGTH - PADDED real
  tokens, a padding share of PADDED / SEQ_LENGTH."""
  root = tmp_path_factory.mktemp("padded")
  (root / "train").mkdir()
  with tf.io.TFRecordWriter(str(root / "train" / "part-0")) as writer:
    for name in sorted(os.listdir(pretraining_data["train"])):
      for record in tf.io.tf_record_iterator(os.path.join(pretraining_data["train"], name)):
        example = tf.train.Example.FromString(record)
        feature = example.features.feature
        for key in ("input_mask", "input_ids", "segment_ids"):
          values = feature[key].int64_list.value
          for i in range(SEQ_LENGTH - PADDED, SEQ_LENGTH):
            values[i] = 0
        mask = feature["input_mask"].int64_list.value
        for i in range(SEQ_LENGTH - PADDED):
          mask[i] = 1  # every record exactly SEQ_LENGTH - PADDED real tokens
        positions = feature["masked_lm_positions"].int64_list.value
        for i, position in enumerate(positions):
          if position >= SEQ_LENGTH - PADDED:
            positions[i] = 0
            feature["masked_lm_ids"].int64_list.value[i] = 0
            feature["masked_lm_weights"].float_list.value[i] = 0.0
        writer.write(example.SerializeToString())
  return dict(pretraining_data, train=str(root / "train"))


def _summary(output_dir):
  with open(os.path.join(str(output_dir), "dllog.json")) as f:
    records = [json.loads(line) for line in f]
  return [r for r in records if r["type"] == "summary"][-1]


def test_a_run_reports_its_padding_its_update_time_split_and_its_mfu(padded_data, tmp_path):
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(padded_data, out, fps_warmup_steps=1,
                                       peak_tflops=0.5))
  assert result.returncode == 0, result.stderr[-3000:]
  print("\n".join(l for l in result.stdout.splitlines()
                  if l.startswith(("Tokens", "Update time", "MFU", "Hint", "report: where"))))
  summary = _summary(out)
  share = PADDED / SEQ_LENGTH
  assert summary["padding_share"] == pytest.approx(share)
  assert "padding %.1f%% of the positions" % (100 * share) in result.stdout
  assert summary["real_tokens_per_s"] == pytest.approx(
      summary["padded_tokens_per_s"] * (1 - share))
  assert summary["padded_tokens_per_s"] == pytest.approx(summary["throughput"] * SEQ_LENGTH)
  # The first update after the warm-up (update 2) was traced: one rank has no all-reduce.
  assert "Update time (update 2 traced, " in result.stdout
  assert summary["time_allreduce_share"] == summary["time_allreduce_overlapped_share"] == 0
  assert summary["time_input_share"] + summary["time_compute_share"] == pytest.approx(1)
  assert re.search(r"^Throughput Average \(sentences/sec\) = [\d.]+ \(after 1 warm-up steps, "
                   r"without checkpoint and eval time\)$", result.stdout, re.M)
  assert 0 < summary["time_compute_share"] <= 1
  # The FLOPs at the real tokens: 48 a sequence.
  real = SEQ_LENGTH - PADDED
  flops = timing.training_flops_per_sequence(
      TINY_CONFIG["num_hidden_layers"], TINY_CONFIG["hidden_size"],
      TINY_CONFIG["intermediate_size"], TINY_CONFIG["vocab_size"], SEQ_LENGTH, 10, real,
      real * real)["total"]
  assert summary["mfu"] == pytest.approx(summary["throughput"] * flops / 0.5e12)
  assert "MFU: %.1f%% of 0.5 TFLOPS a card (--peak_tflops), %.3g GFLOP a sequence" % (
      100 * summary["mfu"], flops / 1e9) in result.stdout
  assert "report: where the time went: padding 25.0% of the positions; update time: input " in (
      result.stdout)


def test_a_measured_peak_gives_the_mfu_and_the_last_update_is_traced_within_warm_up(
    pretraining_data, tmp_path):
  result = run_pretraining(*base_flags(pretraining_data, tmp_path / "out",
                                       fps_warmup_steps=10, measure_peak=None))
  assert result.returncode == 0, result.stderr[-3000:]
  dtype = device.detect_device("cpu", False, "auto").dtype.name
  peak = re.search(r"Matmul peak: ([\d.e+]+) TFLOPS a card in %s \(--measure_peak\)" % dtype,
                   result.stdout)
  assert peak, result.stdout[-3000:]
  summary = _summary(tmp_path / "out")
  assert summary["peak_tflops"] == pytest.approx(float(peak.group(1)), rel=1e-2)
  # 4 updates, all within the warm-up: the figure is the average with overhead, and says so.
  assert summary["throughput"] == summary["throughput_with_overhead"]
  assert ("Throughput Average (sentences/sec) = %.2f (with overhead: no update is left once "
          "the 10 warm-up steps, the traced one and the first to log the losses are out; "
          "train more updates or lower --fps_warmup_steps)" % summary["throughput"]
          ) in result.stdout
  assert "(measured in %s)" % dtype in result.stdout
  assert "Update time (update 4 traced, " in result.stdout


class _Lines(object):
  def __init__(self):
    self.lines = []

  def print(self, line):
    self.lines.append(line)


def test_without_a_peak_the_mfu_line_says_how_to_get_one():
  tokens = timing.Tokens(SEQ_LENGTH)
  tokens.add((48 * 8, 48 * 48 * 8, 8), 8)
  assert tokens.per_sequence() == (48, 48 * 48)
  logger = _Lines()
  figures = runlog.log_where_time_goes(logger, 100.0, tokens, None, 2e9, None, 1)
  assert logger.lines == [
      "Tokens per second: 4800 real, 6400 with the padding (padding 25.0% of the positions)",
      "MFU: not computed (2 GFLOP a sequence at its real tokens); pass "
      "--peak_tflops=<a card's matmul peak> or --measure_peak"]
  assert figures == {"padding_share": 0.25, "real_tokens_per_s": 4800.0,
                     "padded_tokens_per_s": 6400.0}


def _matmul_flops(graph, skip_scope):
  """2 x m x n x k of every MatMul and BatchMatMul in graph outside skip_scope, at the
  shapes the graph computes (the unpadded rows are known when it runs)."""
  ops = [op for op in graph.get_operations() if not op.name.startswith(skip_scope) and
         (op.type == "MatMul" or op.type.startswith("BatchMatMul"))]
  with tf.Session(graph=graph) as sess:
    sess.run(tf.global_variables_initializer())
    shapes = sess.run([[tf.shape(t) for t in op.inputs[:2]] for op in ops])
  counted = 0
  for op, (a, b) in zip(ops, shapes):
    if op.type == "MatMul":
      flip_a, flip_b = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    else:
      flip_a, flip_b = op.get_attr("adj_x"), op.get_attr("adj_y")
    m, k = (a[-1], a[-2]) if flip_a else (a[-2], a[-1])
    n = b[-2] if flip_b else b[-1]
    counted += 2 * int(np.prod(a[:-2])) * int(m) * int(n) * int(k)
  return counted


def test_the_flops_of_a_sequence_are_those_of_the_training_graphs_matmuls():
  """Counted from the graph of our model and heads (build_model) on a batch without
  padding: every MatMul and BatchMatMul, 2 x m x n x k each, times 3 for the backward
  pass; the token-type embedding's one-hot matmul is a look-up and counts 0."""
  config = bert_config_lib.BertConfig.from_dict(dict(TINY_CONFIG, num_hidden_layers=2))
  batch, seq, predictions = 2, 32, 5
  with tf.Graph().as_default() as graph:
    features = {
        "input_ids": tf.ones([batch, seq], tf.int32),
        "input_mask": tf.ones([batch, seq], tf.int32),
        "segment_ids": tf.zeros([batch, seq], tf.int32),
        "masked_lm_positions": tf.ones([batch, predictions], tf.int32),
        "masked_lm_ids": tf.ones([batch, predictions], tf.int32),
        "masked_lm_weights": tf.ones([batch, predictions]),
        "next_sentence_labels": tf.zeros([batch, 1], tf.int32)}
    pretraining.build_model(config, features, False, tf.float32)
  counted = _matmul_flops(graph, "bert/embeddings/")
  assert counted > 0
  flops = timing.training_flops_per_sequence(
      config.num_hidden_layers, config.hidden_size, config.intermediate_size,
      config.vocab_size, seq, predictions)
  assert flops["total"] == 3 * counted / batch


def _step_stats(*nodes):
  """A session run's StepStats of (node name, start, end) on one device; each node's
  label names its op type as the name's first word."""
  stats = tf.RunMetadata().step_stats
  device = stats.dev_stats.add(device="/cpu:0")
  for name, start, end in nodes:
    device.node_stats.add(node_name=name, all_start_micros=start,
                          all_end_rel_micros=end - start,
                          timeline_label="%s = %s()" % (name, name.split("_")[0]))
  return stats


def test_a_traced_update_splits_into_input_all_reduce_and_compute():
  # Two session runs (micro-batches); times in microseconds.
  first = _step_stats(("IteratorGetNext_1", 0, 200), ("MatMul_1", 200, 900))
  second = _step_stats(("IteratorGetNext_2", 1000, 1300), ("MatMul_2", 1300, 1800),
                       ("HorovodAllreduce_grads", 1200, 2000))
  parts = timing.split_update([first, second], lambda name: None)
  assert parts["step"] == pytest.approx(0.0009 + 0.001)
  assert parts["input"] == pytest.approx(0.0002 + 0.0003)
  # Queued at 1200: only 1800-2000 has no input or compute beside it.
  assert parts["allreduce"] == pytest.approx(0.0002)
  assert parts["compute"] == pytest.approx(0.0019 - 0.0005 - 0.0002)
  # 1200-1800 ran beside input and compute: overlapped, counted in those parts.
  assert parts["allreduce_overlapped"] == pytest.approx(0.0006)
  # An all-reduce wholly beside compute is all overlapped, none exposed.
  hidden = _step_stats(("MatMul_3", 0, 1000), ("HorovodAllreduce_g", 100, 900))
  parts = timing.split_update([hidden], lambda name: None)
  assert (parts["allreduce"], parts["allreduce_overlapped"]) == (0, pytest.approx(0.0008))
  assert parts["compute"] == pytest.approx(0.001)
  # Replicas of one process (mirrored) reduce with ordinary ops, in ranks.all_reduce's
  # name scope; a sum outside it (the backward pass's) is compute.
  mirrored = _step_stats(("MatMul_4", 0, 1000), ("gradients/AddN", 900, 1000),
                         ("%s_1/AddN" % timing.ALLREDUCE_SCOPE, 1000, 1300))
  parts = timing.split_update([mirrored], lambda name: name.rpartition("/")[2] or "MatMul")
  assert parts["allreduce"] == pytest.approx(0.0003)
  assert parts["compute"] == pytest.approx(0.001)
  # The graph's op type wins over the label; a GPU stream's "node:op" is the node.
  names = []
  parts = timing.split_update([second], lambda name: names.append(name) or "MatMul")
  assert (parts["input"], parts["allreduce"]) == (0, 0)
  gpu = _step_stats(("MatMul_2:MatMul", 0, 100))
  timing.split_update([gpu], lambda name: names.append(name))
  assert names[-1] == "MatMul_2"


def test_a_dominant_part_gets_a_hint_and_one_rank_no_communication_hint():
  assert timing.hints({"input": 0.1, "compute": 0.8, "allreduce": 0.1}, 2) == []
  (line,) = timing.hints({"input": 0.5, "compute": 0.5, "allreduce": 0.0}, 1)
  assert line.startswith("input bound: 50% of the update waits for the next batch")
  (line,) = timing.hints({"input": 0.0, "compute": 0.4, "allreduce": 0.6}, 2)
  assert line.startswith("communication bound: 60% of the update is inside the all-reduce")
  assert timing.hints({"input": 0.0, "compute": 0.4, "allreduce": 0.6}, 1) == []


def test_the_matmul_probe_measures_a_positive_rate_in_each_compute_type_of_this_cpu():
  for dtype in {tf.float32, device.detect_device("cpu", True, "auto").dtype}:
    assert timing.measure_peak_tflops(dtype, size=128, seconds=0.2) > 0


def test_the_report_says_where_the_time_went():
  line = report.where_time_went({"padding_share": 0.25, "time_input_share": 0.1,
                                 "time_compute_share": 0.7, "time_allreduce_share": 0.2,
                                 "ranks": 2, "mfu": 0.31, "peak_tflops": 100.0})
  assert line == ("padding 25.0% of the positions; update time: input 10.0%, compute 70.0%, "
                  "all-reduce 20.0%; MFU 31.0% of 100 TFLOPS a card")
  overlapped = report.where_time_went({"time_input_share": 0.1, "time_compute_share": 0.9,
                                       "time_allreduce_share": 0.0, "ranks": 2,
                                       "time_allreduce_overlapped_share": 0.05})
  assert overlapped == ("update time: input 10.0%, compute 90.0%, all-reduce 0.0% (another "
                        "5.0% overlapped by other ops)")
  assert report.where_time_went({"throughput": 5.0}) == ""
