r"""Prepares the MLPerf BERT dataset from a Wikipedia dump, resumably and in parallel.

One command does what MLCommons' cleanup scripts do by hand (WikiExtractor, cleanup,
sentence segmentation, a held-out test set, 500 shards, create_pretraining_data on each
shard, pick_eval_samples):

  bash tools/prepare_wiki.sh --dump=enwiki-20200101-pages-articles-multistream.xml.bz2 \
      --vocab=vocab.txt --output_dir=/data/bert_wiki --jobs=16

The steps, in order (--steps runs a subset; each step reads what the one before wrote):

  extract    MediaWiki XML (.xml or .xml.bz2; a -multistream .bz2 is decompressed on
             --jobs cores), streamed through an incremental XML parser -> plain-text
             pages, work/extracted/chunk-NNNNN.jsonl, --pages_per_chunk pages a chunk.
  clean      drops redirects, disambiguation pages, other namespaces, markup remnants and
             near-empty articles -> work/cleaned/chunk-NNNNN.jsonl.
  segment    one sentence a line (rule-based, no download) -> work/sentences/*.jsonl.
  shard      holds out the --num_eval_articles articles with the smallest sha256 of their
             title, and deals the others to --num_shards text shards balanced by bytes ->
             text/train/part-00000-of-00500 ..., text/eval/eval.txt.
  tfrecords  bert_pretrain.create_pretraining_data on every shard (one task per shard,
             --jobs at once) -> train_data/part-00000-of-00500 ..., and on the held-out
             text -> eval_intermediate/eval_all.
  pack       with --pack only: bert_pretrain.pack_records on train_data/, up to
             --max_sequences_per_pack sequences a record, shuffled with --random_seed
             -> packed_train_data/part-00000-of-00500 ... (the eval set stays unpacked).
  eval       exactly --num_eval_samples records, record int(i * n / k) for i < k as
             MLCommons' pick_eval_samples.py -> eval_data/eval_<k>.
  manifest   manifest.json: settings, counts (pages, articles, sentences, tokens,
             instances, bytes) and the size and sha256 of every output file.

Every file is written under a temporary name and renamed when complete, and every
finished unit of work (a chunk, the shards, a TFRecord shard) leaves a done-marker in
work/done/ with its settings, inputs and outputs. A run started again after a kill
skips every unit whose marker matches and whose outputs are there, and redoes the rest.
Each long step prints a progress line with its rate and ETA to stderr every 15 s.
output_dir/settings.json records the settings. Another value of a step's setting redoes
that step and the steps after it (one line says which) and keeps the others' work; where
those had finished, only with --redo_changed_steps (the vocab and lower-casing are step
tfrecords' settings). A folder made from another dump is refused. The same dump, vocab and
settings give byte-identical files, whatever --jobs.
"""

import os
import shlex
import sys

from absl import flags
from absl import logging

from bert_pretrain import errors
from bert_pretrain import processes
from bert_pretrain.wiki.pipeline import (DEFAULTS, STEPS, describe_os_error, parse_steps,
                                         run_pipeline)
from bert_pretrain.wiki.workdir import Layout, PrepareError


