"""Where a run's time goes: one traced update split into waiting for input, compute and
the all-reduce; real and padded tokens; the model FLOPs utilization (MFU).

  split_update(step_stats, op_types)   a traced update's parts, in seconds
  Tokens                               the real tokens of the micro-batches trained
  training_flops_per_sequence(...)     the matmul FLOPs of one sequence, by part
  measure_peak_tflops(dtype)           a short probe of the matmul peak
  hints(shares)                        a line when one part dominates

The loop traces one update (tf.RunOptions FULL_TRACE), the first after the FPS warm-up
or else the last; its time stays out of the FPS. bench/ counts FLOPs with the same
function, so a run's MFU and the benchmark's agree.
"""

import re
import time

# Op types whose time is the step waiting for its input, or inside the all-reduce
# (Horovod's ops, TensorFlow's collectives, NCCL), including the wait for other ranks.
INPUT_OPS = ("IteratorGetNext", "IteratorGetNextSync", "MultiDeviceIteratorGetNextFromShard")
ALLREDUCE_WORDS = ("Horovod", "Collective", "Nccl")
# A tf.distribute reduction between the replicas of one process (mirrored on a CPU: the
# copies to one device and their sum) runs as ordinary ops: ranks.all_reduce builds it in
# this name scope (uniquified by TensorFlow as ALLREDUCE_SCOPE_1, ...).
ALLREDUCE_SCOPE = "cross_replica_reduce"
_IN_ALLREDUCE_SCOPE = re.compile(r"(^|/)%s(_\d+)?/" % ALLREDUCE_SCOPE)
# The parts of an update that the log and the summary give as shares of it.
SHARES = ("input", "compute", "allreduce", "allreduce_overlapped")
# A part above this share of the update gets a hint.
DOMINANT_SHARE = 0.3


def _union(intervals):
  """Total length of the union of (start, end) intervals."""
  total, reach = 0, None
  for start, end in sorted(intervals):
    if reach is None or start > reach:
      total += end - start
      reach = end
    elif end > reach:
      total += end - reach
      reach = end
  return total


def _overlap(intervals, others):
  """Length of the union of `intervals` that also lies in the union of `others`."""
  return _union(intervals) + _union(others) - _union(list(intervals) + list(others))


