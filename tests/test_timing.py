"""training/timing.py and the summary lines: where a run's time goes (the padding, one
traced update split into input, compute and all-reduce, the MFU), with the hints."""

import json
import os
import re

import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain.distributed import device
from bert_pretrain.model import bert_config as bert_config_lib
from bert_pretrain.model import heads
from bert_pretrain.model import modeling
from bert_pretrain.training import report
from bert_pretrain.training import runlog
from bert_pretrain.training import timing
from conftest import SEQ_LENGTH, TINY_CONFIG, base_flags, run_pretraining

PADDED = 16  # the last positions of every record made padding below


@pytest.fixture(scope="module")
def padded_data(pretraining_data, tmp_path_factory):
  """The fixture records with their last PADDED positions turned into padding (mask and
  ids 0, no prediction there): a known padding share of PADDED / SEQ_LENGTH."""
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
  assert summary["time_allreduce_share"] == 0
  assert summary["time_input_share"] + summary["time_compute_share"] == pytest.approx(1)
  assert 0 < summary["time_compute_share"] <= 1
  flops = timing.training_flops_per_sentence(
      bert_config_lib.BertConfig.from_dict(TINY_CONFIG), SEQ_LENGTH, 10)
  assert summary["mfu"] == pytest.approx(summary["throughput"] * flops / 0.5e12)
  assert "MFU: %.1f%% of 0.5 TFLOPS a card (--peak_tflops)" % (100 * summary["mfu"]) in (
      result.stdout)
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
  assert "(measured in %s)" % dtype in result.stdout
  assert "Update time (update 4 traced, " in result.stdout


class _Lines(object):
  def __init__(self):
    self.lines = []

  def print(self, line):
    self.lines.append(line)


def test_without_a_peak_the_mfu_line_says_how_to_get_one():
  tokens = timing.Tokens(SEQ_LENGTH)
  tokens.add(48 * 8, 8)
  logger = _Lines()
  figures = runlog.log_where_time_goes(logger, 100.0, tokens, None, 2e9, None, 1)
  assert logger.lines == [
      "Tokens per second: 4800 real, 6400 with the padding (padding 25.0% of the positions)",
      "MFU: not computed (2 GFLOP a sentence); pass --peak_tflops=<a card's matmul peak> or "
      "--measure_peak"]
  assert figures == {"padding_share": 0.25, "real_tokens_per_s": 4800.0,
                     "padded_tokens_per_s": 6400.0}


def test_the_flops_of_a_sentence_are_those_of_the_models_matmuls():
  """Counted from the graph: every MatMul and BatchMatMul of Google's plain model and
  its heads at every position, 2 x m x n x k each, times 3 for the backward pass."""
  config = bert_config_lib.BertConfig.from_dict(dict(TINY_CONFIG, num_hidden_layers=2))
  batch, seq, predictions = 2, 32, 5
  with tf.Graph().as_default() as graph:
    ids = tf.zeros([batch, seq], tf.int32)
    model = modeling.BertModel(config, False, ids, tf.ones([batch, seq], tf.int32),
                               tf.zeros([batch, seq], tf.int32))
    positions = tf.zeros([batch, predictions], tf.int32)
    heads.get_masked_lm_output(config, model.get_sequence_output(),
                               model.get_embedding_table(), positions,
                               tf.zeros([batch, predictions], tf.int32),
                               tf.ones([batch, predictions]))
    heads.get_next_sentence_output(config, model.get_pooled_output(),
                                   tf.zeros([batch, 1], tf.int32))
    counted = 0
    for op in graph.get_operations():
      if op.type == "MatMul":
        a, b = [t.shape.as_list() for t in op.inputs]
        m = a[1] if op.get_attr("transpose_a") else a[0]
        k = a[0] if op.get_attr("transpose_a") else a[1]
        n = b[0] if op.get_attr("transpose_b") else b[1]
        counted += 2 * m * n * k
      elif op.type.startswith("BatchMatMul"):
        a, b = [t.shape.as_list() for t in op.inputs]
        adj_x = op.get_attr("adj_x")
        adj_y = op.get_attr("adj_y")
        m, k = (a[-1], a[-2]) if adj_x else (a[-2], a[-1])
        n = b[-2] if adj_y else b[-1]
        batches = 1
        for d in a[:-2]:
          batches *= d
        counted += 2 * batches * m * n * k
  assert counted > 0
  assert timing.training_flops_per_sentence(config, seq, predictions) == 3 * counted / batch


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
  # Two session runs (micro-batches); times in microseconds. The all-reduce overlaps the
  # input for 100 us, which counts as input.
  first = _step_stats(("IteratorGetNext_1", 0, 200), ("MatMul_1", 200, 900))
  second = _step_stats(("IteratorGetNext_2", 1000, 1300), ("MatMul_2", 1300, 1800),
                       ("HorovodAllreduce_grads", 1200, 2000))
  parts = timing.split_update([first, second], lambda name: None)
  assert parts["step"] == pytest.approx(0.0009 + 0.001)
  assert parts["input"] == pytest.approx(0.0002 + 0.0003)
  assert parts["allreduce"] == pytest.approx(0.0007)
  assert parts["compute"] == pytest.approx(0.0019 - 0.0005 - 0.0007)
  # The graph's op type wins over the label.
  parts = timing.split_update([second], lambda name: "MatMul")
  assert (parts["input"], parts["allreduce"]) == (0, 0)


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
                                 "mfu": 0.31, "peak_tflops": 100.0})
  assert line == ("padding 25.0% of the positions; update time: input 10.0%, compute 70.0%, "
                  "all-reduce 20.0%; MFU 31.0% of 100 TFLOPS a card")
  assert report.where_time_went({"throughput": 5.0}) == ""
