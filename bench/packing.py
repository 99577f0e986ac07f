"""Packed records against padded and unpadded ones: our training step's sentences/s on
Wikipedia-shaped data at sequence 128 and 512, with and without XLA.

  python3 -m bench.packing                                 # mini, 128 and 512, XLA off and on
  python3 -m bench.packing --seq_lengths=128 --noxla_too --rounds=1 --windows=2   # quick

The data: a dump of about --dump_mb made from tests/data/wiki_sample.xml (real Wikipedia
articles, repeated under new titles by bench/benchmark_data.py's synthesize_dump), through
the Wikipedia pipeline (bert_pretrain/wiki, as tools/prepare_wiki.sh runs it) at each
sequence length, with step pack: the training records and the same sequences packed, up to
3 a record. Their padding share is printed with the table.

Each row (model, sequence length, XLA) has three sides, each measured in its own process,
the sides taking turns for --rounds rounds (each round starts with the next side):

  padded     unpacked records, every position computed (build_model's drop_padding off):
             what static shapes on a GPU, XLA or Google's code compute
  unpadded   unpacked records, the encoder on the real tokens only (the CPU default)
  packed     packed records, the encoder on the real tokens; a batch of
             round(--batch_size / sequences a pack) packs, about as many sentences

Sentences/s count sequences (a packed batch's: its packs times the data's mean a pack).
A side's figure is the median of its timing windows over all rounds, with their range.
The flags shared with bench/benchmark.py (--configs, --precisions, --rounds, --windows,
--window_seconds, --warmup_steps, --intra_threads, --inter_threads, --out_dir,
--row_timeout) mean what they mean there; the table goes to
<out_dir>/packing.md and packing.json.
"""

import json
import os
import statistics
import sys
import time

from absl import flags

try:
  from bench import benchmark  # python3 -m bench.packing, from the repository root
  from bench import benchmark_data
except ImportError:
  import benchmark  # python3 bench/packing.py
  import benchmark_data
from bert_pretrain import errors  # pylint: disable=g-import-not-at-top

WIKI_SAMPLE = os.path.join(benchmark.ROOT, "tests", "data", "wiki_sample.xml")
SIDES = ("padded", "unpadded", "packed")
BATCH_SIZES = {128: 16, 512: 8}

flags.DEFINE_bool("xla_too", True, "Measure every row with XLA too (beside without).")
flags.DEFINE_integer("dump_mb", 4, "Megabytes of the synthesized Wikipedia dump.")
flags.DEFINE_string("layout_row", None, "(internal) JSON of the side a worker measures.")
FLAGS = flags.FLAGS


def prepare_data(data_dir, seq_lengths):
  """The pipeline's training records and packs at each length, once; returns
  {seq: (unpacked folder, packed folder, pack summary)}."""
  from bert_pretrain import pack_records  # pylint: disable=g-import-not-at-top
  from bert_pretrain.data import tokenization  # pylint: disable=g-import-not-at-top
  from bert_pretrain.wiki import pipeline  # pylint: disable=g-import-not-at-top
  os.makedirs(data_dir, exist_ok=True)
  dump = os.path.join(data_dir, "wiki_dump.xml")
  if not os.path.exists(dump):
    benchmark_data.synthesize_dump(WIKI_SAMPLE, FLAGS.dump_mb * 1024 * 1024, dump + ".tmp")
    os.rename(dump + ".tmp", dump)
  vocab = os.path.join(data_dir, "vocab.txt")
  if not os.path.exists(vocab):
    tokenization.build_wordpiece_vocab([WIKI_SAMPLE], 8000, vocab + ".tmp")
    os.rename(vocab + ".tmp", vocab)
  data = {}
  for seq in seq_lengths:
    root = os.path.join(data_dir, "wiki-seq%d" % seq)
    benchmark.log("Wikipedia pipeline at seq %d in %s (resumes; done parts are kept)"
                  % (seq, root))
    # The evaluation set is not read here: a few articles make it.
    pipeline.run_pipeline(root, dump=dump, vocab=vocab, pack=True, num_shards=4,
                          num_eval_articles=4, num_eval_samples=10, max_seq_length=seq,
                          max_predictions_per_seq=benchmark.PREDICTIONS[seq])
    packed = os.path.join(root, "packed_train_data")
    data[seq] = (os.path.join(root, "train_data"), packed, pack_records.read_summary(packed))
  return data


