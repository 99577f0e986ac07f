# coding=utf-8
r"""Measures the data preparation, stage by stage, against a plain Google-rules baseline.

  python3 bench/benchmark_data.py --dump=enwiki-...-pages-articles.xml.bz2 \
      --vocab=vocab.txt --jobs=1,2

Runs every step of the Wikipedia pipeline (bert_pretrain/wiki, which tools/prepare_wiki.sh
runs) on the dump once per --jobs value and prints, for each step, its input size,
seconds, MB/s, articles/s and instances/s. Then it runs, in this process and on the same
first --baseline_mb of training text:

  - the baseline: a straightforward single-process implementation of Google's
    create_pretraining_data rules (pure-Python tokenizer, per-token truncation and
    masking loops, tf.train.Example protos), written out below;
  - bert_pretrain.create_pretraining_data, which the pipeline runs per shard;

and prints both side by side with their statistics (instances, masked fraction,
random-next fraction), which must agree. TensorFlow is imported before any timing.

Without a real dump, --synthesize_mb builds one by repeating the pages of a small
export (tests/data/wiki_sample.xml) under new titles, with their paragraphs rotated.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import bz2
import collections
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from xml.sax import saxutils

from absl import flags
from absl import logging

# Before TensorFlow: importing the pipeline sets TF_CPP_MIN_LOG_LEVEL=2 (unless set).
from bert_pretrain.wiki import extract
from bert_pretrain.wiki import pipeline
from bert_pretrain.wiki import workdir
import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top,wrong-import-order

from bert_pretrain import create_pretraining_data  # pylint: disable=g-import-not-at-top
from bert_pretrain import errors  # pylint: disable=g-import-not-at-top
from bert_pretrain import processes  # pylint: disable=g-import-not-at-top
from bert_pretrain.data import tokenization  # pylint: disable=g-import-not-at-top

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = "benchmark_data"
FLAGS = flags.FLAGS


# ----------------------------------------------------------------------------------------
# The baseline: Google's create_pretraining_data rules, written plainly.
# ----------------------------------------------------------------------------------------

BaselineInstance = collections.namedtuple(
    "BaselineInstance", "tokens segment_ids masked_lm_positions masked_lm_labels "
    "is_random_next")


def baseline_read_documents(input_files, tokenizer):
  """Google's reading: one tokenized sentence a line, a blank line ends a document."""
  documents = [[]]
  for path in input_files:
    with open(path, encoding="utf-8") as reader:
      for line in reader:
        line = line.strip()
        if not line:
          documents.append([])
          continue
        tokens = tokenizer.reference_tokenize(line)
        if tokens:
          documents[-1].append(tokens)
  return [document for document in documents if document]


def baseline_truncate_pair(tokens_a, tokens_b, max_num_tokens, rng):
  """Removes one token at a time from the longer segment, front or back by coin flip."""
  while len(tokens_a) + len(tokens_b) > max_num_tokens:
    longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    if rng.random() < 0.5:
      del longer[0]
    else:
      longer.pop()


def baseline_mask(tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng):
  """Google's masking: shuffle candidates, take num_to_predict, 80/10/10 each."""
  candidates = [i for i, token in enumerate(tokens) if token not in ("[CLS]", "[SEP]")]
  rng.shuffle(candidates)
  output_tokens = list(tokens)
  num_to_predict = min(max_predictions_per_seq,
                       max(1, int(round(len(tokens) * masked_lm_prob))))
  masked = []
  for index in candidates:
    if len(masked) >= num_to_predict:
      break
    if rng.random() < 0.8:
      replacement = "[MASK]"
    elif rng.random() < 0.5:
      replacement = tokens[index]
    else:
      replacement = vocab_words[rng.randint(0, len(vocab_words) - 1)]
    output_tokens[index] = replacement
    masked.append((index, tokens[index]))
  masked.sort()
  return output_tokens, [i for i, _ in masked], [t for _, t in masked]