def define_flags():
  """Defines the command-line flags; only when run as a script."""
  flags.DEFINE_string("dump", None,
                      "MediaWiki export: enwiki-YYYYMMDD-pages-articles.xml or .xml.bz2.")
  flags.DEFINE_string("vocab", None, "The model's WordPiece vocab.txt.")
  flags.DEFINE_string("output_dir", None, "Folder for the dataset (created if missing).")
  flags.DEFINE_string("steps", "all", "Steps to run: 'all' or a comma-separated subset of "
                      + ",".join(STEPS) + ".")
  flags.DEFINE_integer("jobs", os.cpu_count() or 1,
                       "Processes for the parallel steps (extract, clean, segment, "
                       "tfrecords); about 1-2 GB of memory each at the MLPerf settings.")
  flags.DEFINE_bool("verify", False, "Manifest: re-hash every output file.")
  flags.DEFINE_bool("redo_changed_steps", False, "Another value of a setting redoes the "
                    "steps that use it even where they finished (their work is deleted).")
  flags.DEFINE_bool("pack", False, "Also pack the training records (step pack) into "
                    "packed_train_data/.")
  flags.DEFINE_integer("pages_per_chunk", DEFAULTS["pages_per_chunk"],
                       "Pages per extraction chunk (the unit of resuming extract).")
  flags.DEFINE_integer("min_article_chars", DEFAULTS["min_article_chars"],
                       "Articles with less cleaned text than this are dropped.")
  flags.DEFINE_integer("num_shards", DEFAULTS["num_shards"], "Training text shards.")
  flags.DEFINE_integer("num_eval_articles", DEFAULTS["num_eval_articles"],
                       "Articles held out for the eval set (MLCommons: 10000).")
  flags.DEFINE_integer("num_eval_samples", DEFAULTS["num_eval_samples"],
                       "Records in the eval set (MLPerf: 10000).")
  flags.DEFINE_bool("do_lower_case", DEFAULTS["do_lower_case"],
                    "Lower-case and strip accents (True for uncased models).")
  flags.DEFINE_integer("max_seq_length", DEFAULTS["max_seq_length"],
                       "Maximum sequence length.")
  flags.DEFINE_integer("max_predictions_per_seq", DEFAULTS["max_predictions_per_seq"],
                       "Maximum masked LM predictions per sequence.")
  flags.DEFINE_float("masked_lm_prob", DEFAULTS["masked_lm_prob"], "Masked LM probability.")
  flags.DEFINE_float("short_seq_prob", DEFAULTS["short_seq_prob"],
                     "Probability of a shorter target length for a document.")
  flags.DEFINE_integer("dupe_factor", DEFAULTS["dupe_factor"],
                       "Passes over the data, each with other cuts and masks.")
  flags.DEFINE_integer("random_seed", DEFAULTS["random_seed"],
                       "Seed of create_pretraining_data (the same for every shard, as "
                       "MLCommons).")
  flags.DEFINE_bool("do_whole_word_mask", DEFAULTS["do_whole_word_mask"],
                    "Mask whole words (MLPerf: False).")
  flags.DEFINE_integer("max_sequences_per_pack", DEFAULTS["max_sequences_per_pack"],
                       "With --pack: the most sequences in one packed record.")


def main(argv):
  """Runs the pipeline from the flags; exits with one line on bad input or a file error
  (2, as every tool), a worker that died (1) or a signal (130, 143)."""
  if len(argv) > 1:
    errors.unexpected_arguments("prepare_wiki", argv[1:])
  errors.take_stop_signals()
  flag_values = flags.FLAGS
  if not flag_values["verbosity"].present:
    # create_pretraining_data logs two INFO lines per shard; the progress line suffices.
    logging.set_verbosity(logging.WARNING)
  try:
    manifest = run_pipeline(
        flag_values.output_dir, dump=flag_values.dump, vocab=flag_values.vocab,
        steps=flag_values.steps, jobs=flag_values.jobs, verify=flag_values.verify,
        pack=flag_values.pack, redo_changed_steps=flag_values.redo_changed_steps,
        **{key: flag_values[key].value for key in DEFAULTS})
  except processes.WorkerDied as e:
    errors.print_error("prepare_wiki", e)
    return 1
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM's errors.Terminated
    return errors.stopped_by_signal(
        "prepare_wiki", e, "run the same command again to go on where it stopped")
  except (PrepareError, ValueError) as e:
    # ValueError: create_pretraining_data's own one-line errors (an unusable vocab, say).
    errors.print_error("prepare_wiki", e)
    return 2
  except OSError as e:
    errors.print_error("prepare_wiki", describe_os_error(e, flag_values.output_dir))
    return 2
  layout = Layout(flag_values.output_dir)
  if os.path.exists(layout.manifest) and "manifest" in parse_steps(flag_values.steps):
    # Quoted, so that the flags can be pasted into a shell as they are.
    print("prepare_wiki: done. Train with --input_files_dir=%s --eval_files_dir=%s"
          % (shlex.quote(layout.train_data), shlex.quote(layout.eval_data)))
    if flag_values.pack:
      print("prepare_wiki: the packed training records are in %s"
            % layout.packed_train_data)
  if manifest is not None and flag_values.verify:
    print("prepare_wiki: --verify: the %d output files hash as their markers recorded"
          % len(manifest["files"]))


if __name__ == "__main__":
  define_flags()
  errors.run_main("prepare_wiki", main)