def layout_worker(row):
  """Measures one side: our training step on its records, sentences/s per window."""
  tf = benchmark._import_tf()  # pylint: disable=protected-access
  from bert_pretrain import config  # pylint: disable=g-import-not-at-top
  from bert_pretrain.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
  from bert_pretrain.model import modeling  # pylint: disable=g-import-not-at-top
  from bert_pretrain.training import pretraining  # pylint: disable=g-import-not-at-top
  files = input_pipeline.list_record_files(row["files"])
  packs = row["per_record"] is not None
  slots = records.record_layout(next(records.record_iterator(files[0]))).max_sequences
  predictions = benchmark.PREDICTIONS[row["seq"]]
  with tf.Graph().as_default():
    tf.set_random_seed(benchmark.SEED)
    dataset = input_pipeline.make_dataset(
        files, row["batch"], row["seq"],
        records.max_predictions_per_pack(predictions, slots) if packs else predictions,
        is_training=True, seed=benchmark.SEED, max_sequences=slots if packs else None)
    features = tf.data.make_one_shot_iterator(dataset).get_next()
    dtype = tf.bfloat16 if row["precision"] == "amp" else tf.float32
    train = pretraining.build_train_graph(
        modeling.BertConfig.from_dict(benchmark.bert_config_dict(row["config"])), features,
        dtype, config.Optimizer(learning_rate=benchmark.LEARNING_RATE,
                                num_train_steps=benchmark.TRAIN_STEPS),
        attention_per_sequence=pretraining.attends_per_sequence(row["seq"], dtype, True,
                                                                row["xla"]),
        drop_padding=row["side"] != "padded", seed=benchmark.SEED)
    init = tf.global_variables_initializer()
    with tf.Session(config=pretraining.session_config(row["intra"], row["inter"],
                                                      use_xla=row["xla"])) as sess:
      sess.run(init)
      step = lambda: sess.run(train.update_op)
      for _ in range(1 + row["warmup"]):
        step()
      steps = benchmark.steps_per_window(step, row)
      sentences = row["batch"] * (row["per_record"] or 1.0)
      windows = benchmark.interleaved_fps({"records": step}, sentences, row["windows"],
                                          steps)["records"]
  benchmark.emit({"windows": windows, "steps_per_window": steps})


def measure_row(config_name, seq, precision, xla, data):
  """The three sides of one row, --rounds rounds of turns; returns the row's dict."""
  unpacked, packed, summary = data[seq]
  per_pack = summary["sequences_per_pack"]
  batch = FLAGS.batch_size or BATCH_SIZES[seq]
  row = {"config": config_name, "seq": seq, "precision": precision, "xla": xla,
         "warmup": FLAGS.warmup_steps, "windows": FLAGS.windows, "steps": FLAGS.steps,
         "window_seconds": FLAGS.window_seconds, "window_sequences": FLAGS.window_sequences,
         "intra": FLAGS.intra_threads, "inter": FLAGS.inter_threads}
  sides = {"padded": dict(row, side="padded", files=unpacked, batch=batch, per_record=None),
           "unpadded": dict(row, side="unpadded", files=unpacked, batch=batch,
                            per_record=None),
           "packed": dict(row, side="packed", files=packed,
                          batch=max(1, int(round(batch / per_pack))), per_record=per_pack)}
  name = "%s-seq%d-%s%s" % (config_name, seq, precision, "-xla" if xla else "")
  load_start = os.getloadavg()[0]
  windows = {side: [] for side in SIDES}
  failures = {}
  for round_index in range(FLAGS.rounds):
    first = round_index % len(SIDES)
    for side in SIDES[first:] + SIDES[:first]:
      result = benchmark.run_worker("layout", sides[side], "packing-%s-%s-r%d" % (
          name, side, round_index + 1), script=os.path.abspath(__file__),
                                    row_flag="--layout_row")
      if "error" in result:
        benchmark.log("%s %s: %s" % (name, side, result["error"]))
        failures[side] = result["error"]
        continue
      windows[side].extend(result["windows"])
  return dict(row, batch=batch, packs=sides["packed"]["batch"], per_pack=per_pack,
              padding_before=summary["padding_before"],
              padding_after=summary["padding_after"],
              load_average=[load_start, os.getloadavg()[0]], failures=failures,
              fps={side: ({"median": statistics.median(w), "min": min(w), "max": max(w),
                           "windows": w} if w else None) for side, w in windows.items()})