def baseline_instances_from_document(documents, document_index, max_seq_length,
                                     short_seq_prob, masked_lm_prob,
                                     max_predictions_per_seq, vocab_words, rng):
  """Google's cutting of one document into A/B pairs, then masking each."""
  document = documents[document_index]
  max_num_tokens = max_seq_length - 3
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  instances = []
  chunk = []
  chunk_length = 0
  i = 0
  while i < len(document):
    chunk.append(document[i])
    chunk_length += len(document[i])
    if i == len(document) - 1 or chunk_length >= target_seq_length:
      if chunk:
        a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
        tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
        tokens_b = []
        is_random_next = False
        if len(chunk) == 1 or rng.random() < 0.5:
          is_random_next = True
          target_b_length = target_seq_length - len(tokens_a)
          for _ in range(10):
            random_index = rng.randint(0, len(documents) - 1)
            if random_index != document_index:
              break
          other = documents[random_index]
          start = rng.randint(0, len(other) - 1)
          for j in range(start, len(other)):
            tokens_b.extend(other[j])
            if len(tokens_b) >= target_b_length:
              break
          i -= len(chunk) - a_end
        else:
          for sentence in chunk[a_end:]:
            tokens_b.extend(sentence)
        baseline_truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
        tokens = ["[CLS]"] + tokens_a + ["[SEP]"] + tokens_b + ["[SEP]"]
        segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
        tokens, positions, labels = baseline_mask(tokens, masked_lm_prob,
                                                  max_predictions_per_seq, vocab_words,
                                                  rng)
        instances.append(BaselineInstance(tokens, segment_ids, positions, labels,
                                          is_random_next))
      chunk = []
      chunk_length = 0
    i += 1
  return instances


def baseline_write(instances, tokenizer, output_file, max_seq_length,
                   max_predictions_per_seq):
  """Google's writing: one tf.train.Example proto per instance."""
  def int_feature(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))

  writer = tf.io.TFRecordWriter(output_file)
  for instance in instances:
    input_ids = tokenizer.convert_tokens_to_ids(instance.tokens)
    input_mask = [1] * len(input_ids)
    segment_ids = list(instance.segment_ids)
    while len(input_ids) < max_seq_length:
      input_ids.append(0)
      input_mask.append(0)
      segment_ids.append(0)
    positions = list(instance.masked_lm_positions)
    label_ids = tokenizer.convert_tokens_to_ids(instance.masked_lm_labels)
    weights = [1.0] * len(label_ids)
    while len(positions) < max_predictions_per_seq:
      positions.append(0)
      label_ids.append(0)
      weights.append(0.0)
    features = collections.OrderedDict()
    features["input_ids"] = int_feature(input_ids)
    features["input_mask"] = int_feature(input_mask)
    features["segment_ids"] = int_feature(segment_ids)
    features["masked_lm_positions"] = int_feature(positions)
    features["masked_lm_ids"] = int_feature(label_ids)
    features["masked_lm_weights"] = tf.train.Feature(
        float_list=tf.train.FloatList(value=weights))
    features["next_sentence_labels"] = int_feature([1 if instance.is_random_next else 0])
    example = tf.train.Example(features=tf.train.Features(feature=features))
    writer.write(example.SerializeToString())
  writer.close()


def run_baseline(input_files, output_file, vocab_file, max_seq_length,
                 max_predictions_per_seq, masked_lm_prob=0.15, short_seq_prob=0.1,
                 dupe_factor=10, random_seed=12345):
  """Runs the baseline; returns its statistics and the seconds of each phase."""
  tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=True, use_fast=False)
  rng = random.Random(random_seed)
  timings = collections.OrderedDict()
  start = time.time()
  documents = baseline_read_documents(input_files, tokenizer)
  timings["tokenize"] = time.time() - start
  start = time.time()
  rng.shuffle(documents)
  vocab_words = list(tokenizer.vocab.keys())
  instances = []
  for _ in range(dupe_factor):
    for document_index in range(len(documents)):
      instances.extend(baseline_instances_from_document(
          documents, document_index, max_seq_length, short_seq_prob, masked_lm_prob,
          max_predictions_per_seq, vocab_words, rng))
  rng.shuffle(instances)
  timings["instances_and_masking"] = time.time() - start
  start = time.time()
  baseline_write(instances, tokenizer, output_file, max_seq_length,
                 max_predictions_per_seq)
  timings["write"] = time.time() - start
  tokens = sum(len(i.tokens) for i in instances)
  return {
      "num_instances": len(instances),
      "num_instance_tokens": tokens,
      "num_masked_tokens": sum(len(i.masked_lm_positions) for i in instances),
      "num_random_next": sum(i.is_random_next for i in instances),
      "timings": timings,
      "seconds": sum(timings.values()),
  }


