"""Where the time of one training step goes: a per-op trace of our step, summed by part
of the model and by op type.

  python3 -m bench.profile_step --config=base --seq=128 --batch=8 --precision=fp32

Builds the step as bench/benchmark.py does (pretraining.build_train_graph, LAMB,
TFRecords from bench_results/data; run bench/benchmark.py once first to make them),
warms it up, traces --traced_steps steps with RunOptions(trace_level=FULL_TRACE) and
prints the share of the summed op time of each part (embeddings, Q/K/V, attention
scores and context, attention output, feed-forward, masked-LM head, next sentence,
optimizer, input), forward and backward, and of the op types that take the most. Op
times overlap when inter-op threads run ops at once, so the shares are of the summed op
time, not of the wall time (which is printed too).

With --memory it also prints what the backward pass keeps: the activations the forward
pass computes that backward ops of the step read, in MB a sentence, by part and by op
type. Ops named gradients/ that need no upstream gradient (GELU's slope) run in the
forward pass but count as backward in the time shares.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import os
import re
import time

from absl import flags

try:
  from bench import backward  # python3 -m bench.profile_step, from the repository root
  from bench import benchmark
except ImportError:
  import backward  # python3 bench/profile_step.py: bench/ is the script's own folder
  import benchmark
from bert_pretrain import errors  # pylint: disable=g-import-not-at-top

flags.DEFINE_string("config", "base", "BERT size: tiny, mini, small, medium, base, large.")
flags.DEFINE_integer("seq", 128, "Sequence length (128 or 512).")
flags.DEFINE_integer("batch", 8, "Sentences per step.")
flags.DEFINE_enum("precision", "fp32", ["fp32", "amp"], "fp32 or amp (bfloat16 compute).")
flags.DEFINE_integer("traced_steps", 3, "Steps traced after the warm-up.")
flags.DEFINE_integer("accumulation", 1, "Micro-batches accumulated into an update, as MLPerf's "
                     "configuration does (bench.benchmark --mlperf_accumulation): each traced "
                     "step is an update, the times printed are a micro-batch's.")
flags.DEFINE_integer("top_ops", 15, "Op types listed.")
flags.DEFINE_bool("memory", False, "Also print the tensors kept for the backward pass.")
FLAGS = flags.FLAGS

# (part, pattern on the node name without "gradients/"), the first match wins.
PARTS = (
    ("input", r"^(IteratorGetNext|OneShotIterator)"),
    ("embeddings", r"bert/embeddings/"),
    ("q/k/v dense", r"attention/self/(query|key|value)"),
    ("attention scores+context", r"attention/self/"),
    ("attention output dense+LN", r"attention/output/"),
    ("feed-forward 1 + gelu", r"/intermediate/"),
    ("feed-forward 2 + LN", r"layer_\d+/output/"),
    ("masked-LM head", r"cls/predictions/"),
    ("pooler + next sentence", r"(bert/pooler/|cls/seq_relationship/)"),
    ("optimizer + clipping", r"^(optimizer|clip_by_global_norm|global_norm|LAMB|lamb|Adam|"
                             r"adam|global_step|AssignAdd)"),
)


def part_of(node_name):
  name = node_name[len("gradients/"):] if node_name.startswith("gradients/") else node_name
  for part, pattern in PARTS:
    if re.search(pattern, name):
      return part
  return "other"


def op_type(node):
  match = re.match(r"[^=]*= (\w+)", node.timeline_label)
  return match.group(1) if match else node.node_name.split(":")[0].rsplit("/", 1)[-1]


def kept_for_backward(step, metadata):
  """Bytes of the activations the forward pass of `step` leaves for the backward one,
  by (part, op type and dtype), sized as the traced step `metadata` allocated them."""
  sizes = {}
  for device in metadata.step_stats.dev_stats:
    for node in device.node_stats:
      for output in node.output:
        sizes[(node.node_name, output.slot)] = (
            output.tensor_description.allocation_description.requested_bytes)
  graph = step.graph
  batches = [op for op in graph.get_operations() if op.type == "IteratorGetNext"]
  kept = collections.Counter()
  for tensor in backward.kept_tensors(backward.gradient_seeds(graph), step.fetches, batches):
    kind = "%s %s" % (tensor.op.type, tensor.dtype.name)
    kept[(part_of(tensor.op.name), kind)] += sizes.get((tensor.op.name, tensor.value_index), 0)
  return kept


def print_kept(kept, batch):
  mb = lambda n: n / 2.0 ** 20 / batch
  print("\nKept for the backward pass: %.1f MB a sentence" % mb(sum(kept.values())))
  by_part = collections.Counter()
  for (part, _), size in kept.items():
    by_part[part] += size
  print("\n| part | MB a sentence |\n|---|---|")
  for part, size in by_part.most_common():
    print("| %s | %.1f |" % (part, mb(size)))
  by_type = collections.Counter()
  for (_, kind), size in kept.items():
    by_type[kind] += size
  print("\n| op type and dtype | MB a sentence |\n|---|---|")
  for kind, size in by_type.most_common(FLAGS.top_ops):
    print("| %s | %.1f |" % (kind, mb(size)))


def trace(step, tf, steps):
  """Sums op times (microseconds) of `steps` traced updates (step.accumulation micro-batches
  each) by (part, direction) and type; returns them, the mean wall time of a micro-batch
  and the last micro-batch's RunMetadata."""
  by_part = collections.Counter()
  by_type = collections.Counter()
  wall = 0.0
  runs = step.runs() * steps
  for fetches, feed in runs:
    metadata = tf.RunMetadata()
    start = time.perf_counter()
    step.session.run(fetches, feed, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                     run_metadata=metadata)
    wall += time.perf_counter() - start
    for device in metadata.step_stats.dev_stats:
      for node in device.node_stats:
        micros = node.op_end_rel_micros - node.op_start_rel_micros
        if node.node_name in ("_SOURCE", "_SINK") or micros <= 0:
          continue
        part = part_of(node.node_name)
        if node.node_name.startswith("gradients/"):
          direction = "backward"
        else:
          direction = "update" if part == "optimizer + clipping" else "forward"
        by_part[(part, direction)] += micros
        by_type[op_type(node)] += micros
  return by_part, by_type, wall / len(runs), metadata


