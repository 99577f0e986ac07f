"""Where a run's time goes: one traced update split into waiting for input, compute and
the all-reduce; real and padded tokens; the model FLOPs utilization (MFU).

  split_update(step_stats, op_types)   a traced update's parts, in seconds
  Tokens                               the padding share of the micro-batches trained
  training_flops_per_sentence(...)     the model's matmul FLOPs of one sentence
  measure_peak_tflops(dtype)           a short probe of the matmul peak
  hints(shares)                        a line when one part dominates

The loop traces one update (tf.RunOptions FULL_TRACE), the first after the FPS warm-up
or else the last; its time stays out of the steady FPS.
"""

import time

import tensorflow.compat.v1 as tf

# Op types whose time is the step waiting for its input, or inside the all-reduce
# (Horovod's ops, TensorFlow's collectives, NCCL), including the wait for other ranks.
INPUT_OPS = ("IteratorGetNext", "IteratorGetNextSync", "MultiDeviceIteratorGetNextFromShard")
ALLREDUCE_WORDS = ("Horovod", "Collective", "Nccl")
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

  Args:
    step_stats_list: the RunMetadata.step_stats of each session run of the update.
    op_types: function node name -> op type (None when unknown).

  Returns:
    dict of seconds: "step" (the runs' spans, summed), "input" (waiting for the next
    batch), "allreduce" (inside the all-reduce, not overlapping input) and "compute"
    (the rest).
  """
  parts = {"step": 0.0, "input": 0.0, "allreduce": 0.0}
  for step_stats in step_stats_list:
    spans, inputs, reduces = [], [], []
    for device in step_stats.dev_stats:
      for node in device.node_stats:
        start = node.all_start_micros
        end = start + max(node.all_end_rel_micros, 0)
        spans.append((start, end))
        op = op_types(node.node_name) or node.timeline_label.partition(" = ")[2].split("(")[0]
        if op in INPUT_OPS:
          inputs.append((start, end))
        elif any(word in op for word in ALLREDUCE_WORDS):
          reduces.append((start, end))
    if not spans:
      continue
    parts["step"] += (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e6
    parts["input"] += _union(inputs) / 1e6
    parts["allreduce"] += (_union(reduces) - _overlap(reduces, inputs)) / 1e6
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
  """Counts the real tokens (input_mask) of the micro-batches trained, against every
  position: the padding share."""

  def __init__(self, max_seq_length):
    self.max_seq_length = max_seq_length
    self.real = 0
    self.positions = 0

  def add(self, real_tokens, sequences):
    self.real += int(real_tokens)
    self.positions += int(sequences) * self.max_seq_length

  def padding_share(self):
    """The share of positions that are padding (None before any batch)."""
    return 1.0 - self.real / self.positions if self.positions else None


def training_flops_per_sentence(bert_config, seq_length, predictions):
  """The matmul FLOPs of training on one sentence (forward and backward: 3 x forward) at
  every one of its seq_length positions, as Google's model computes them without
  skipping the padding: the token-type embedding (a one-hot matmul), each layer's
  projections, attention and feed-forward, the masked-LM head at `predictions`
  positions, the pooler and the next-sentence head."""
  h, i = bert_config.hidden_size, bert_config.intermediate_size
  embeddings = 2 * seq_length * bert_config.type_vocab_size * h
  layer = seq_length * (8 * h * h + 4 * h * i) + 4 * seq_length * seq_length * h
  heads = predictions * (2 * h * h + 2 * h * bert_config.vocab_size) + 2 * h * h + 4 * h
  return 3 * (embeddings + bert_config.num_hidden_layers * layer + heads)


def measure_peak_tflops(dtype, size=2048, seconds=2.0, config=None):
  """The matmul rate of this process's device in `dtype` (a tf.DType), in TFLOPS: square
  matmuls of `size` for about `seconds`, the best of the timed repeats."""
  with tf.Graph().as_default():
    a, b = [tf.Variable(tf.cast(tf.random.normal([size, size]), dtype), trainable=False)
            for _ in range(2)]
    # Only the matmul counts: one element of the product is fetched.
    done = tf.cast(tf.matmul(a, b)[0, 0], tf.float32)
    with tf.Session(config=config) as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(done)
      best, started = 0.0, time.time()
      while time.time() - started < seconds:
        run_start = time.time()
        sess.run(done)
        best = max(best, 2.0 * size ** 3 / max(time.time() - run_start, 1e-9))
  return best / 1e12


def mfu(sentences_per_second, flops_per_sentence, peak_tflops, cards):
  """The model FLOPs utilization of `cards` cards of `peak_tflops` each (None: no peak)."""
  if not peak_tflops or peak_tflops <= 0:
    return None
  return sentences_per_second * flops_per_sentence / (peak_tflops * 1e12 * cards)