# ----------------------------------------------------------------------------------------
# A larger dump from a small one.
# ----------------------------------------------------------------------------------------


def synthesize_dump(source, target_bytes, output, pages_per_stream=100):
  """Writes a MediaWiki export of about target_bytes by repeating `source`'s pages.

  Copy k of a page is titled "<title> (k)" and has its blank-line-separated blocks
  rotated by k, so documents differ in order. When `output` ends in .bz2 it is written
  as Wikimedia's -multistream dumps are: one bz2 stream per `pages_per_stream` pages.

  Returns:
    the uncompressed size written.
  """
  pages = list(extract.iter_pages(source))
  compress = output.endswith(".bz2")
  written = 0
  with open(output, "wb") as writer:
    def emit(text):
      data = text.encode("utf-8")
      writer.write(bz2.compress(data) if compress else data)
      return len(data)

    written += emit('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" '
                    'version="0.10" xml:lang="en">\n')
    copy = 0
    page_id = 0
    group = []
    while written < target_bytes:
      copy += 1
      for page in pages:
        page_id += 1
        blocks = page.text.split("\n\n")
        shift = copy % len(blocks)
        text = "\n\n".join(blocks[shift:] + blocks[:shift])
        title = page.title if copy == 1 else "%s (%d)" % (page.title, copy)
        redirect = '<redirect title="x" />' if page.redirect else ""
        group.append("<page><title>%s</title><ns>%d</ns><id>%d</id>%s<revision><text "
                     'xml:space="preserve">%s</text></revision></page>\n'
                     % (saxutils.escape(title), page.namespace, page_id, redirect,
                        saxutils.escape(text)))
        if len(group) == pages_per_stream:
          written += emit("".join(group))
          group = []
    if group:
      written += emit("".join(group))
    written += emit("</mediawiki>\n")
  return written


# ----------------------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------------------


def _folder_bytes(folder, suffix=""):
  total = 0
  for name in os.listdir(folder):
    if name.endswith(suffix) and ".tmp" not in name:
      total += os.path.getsize(os.path.join(folder, name))
  return total


def benchmark_pipeline(dump, vocab, output_dir, jobs, settings, xml_bytes):
  """Runs each step of the pipeline once.

  Returns:
    rows of (step, input bytes, wall seconds, CPU seconds, articles, instances).
  """
  if os.path.exists(output_dir):
    shutil.rmtree(output_dir)
  layout = workdir.Layout(output_dir)
  rows = []
  # Step pack (packed training records) is this recipe's own, not MLCommons' data, and
  # runs only with --pack; the table times the steps every dataset goes through.
  for step in [s for s in pipeline.STEPS if s != "pack"]:
    start = time.time()
    cpu_start = _cpu_seconds()
    pipeline.run_pipeline(output_dir, dump=dump, vocab=vocab, steps=step, jobs=jobs,
                          **settings)
    seconds = time.time() - start
    cpu = _cpu_seconds() - cpu_start
    marker = workdir.read_json(layout.marker(step)) or {}
    stats = marker.get("stats", {})
    articles = instances = 0
    if step == "extract":
      input_bytes = xml_bytes
      articles = stats.get("text_pages", 0)
    elif step == "clean":
      input_bytes = _folder_bytes(layout.extracted, ".jsonl")
      articles = stats.get("articles", 0)
    elif step == "segment":
      input_bytes = _folder_bytes(layout.cleaned, ".jsonl")
      articles = stats.get("articles", 0)
    elif step == "shard":
      input_bytes = _folder_bytes(layout.sentences, ".jsonl")
      articles = stats.get("train_articles", 0) + stats.get("eval_articles", 0)
    elif step == "tfrecords":
      input_bytes = _folder_bytes(layout.text_train) + os.path.getsize(layout.eval_text)
      shard_stats = workdir.read_json(layout.marker("shard"))["stats"]
      articles = shard_stats["train_articles"] + shard_stats["eval_articles"]
      for name in os.listdir(os.path.join(layout.done, "tfrecords")):
        instances += workdir.read_json(
            os.path.join(layout.done, "tfrecords", name))["stats"]["num_instances"]
    elif step == "eval":
      input_bytes = os.path.getsize(layout.eval_all)
    else:
      input_bytes = 0
    rows.append((step, input_bytes, seconds, cpu, articles, instances))
  return rows