def print_profile(by_part, by_type, wall_s, micro_batches, updates):
  total = float(sum(by_part.values()))
  print("Micro-batch: %.3f s wall (traced: %d micro-batches, %d updates); summed op time "
        "%.3f s a micro-batch" % (wall_s, micro_batches, updates, total / 1e6 / micro_batches))
  directions = ("forward", "backward", "update")
  print("\n| part | forward | backward | update | total |\n|---|---|---|---|---|")
  part_total = lambda p: sum(by_part[(p, d)] for d in directions)
  for part in sorted({p for p, _ in by_part}, key=lambda p: -part_total(p)):
    print("| %s | %s | %.1f%% |" % (part, " | ".join("%.1f%%" % (100 * by_part[(part, d)] / total)
                                                      for d in directions),
                                    100 * part_total(part) / total))
  print("\n| op type | share | ms a micro-batch |\n|---|---|---|")
  for name, micros in by_type.most_common(FLAGS.top_ops):
    print("| %s | %.1f%% | %.1f |" % (name, 100 * micros / total,
                                      micros / 1e3 / micro_batches))


def main(argv):
  if len(argv) > 1:
    errors.unexpected_arguments("profile_step", argv[1:])
  # Before the data and the graph, which take minutes at BERT-base's size.
  if FLAGS.config not in benchmark.CONFIGS:
    errors.usage_error("profile_step", "--config: unknown %r; use %s" % (
        FLAGS.config, ", ".join(benchmark.CONFIGS)))
  if FLAGS.seq not in benchmark.PREDICTIONS:
    errors.usage_error("profile_step", "--seq: %d is not one of %s" % (
        FLAGS.seq, ", ".join(map(str, sorted(benchmark.PREDICTIONS)))))
  for name, value, least in (("batch", FLAGS.batch, 1), ("traced_steps", FLAGS.traced_steps, 1),
                             ("accumulation", FLAGS.accumulation, 1),
                             ("warmup_steps", FLAGS.warmup_steps, 0),
                             ("top_ops", FLAGS.top_ops, 1)):
    if value < least:
      errors.usage_error("profile_step", "--%s: %d; use %d or more" % (name, value, least))
  errors.make_output_folders("profile_step", "--out_dir", FLAGS.out_dir)
  benchmark.stoppable("profile_step", profile, "run the same command again")


def profile():
  """Traces FLAGS' step and prints where its time (and, with --memory, its memory) goes."""
  row = dict(config=FLAGS.config, seq=FLAGS.seq, preds=benchmark.PREDICTIONS[FLAGS.seq],
             batch=FLAGS.batch, precision=FLAGS.precision, intra=FLAGS.intra_threads,
             inter=FLAGS.inter_threads, xla=FLAGS.xla, accumulation=FLAGS.accumulation,
             data_dir=os.path.join(FLAGS.out_dir, "data"))
  if not os.path.exists(benchmark.record_files(row["data_dir"], row["seq"])[0]):
    benchmark.prepare_data(row["data_dir"], [row["seq"]])
  tf = benchmark._import_tf()  # pylint: disable=protected-access
  step = benchmark.TrainStep(row)
  for _ in range(FLAGS.warmup_steps + 1):
    step()
  by_part, by_type, wall_s, metadata = trace(step, tf, FLAGS.traced_steps)
  print("%s seq %d batch %d x %d accumulated %s, %d intra / %d inter-op threads" % (
      FLAGS.config, FLAGS.seq, FLAGS.batch, FLAGS.accumulation, FLAGS.precision,
      FLAGS.intra_threads, FLAGS.inter_threads))
  print_profile(by_part, by_type, wall_s, FLAGS.traced_steps * FLAGS.accumulation,
                FLAGS.traced_steps)
  if FLAGS.memory:
    print_kept(kept_for_backward(step, metadata), FLAGS.batch)


if __name__ == "__main__":
  errors.run_main("profile_step", main)