def split_update(step_stats_list, op_types):
  """The parts of a traced update (one or more session runs: its micro-batches).

  An all-reduce op is timed from when it is queued, so only its time that no other op
  overlaps counts as all-reduce (the exposed communication, the wait for the slowest rank
  included); waiting for input comes first. Its time beside other ops is kept apart as
  "allreduce_overlapped" (already in input or compute): a run whose all-reduce is all
  overlapped still shows that it had one.

  Args:
    step_stats_list: the RunMetadata.step_stats of each session run of the update.
    op_types: function node name -> op type (None when unknown).

  Returns:
    dict of seconds: "step" (the runs' spans, summed), "input", "allreduce" and
    "compute" (the rest, which sum to "step"), and "allreduce_overlapped".
  """
  parts = {"step": 0.0, "input": 0.0, "allreduce": 0.0, "allreduce_overlapped": 0.0}
  for step_stats in step_stats_list:
    spans, inputs, reduces, others = [], [], [], []
    for device in step_stats.dev_stats:
      for node in device.node_stats:
        start = node.all_start_micros
        end = start + max(node.all_end_rel_micros, 0)
        spans.append((start, end))
        # GPU stream entries are named "node:op".
        op = (op_types(node.node_name.split(":")[0]) or
              node.timeline_label.partition(" = ")[2].split("(")[0])
        if op in INPUT_OPS:
          inputs.append((start, end))
        elif (any(word in op for word in ALLREDUCE_WORDS) or
              _IN_ALLREDUCE_SCOPE.search(node.node_name)):
          reduces.append((start, end))
        else:
          others.append((start, end))
    if not spans:
      continue
    parts["step"] += (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e6
    parts["input"] += _union(inputs) / 1e6
    overlapped = _overlap(reduces, inputs + others)
    parts["allreduce"] += (_union(reduces) - overlapped) / 1e6
    parts["allreduce_overlapped"] += overlapped / 1e6
  parts["compute"] = max(0.0, parts["step"] - parts["input"] - parts["allreduce"])
  return parts


def graph_op_types(graph):
  """A function node name -> its op type in `graph` (None for nodes not in it)."""
  def op_type(name):
    try:
      return graph.get_operation_by_name(name).type
    except (KeyError, ValueError):
      return None
  return op_type


def format_shares(shares, ranks):
  """"input 2.1%, compute 90.3%, all-reduce 7.6% (another 3.0% overlapped by other ops)"
  (all-reduce with several ranks only; the overlapped part when `shares` has it)."""
  parts = [("input", "input"), ("compute", "compute")]
  if ranks > 1:
    parts.append(("all-reduce", "allreduce"))
  text = ", ".join("%s %.1f%%" % (name, 100 * shares[key]) for name, key in parts)
  if ranks > 1 and shares.get("allreduce_overlapped") is not None:
    text += " (another %.1f%% overlapped by other ops)" % (100 * shares["allreduce_overlapped"])
  return text


def hints(shares, ranks):
  """The hint lines for the shares of an update ({"input", "compute", "allreduce"})."""
  lines = []
  if shares["input"] > DOMINANT_SHARE:
    lines.append("input bound: %.0f%% of the update waits for the next batch; put the "
                 "records on local, fast storage or leave the input more CPU cores (fewer "
                 "ranks a host)" % (100 * shares["input"]))
  if ranks > 1 and shares["allreduce"] > DOMINANT_SHARE:
    lines.append("communication bound: %.0f%% of the update is inside the all-reduce "
                 "(waiting for the slowest rank included); raise --num_accumulation_steps "
                 "to all-reduce less often, check the interconnect, or look for a slow "
                 "rank in the warnings" % (100 * shares["allreduce"]))
  return lines


class Tokens(object):
  """Counts the real tokens (input_mask) of the micro-batches trained: the padding share
  and, for the FLOPs, the real tokens of a sequence and the mean of their square."""

  def __init__(self, max_seq_length):
    self.max_seq_length = max_seq_length
    self.rows = 0  # records: a packed one holds several sequences
    self.sequences = 0
    self.real = 0
    self.squared = 0

  def add(self, counts, rows):
    """counts: a micro-batch's real tokens, the sum of its sequences' squared ones and
    its sequences (pretraining.real_token_counts); rows: its records."""
    self.real += int(counts[0])
    self.squared += int(counts[1])
    self.sequences += int(counts[2])
    self.rows += int(rows)

  def padding_share(self):
    """The share of positions that are padding (None before any batch)."""
    if not self.rows:
      return None
    return 1.0 - self.real / (self.rows * self.max_seq_length)

  def positions_per_sequence(self):
    """The positions computed for a sequence: max_seq_length, less in packed records."""
    return self.rows * self.max_seq_length / max(self.sequences, 1)

  def per_sequence(self):
    """(mean real tokens, mean squared real tokens) of a sequence, or (None, None)."""
    if not self.sequences:
      return None, None
    return self.real / self.sequences, self.squared / self.sequences


def training_flops_per_sequence(layers, hidden, intermediate, vocab_size, seq_length,
                                predictions, tokens=None, tokens_squared=None):
  """Forward + backward FLOPs of one training sequence of our step, by part of the model.

  A multiply-add is 2 FLOPs; backward costs twice the forward. Counted: the dense layers
  of the encoder (Q, K, V, output, two feed-forward), the attention score and context
  matmuls, the pooler and next-sentence layer, and the masked-LM head at the
  `predictions` gathered positions (transform + vocabulary projection). At the real
  tokens, as our model computes them (BertModel's drop_padding): the dense layers at
  the `tokens` real tokens of a sequence, the attention among each sequence's real
  tokens (`tokens_squared`), and the last layer's queries and all after them at the
  [CLS] and the `predictions` positions only. Padding computed anyway (the rows rounded
  up, attention at every position) is not useful work and is not counted; neither are
  look-ups, softmax, layer norm and the optimizer.

  Args:
    tokens: mean real tokens a sequence (None: seq_length, no padding).
    tokens_squared: mean of the square of a sequence's real tokens (None: tokens^2).

  Returns:
    dict: encoder_dense, attention, mlm_head, pooler_nsp, total.
  """
  tokens = seq_length if tokens is None else tokens
  tokens_squared = tokens * tokens if tokens_squared is None else tokens_squared
  # Rows at which each layer's queries and what follows them are computed.
  dense_rows = (layers - 1) * tokens + 1 + predictions
  forward = {
      "encoder_dense": 2 * (layers * tokens * 2 * hidden * hidden
                            + dense_rows * (2 * hidden * hidden + 2 * hidden * intermediate)),
      # Scores and context: the queries of each layer (the last's at 1 + predictions
      # rows) against the sequence's keys.
      "attention": 2 * 2 * hidden * ((layers - 1) * tokens_squared
                                     + (1 + predictions) * tokens),
      "mlm_head": predictions * 2 * (hidden * hidden + hidden * vocab_size),
      "pooler_nsp": 2 * (hidden * hidden + hidden * 2),
  }
  flops = {part: 3 * value for part, value in forward.items()}
  flops["total"] = sum(flops.values())
  return flops


def measure_peak_tflops(dtype, size=4096, seconds=2.0, config=None):
  """The matmul rate of this process's device in `dtype` (a tf.DType), in TFLOPS: square
  matmuls of `size` for about `seconds`, the best of the timed runs."""
  # Here, not at the top: bench's parent process uses this module without TensorFlow.
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    a, b = [tf.Variable(tf.cast(tf.random.normal([size, size]), dtype), trainable=False)
            for _ in range(2)]
    product = tf.matmul(a, b).op  # run, not fetched: no copy to the host
    with tf.Session(config=config) as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(product)
      best, started = 0.0, time.time()
      while time.time() - started < seconds:
        run_start = time.time()
        sess.run(product)
        best = max(best, 2.0 * size ** 3 / max(time.time() - run_start, 1e-9))
  return best / 1e12


def mfu(sentences_per_second, flops_per_sentence, peak_tflops, cards):
  """The model FLOPs utilization of `cards` cards of `peak_tflops` each (None: no peak)."""
  if not peak_tflops or peak_tflops <= 0:
    return None
  return sentences_per_second * flops_per_sentence / (peak_tflops * 1e12 * cards)