def _cpu_seconds():
  """CPU seconds of this process and its finished children (pool workers)."""
  times = os.times()
  return times.user + times.system + times.children_user + times.children_system


def first_documents(files, max_bytes, output):
  """Copies whole documents from text shards into `output` up to max_bytes."""
  written = 0
  with open(output, "w", encoding="utf-8") as writer:
    for path in files:
      with open(path, encoding="utf-8") as reader:
        for document in reader.read().split("\n\n"):
          if not document.strip():
            continue
          writer.write(document.strip("\n") + "\n\n")
          written += len(document.encode("utf-8")) + 2
          if written >= max_bytes:
            return written
  return written


def _rate(amount, seconds):
  return amount / seconds if seconds > 0 else 0.0


def train_vocab(dump, work):
  """Trains a vocabulary of BERT's size on the dump's own extracted text; returns its
  path (for a run given no --vocab)."""
  vocab = os.path.join(work, "vocab.txt")
  probe = os.path.join(work, "probe")
  pipeline.run_pipeline(probe, dump=dump, steps="extract,clean", jobs=1,
                        pages_per_chunk=FLAGS.pages_per_chunk)
  text_file = os.path.join(work, "vocab_text.txt")
  with open(text_file, "w", encoding="utf-8") as writer:
    for name in sorted(os.listdir(os.path.join(probe, "work", "cleaned"))):
      if name.endswith(".jsonl"):
        with open(os.path.join(probe, "work", "cleaned", name), encoding="utf-8") as f:
          for line in f:
            writer.write(json.loads(line)["text"] + "\n")
  tokenization.build_wordpiece_vocab([text_file], 30522, vocab)
  shutil.rmtree(probe)
  return vocab


def check_flags():
  """Refuses, in one line, a command line that cannot run, before any work."""
  if FLAGS.synthesize_mb < 0:
    errors.usage_error(TOOL, "--synthesize_mb=%g must be positive (the MB of the dump to "
                       "build)" % FLAGS.synthesize_mb)
  if bool(FLAGS.dump) == bool(FLAGS.synthesize_mb):
    errors.usage_error(TOOL, "%s; pass --dump=<a MediaWiki dump> or --synthesize_mb=<MB> "
                       "(one built from --synthesize_from)" % (
                           "both --dump and --synthesize_mb given" if FLAGS.dump else
                           "no dump to measure on"))
  for flag, path in (("--dump", FLAGS.dump), ("--vocab", FLAGS.vocab),
                     ("--synthesize_from", FLAGS.synthesize_mb and FLAGS.synthesize_from)):
    if path and not os.path.isfile(path):
      errors.usage_error(TOOL, "%s=%s: no such file; check the path" % (flag, path))
  for jobs in FLAGS.jobs.split(","):
    if not jobs.strip().isdigit() or int(jobs) < 1:
      errors.usage_error(TOOL, "--jobs: %r is not a positive whole number; pass e.g. "
                         "--jobs=1,2" % jobs)