def markdown(rows):
  """The table: a line a row, each side's median sentences/s (min-max) and packed's
  speed-up over each."""
  lines = ["| model | seq | prec | XLA | batch (packs) | padding before / packed | "
           "load | padded | unpadded | packed | packed / padded | packed / unpadded |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    cells = []
    for side in SIDES:
      f = r["fps"][side]
      cells.append("%.1f (%.1f-%.1f)" % (f["median"], f["min"], f["max"]) if f else
                   "failed: " + r["failures"][side])
    ratio = lambda other: ("%.2fx" % (r["fps"]["packed"]["median"] /
                                      r["fps"][other]["median"])
                           if r["fps"]["packed"] and r["fps"][other] else "n/a")
    lines.append("| %s | %d | %s | %s | %d (%d at %.3f a pack) | %.1f%% / %.1f%% | "
                 "%.2f-%.2f | %s | %s | %s | %s | %s |" % (
                     r["config"], r["seq"], r["precision"], "on" if r["xla"] else "off",
                     r["batch"], r["packs"], r["per_pack"], 100 * r["padding_before"],
                     100 * r["padding_after"], r["load_average"][0], r["load_average"][1],
                     cells[0], cells[1], cells[2], ratio("padded"), ratio("unpadded")))
  return "\n".join(lines)


def run():
  """Makes the data, measures every row and writes the table; returns the rows."""
  seq_lengths = [int(s) for s in FLAGS.seq_lengths]
  data = prepare_data(os.path.join(FLAGS.out_dir, "data"), seq_lengths)
  benchmark.log("CPU: %s" % benchmark.card.cpu_description())
  rows = []
  for seq in seq_lengths:
    for config_name in FLAGS.configs:
      for precision in FLAGS.precisions:
        for xla in ([False, True] if FLAGS.xla_too else [FLAGS.xla]):
          rows.append(measure_row(config_name, seq, precision, xla, data))
          print(markdown(rows[-1:]).splitlines()[-1], flush=True)
  table = "%s\n\n%s\n" % (benchmark.card.cpu_description(), markdown(rows))
  with open(os.path.join(FLAGS.out_dir, "packing.md"), "w") as f:
    f.write(table)
  with open(os.path.join(FLAGS.out_dir, "packing.json"), "w") as f:
    json.dump(rows, f, indent=1)
  print(table)
  return rows


def main(argv):
  if len(argv) > 1:
    errors.unexpected_arguments("packing", argv[1:])
  if FLAGS.layout_row:
    layout_worker(json.loads(FLAGS.layout_row))
    return 0
  benchmark.check_flags("bench.packing")
  if FLAGS.dump_mb < 1:
    errors.usage_error("bench.packing", "--dump_mb=%d; pass 1 or more" % FLAGS.dump_mb)
  errors.make_output_folders("bench.packing", "--out_dir", FLAGS.out_dir, ("logs",))
  from bert_pretrain.wiki import workdir  # pylint: disable=g-import-not-at-top
  try:
    rows = benchmark.stoppable("bench.packing", run)
  except workdir.PrepareError as e:
    print("bench.packing: error: %s" % e, file=sys.stderr)
    return 2
  failed = sum(r["fps"][side] is None for r in rows for side in SIDES)
  if failed:
    errors.print_error("bench.packing", benchmark.failed_cells_line(
        failed, len(rows) * len(SIDES), FLAGS.out_dir))
    return 1
  return 0


if __name__ == "__main__":
  FLAGS.set_default("configs", ["mini"])
  FLAGS.set_default("precisions", ["fp32"])
  FLAGS.set_default("rounds", 2)
  errors.run_main("bench.packing", main)