def main(argv):
  if len(argv) > 1:
    errors.unexpected_arguments(TOOL, argv[1:])
  check_flags()
  errors.take_stop_signals()
  work = FLAGS.work_dir or tempfile.mkdtemp(prefix="benchmark_data-")
  kept = ("its temporary folder is removed" if not FLAGS.work_dir else
          "--work_dir=%s holds what was done" % FLAGS.work_dir)
  try:
    measure(work)
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM's errors.Terminated
    sys.exit(errors.stopped_by_signal(TOOL, e, "%s; run the same command again" % kept))
  except processes.WorkerDied:
    sys.exit("%s: error: a worker process ended abruptly (killed, or out of memory: see "
             "dmesg); %s; run the same command again, with fewer --jobs if memory ran out"
             % (TOOL, kept))
  except workdir.PrepareError as e:
    sys.exit("%s: error: %s" % (TOOL, e))
  finally:
    if not FLAGS.work_dir:
      shutil.rmtree(work, ignore_errors=True)


def measure(work):
  """Times the pipeline's steps and the baseline against ours, in `work`."""
  tf.logging.set_verbosity(tf.logging.ERROR)
  logging.set_verbosity(logging.WARNING)
  os.makedirs(work, exist_ok=True)
  dump = FLAGS.dump
  if FLAGS.synthesize_mb:
    dump = os.path.join(work, "synthetic-pages-articles.xml.bz2")
    xml_bytes = synthesize_dump(FLAGS.synthesize_from, int(FLAGS.synthesize_mb * 1e6), dump)
  elif dump.endswith(".bz2"):
    xml_bytes = 0
    with bz2.open(dump, "rb") as reader:
      for block in iter(lambda: reader.read(1 << 24), b""):
        xml_bytes += len(block)
  else:
    xml_bytes = os.path.getsize(dump)
  vocab = FLAGS.vocab or train_vocab(dump, work)
  settings = dict(num_shards=FLAGS.num_shards, num_eval_articles=FLAGS.num_eval_articles,
                  num_eval_samples=FLAGS.num_eval_samples,
                  max_seq_length=FLAGS.max_seq_length,
                  max_predictions_per_seq=FLAGS.max_predictions_per_seq,
                  dupe_factor=FLAGS.dupe_factor, pages_per_chunk=FLAGS.pages_per_chunk)
  print("dump %s: %.1f MB of XML (%.1f MB on disk); %d/%d, dupe_factor %d; %d CPUs"
        % (dump, xml_bytes / 1e6, os.path.getsize(dump) / 1e6, FLAGS.max_seq_length,
           FLAGS.max_predictions_per_seq, FLAGS.dupe_factor, os.cpu_count() or 1))
  results = {}
  for jobs in [int(j) for j in FLAGS.jobs.split(",")]:
    rows = benchmark_pipeline(dump, vocab, os.path.join(work, "jobs%d" % jobs), jobs,
                              settings, xml_bytes)
    results[jobs] = rows
    print("\n--jobs=%d" % jobs)
    print("%-10s %9s %7s %7s %7s %10s %11s %12s" % (
        "step", "input MB", "wall s", "MB/s", "CPU s", "MB/CPU-s", "articles/s",
        "instances/s"))
    for step, input_bytes, seconds, cpu, articles, instances in rows:
      print("%-10s %9.2f %7.2f %7.2f %7.2f %10.2f %11.0f %12.0f"
            % (step, input_bytes / 1e6, seconds, _rate(input_bytes / 1e6, seconds), cpu,
               _rate(input_bytes / 1e6, cpu), _rate(articles, seconds),
               _rate(instances, seconds)))
    total = sum(row[2] for row in rows)
    total_cpu = sum(row[3] for row in rows)
    print("%-10s %9.2f %7.2f %7.2f %7.2f %10.2f  (MB of XML, all steps)"
          % ("total", xml_bytes / 1e6, total, _rate(xml_bytes / 1e6, total), total_cpu,
             _rate(xml_bytes / 1e6, total_cpu)))
    if jobs == 1:
      # Linux reports kilobytes; the steps ran in this process.
      print("peak memory of this process so far: %.0f MB (shards of %.1f MB)"
            % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
               next(row[1] for row in rows if row[0] == "tfrecords") / 1e6 /
               (FLAGS.num_shards + 1)))
    print("load average: %.2f %.2f %.2f" % os.getloadavg())

  # Baseline and ours on the same text, one process each.
  layout = workdir.Layout(os.path.join(work, "jobs%s" % FLAGS.jobs.split(",")[0]))
  shards = sorted(os.path.join(layout.text_train, n) for n in os.listdir(layout.text_train)
                  if ".tmp" not in n)
  sample = os.path.join(work, "baseline_input.txt")
  sample_bytes = first_documents(shards, int(FLAGS.baseline_mb * 1e6), sample)
  common = dict(max_seq_length=FLAGS.max_seq_length,
                max_predictions_per_seq=FLAGS.max_predictions_per_seq,
                dupe_factor=FLAGS.dupe_factor)
  baseline = run_baseline([sample], os.path.join(work, "baseline.tfrecord"), vocab,
                          **common)
  # Both in this process, so both tokenize on one core.
  os.environ["TOKENIZERS_PARALLELISM"] = "false"
  start = time.time()
  ours = create_pretraining_data.create_pretraining_data(
      [sample], [os.path.join(work, "ours.tfrecord")], vocab, **common)
  ours_seconds = time.time() - start
  print("\nSame %.2f MB of training text, one process, %d/%d, dupe_factor %d:"
        % (sample_bytes / 1e6, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
           FLAGS.dupe_factor))
  print("%-34s %8s %8s %12s %10s %10s %10s" % ("", "s", "MB/s", "instances/s",
                                                "instances", "masked", "random_next"))
  for name, stats, seconds in (("baseline (Google's rules, Python)", baseline,
                                baseline["seconds"]),
                               ("ours (create_pretraining_data)", ours, ours_seconds)):
    print("%-34s %8.2f %8.3f %12.0f %10d %9.2f%% %9.1f%%"
          % (name, seconds, _rate(sample_bytes / 1e6, seconds),
             _rate(stats["num_instances"], seconds), stats["num_instances"],
             100.0 * stats["num_masked_tokens"] / max(stats["num_instance_tokens"], 1),
             100.0 * stats["num_random_next"] / max(stats["num_instances"], 1)))
  print("baseline time: %s" % ", ".join(
      "%s %.0f%%" % (k, 100 * v / baseline["seconds"]) for k, v in
      baseline["timings"].items()))
  print("speed-up of ours over the baseline: %.1fx"
        % (baseline["seconds"] / max(ours_seconds, 1e-9)))


if __name__ == "__main__":
  flags.DEFINE_string("dump", None, "MediaWiki dump (.xml or .xml.bz2) to measure on.")
  flags.DEFINE_float("synthesize_mb", 0,
                     "Instead of --dump: build a dump of this many MB of XML from "
                     "--synthesize_from.")
  flags.DEFINE_string("synthesize_from",
                      os.path.join(ROOT, "tests", "data", "wiki_sample.xml"),
                      "Small export whose pages --synthesize_mb repeats.")
  flags.DEFINE_string("vocab", None,
                      "vocab.txt; default: a 30522-token WordPiece vocab trained on the "
                      "dump's text.")
  flags.DEFINE_string("work_dir", None, "Folder for the outputs (default: a temporary "
                      "folder, removed at the end, on an error and when stopped).")
  flags.DEFINE_string("jobs", "1,2", "Comma-separated --jobs values to run the steps with.")
  flags.DEFINE_integer("num_shards", 8, "Text shards.")
  flags.DEFINE_integer("num_eval_articles", 200, "Held-out articles.")
  flags.DEFINE_integer("num_eval_samples", 1000, "Eval records picked.")
  flags.DEFINE_integer("pages_per_chunk", 2000, "Pages per extraction chunk.")
  flags.DEFINE_integer("max_seq_length", 512, "Maximum sequence length.")
  flags.DEFINE_integer("max_predictions_per_seq", 76, "Maximum predictions per sequence.")
  flags.DEFINE_integer("dupe_factor", 10, "Passes over the data.")
  flags.DEFINE_float("baseline_mb", 1.0,
                     "MB of training text given to the baseline and ours side by side.")
  errors.run_main(TOOL, main)
