# coding=utf-8
r"""Inspects BERT pretraining TFRecords: counts, feature spec, corruption, masking.

Answers "is this the data I think it is?" before hours of training are spent on it:

  python3 tools/inspect_tfrecords.py --input=/data/bert_wiki/train_data \
      --vocab=vocab.txt --num_examples=2

(or python3 -m bert_pretrain.inspect_records with the same flags)

  - counts the records and bytes of every file (from the TFRecord framing, fast);
  - checks every record's CRCs and reports each corrupt one with its file, byte offset
    and index (--check_crc, on by default), and a file cut short with where it ends;
  - checks the feature spec and lengths of the records it reads for statistics:
    the seven features, int64/float lists of max_seq_length / max_predictions_per_seq
    values (taken from the first record unless given), input_mask a run of ones then
    zeros, masked positions ascending inside the sequence, ids inside the vocab;
  - recognises packed records (python3 -m bert_pretrain.pack_records; records.py, the
    packed format) by their features, checks their layout, and takes their
    statistics and decoded examples sequence by sequence, with the packs' sequences
    per pack and padding;
  - prints masking statistics: the fraction of real tokens predicted, how the
    predicted tokens were changed ([MASK] / kept / random, Google's 80/10/10), the
    fraction of random next sentences (about 0.5) and the sequence lengths;
  - decodes a few records back to text with the vocab, each masked position shown as
    [MASK]{true token}, kept{=true}, or random{~true}.

It exits with status 1 when a record is corrupt or breaks the spec, 2 on bad input.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import os
import sys

from absl import flags

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top

from bert_pretrain import errors  # pylint: disable=g-import-not-at-top
from bert_pretrain.data import input_pipeline  # pylint: disable=g-import-not-at-top
from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
from bert_pretrain.data import tokenization  # pylint: disable=g-import-not-at-top

# At most this many problems of one kind are listed; the rest are only counted.
_MAX_LISTED = 10


class InspectError(Exception):
  """Bad input (no files, an unreadable vocab); the message says how to fix it."""


def decode_example(values, inv_vocab, mask_id):
  """Renders one record as text: [CLS] a b [MASK]{c} ... [SEP] ... [SEP].

  Args:
    values: dict from records.parse_example.
    inv_vocab: dict id -> token.
    mask_id: the [MASK] id.

  Returns:
    str.
  """
  length = int(values["input_mask"].sum())
  weights = values["masked_lm_weights"]
  num_predictions = int((weights > 0).sum())
  truth = dict(zip(values["masked_lm_positions"][:num_predictions].tolist(),
                   values["masked_lm_ids"][:num_predictions].tolist()))
  words = []
  for position, token_id in enumerate(values["input_ids"][:length].tolist()):
    token = inv_vocab.get(token_id, "<%d>" % token_id)
    if position in truth:
      true_token = inv_vocab.get(truth[position], "<%d>" % truth[position])
      if token_id == mask_id:
        token = "[MASK]{%s}" % true_token
      elif token_id == truth[position]:
        token = "%s{=%s}" % (token, true_token)
      else:
        token = "%s{~%s}" % (token, true_token)
    words.append(token)
  return " ".join(words)


def _read_vocab(vocab_file):
  """(id -> token dict, the [MASK] id, the vocabulary size) of vocab_file, or Nones."""
  if not vocab_file:
    return None, None, None
  if os.path.isdir(vocab_file):
    raise InspectError("--vocab=%s is a folder; pass the vocab file (the vocab.txt the "
                       "records were made with), or leave --vocab out" % vocab_file)
  if not os.path.isfile(vocab_file):
    raise InspectError("vocab file %s does not exist; pass the vocab.txt the records "
                       "were made with, or leave --vocab out" % vocab_file)
  vocab = tokenization.load_vocab(vocab_file)
  missing = tokenization.missing_special_tokens(vocab)
  if missing:  # not the records' fault: every id would read as outside the vocab
    raise InspectError("vocab file %s lacks %s; pass the vocab.txt the records were made "
                       "with, or leave --vocab out" % (vocab_file, " ".join(missing)))
  return ({v: k for k, v in vocab.items()}, vocab.get("[MASK]"),
          max(vocab.values()) + 1)


def _record_problem(values, packed, max_seq_length, max_predictions_per_seq, vocab_size):
  """(what is wrong with a parsed record or None, max_predictions_per_seq): the
  expected predictions per sequence, taken from this record when None."""
  if packed:
    sequences_per_pack = len(values["next_sentence_labels"])
    if max_predictions_per_seq is None:
      max_predictions_per_seq = len(values["masked_lm_ids"]) - sequences_per_pack
    return records.packed_example_problem(
        values, max_seq_length,
        records.max_predictions_per_pack(max_predictions_per_seq, sequences_per_pack),
        sequences_per_pack, vocab_size), max_predictions_per_seq
  if max_predictions_per_seq is None:
    max_predictions_per_seq = len(values["masked_lm_ids"])
  return records.example_problem(values, max_seq_length, max_predictions_per_seq,
                                 vocab_size), max_predictions_per_seq


def inspect_files(files, vocab_file=None, max_seq_length=None,
                  max_predictions_per_seq=None, num_examples=2, stats_records=100000,
                  check_crc=True):
  """Inspects TFRecord files; returns a report dict (see format_report).

  Args:
    files: list of TFRecord paths.
    vocab_file: (optional) vocab.txt, to decode examples and check ids.
    max_seq_length: expected length, or None to take it from the first record.
    max_predictions_per_seq: expected length, or None to take it from the first record.
    num_examples: records decoded into the report.
    stats_records: records parsed for the spec check and statistics (0: all).
    check_crc: read every record through TensorFlow's CRC check.

  Returns:
    dict with files, records, bytes, problems (list of str), corrupt (list of dicts),
    lengths, statistics and examples.
  """
  (inv_vocab, mask_id, vocab_size) = _read_vocab(vocab_file)
  report = {"files": [], "records": 0, "bytes": 0, "problems": [], "corrupt": [],
            "spec_errors": 0, "examples": [], "packed": None}
  packs = collections.Counter()
  counts = collections.Counter()
  masked_ids = collections.Counter()
  lengths = []
  parsed = 0
  for path in files:
    offsets, framing_error = records.record_offsets(path)
    size = os.path.getsize(path)
    report["files"].append({"path": path, "records": len(offsets), "bytes": size})
    report["records"] += len(offsets)
    report["bytes"] += size
    if framing_error:
      report["corrupt"].append({"path": path, "offset": None, "index": len(offsets),
                                "message": framing_error})
    if check_crc and offsets:
      for index, offset, message in records.corrupt_records(path, offsets):
        report["corrupt"].append({"path": path, "offset": offset, "index": index,
                                  "message": "corrupt record: %s" % message})
    if stats_records and parsed >= stats_records:
      continue
    bad_indices = set(c["index"] for c in report["corrupt"] if c["path"] == path)
    for index, offset, serialized in records.read_records(path, offsets):
      if stats_records and parsed >= stats_records:
        break
      if index in bad_indices:
        continue
      try:
        values = records.parse_example(serialized, packed=None)
      except records.RecordError as e:
        _add_problem(report, "%s record %d at byte %d: %s" % (path, index, offset, e))
        continue
      packed = records.is_packed(values)
      if report["packed"] is None:
        report["packed"] = packed
      elif packed != report["packed"]:
        _add_problem(report, "%s record %d at byte %d: %s" % (
            path, index, offset, "a packed record among unpacked ones" if packed else
            "an unpacked record among packed ones"))
        continue
      max_seq_length = max_seq_length or len(values["input_ids"])
      if packed:
        report["max_sequences_per_pack"] = len(values["next_sentence_labels"])
      (problem, max_predictions_per_seq) = _record_problem(
          values, packed, max_seq_length, max_predictions_per_seq, vocab_size)
      if problem:
        _add_problem(report, "%s record %d at byte %d: %s" % (path, index, offset, problem))
        continue
      parsed += 1
      sequences = (records.unpack_example(values, max_predictions_per_seq) if packed
                   else [values])
      for sequence in sequences:
        _accumulate(sequence, counts, masked_ids, lengths)
      packs["records"] += 1
      packs["sequences"] += len(sequences)
      if len(report["examples"]) < num_examples:
        report["examples"].append({"path": path, "index": index, "values": values,
                                   "sequences": sequences})
  if mask_id is None and masked_ids:
    # Without a vocab, [MASK] is the id that most predicted positions hold (80%).
    mask_id = masked_ids.most_common(1)[0][0]
    report["mask_id_inferred"] = True
  report["mask_id"] = mask_id
  report["max_seq_length"] = max_seq_length
  report["max_predictions_per_seq"] = max_predictions_per_seq
  report["parsed"] = parsed
  report["statistics"] = _statistics(counts, masked_ids, mask_id, lengths,
                                     max_seq_length)
  if report["packed"] and packs["records"]:
    report["statistics"]["sequences"] = packs["sequences"]
    report["statistics"]["sequences_per_pack"] = packs["sequences"] / packs["records"]
    report["statistics"]["padding"] = 1 - counts["tokens"] / float(
        packs["records"] * max_seq_length)
  for example in report["examples"]:
    example["texts"] = [decode_example(sequence, inv_vocab or {}, mask_id)
                        for sequence in example["sequences"]]
    example["text"] = example["texts"][0]
  return report


def _add_problem(report, message):
  report["spec_errors"] += 1
  if len(report["problems"]) < _MAX_LISTED:
    report["problems"].append(message)


def _accumulate(values, counts, masked_ids, lengths):
  """Adds one valid record to the running statistics."""
  length = int(values["input_mask"].sum())
  num_predictions = int((values["masked_lm_weights"] > 0).sum())
  positions = values["masked_lm_positions"][:num_predictions]
  input_at = values["input_ids"][positions]
  truth = values["masked_lm_ids"][:num_predictions]
  counts["tokens"] += length
  counts["predictions"] += num_predictions
  counts["kept"] += int((input_at == truth).sum())
  counts["records"] += 1
  counts["random_next"] += int(values["next_sentence_labels"][0])
  masked_ids.update(input_at[input_at != truth].tolist())
  lengths.append(length)


def _statistics(counts, masked_ids, mask_id, lengths, max_seq_length):
  """The masking, next-sentence and length statistics of the parsed records."""
  predictions = counts["predictions"]
  if not counts["records"]:
    return {}
  masked = masked_ids.get(mask_id, 0)
  changed = sum(masked_ids.values())
  lengths = np.array(lengths)
  return {
      "records": counts["records"],
      "tokens": counts["tokens"],
      "predictions": predictions,
      "masked_fraction": predictions / max(counts["tokens"], 1),
      "predictions_per_record": predictions / counts["records"],
      "mask_fraction": masked / max(predictions, 1),
      "kept_fraction": counts["kept"] / max(predictions, 1),
      "random_fraction": (changed - masked) / max(predictions, 1),
      "random_next_fraction": counts["random_next"] / counts["records"],
      "mean_length": float(lengths.mean()),
      "full_fraction": float((lengths == max_seq_length).mean()),
  }


def format_report(report):
  """The report as the lines printed by the command."""
  lines = []
  lines.append("%d files, %d records, %.1f MB" % (len(report["files"]), report["records"],
                                                   report["bytes"] / 1e6))
  for entry in report["files"][:_MAX_LISTED]:
    lines.append("  %s: %d records, %d bytes" % (entry["path"], entry["records"],
                                                 entry["bytes"]))
  if len(report["files"]) > _MAX_LISTED:
    lines.append("  ... and %d more files" % (len(report["files"]) - _MAX_LISTED))
  if report["corrupt"]:
    lines.append("CORRUPT: %d problems" % len(report["corrupt"]))
    for entry in report["corrupt"][:_MAX_LISTED]:
      where = "byte %d" % entry["offset"] if entry["offset"] is not None else "end"
      lines.append("  %s: record %d at %s: %s" % (entry["path"], entry["index"], where,
                                                 entry["message"]))
  else:
    lines.append("corrupt records: none")
  if report["spec_errors"]:
    lines.append("SPEC: %d records break the feature spec" % report["spec_errors"])
    lines.extend("  " + p for p in report["problems"])
  elif not report["parsed"]:
    lines.append("feature spec: not checked (no record could be read)")
  elif report["packed"]:
    lines.append("feature spec: ok in %d packed records read (max_seq_length %s, "
                 "max_predictions_per_pack %s, max_sequences_per_pack %s)" % (
                     report["parsed"], report["max_seq_length"],
                     report["max_predictions_per_seq"] + report["max_sequences_per_pack"],
                     report["max_sequences_per_pack"]))
  else:
    lines.append("feature spec: ok in %d records read (max_seq_length %s, "
                 "max_predictions_per_seq %s)" % (report["parsed"],
                                                  report["max_seq_length"],
                                                  report["max_predictions_per_seq"]))
  stats = report["statistics"]
  if stats and report["packed"]:
    lines.append("packs: %d sequences in %d records, %.3f sequences a pack; padding "
                 "%.1f%% of the tokens" % (stats["sequences"], report["parsed"],
                                          stats["sequences_per_pack"],
                                          100 * stats["padding"]))
  if stats:
    lines.append("masking: %.2f%% of real tokens predicted (%d of %d), %.1f predictions a "
                 "%s" % (100 * stats["masked_fraction"], stats["predictions"],
                         stats["tokens"], stats["predictions_per_record"],
                         "sequence" if report["packed"] else "record"))
    lines.append("  predicted tokens: [MASK] %.1f%%, kept %.1f%%, random %.1f%% "
                 "(Google: 80/10/10)%s" % (
                     100 * stats["mask_fraction"], 100 * stats["kept_fraction"],
                     100 * stats["random_fraction"],
                     "; [MASK] id %d inferred" % report["mask_id"]
                     if report.get("mask_id_inferred") else ""))
    lines.append("next sentence: %.1f%% random (label 1)" %
                 (100 * stats["random_next_fraction"]))
    lines.append("lengths: mean %.1f tokens, %.1f%% of %s full" %
                 (stats["mean_length"], 100 * stats["full_fraction"],
                  "sequences" if report["packed"] else "records"))
  for example in report["examples"]:
    if report["packed"]:
      lines.append("example: %s record %d, a pack of %d sequence%s" % (
          example["path"], example["index"], len(example["texts"]),
          "s" * (len(example["texts"]) != 1)))
      for slot, text in enumerate(example["texts"]):
        lines.append("  [%d] %s" % (slot + 1, text))
    else:
      lines.append("example: %s record %d" % (example["path"], example["index"]))
      lines.append("  " + example["text"])
  return lines


def define_flags():
  """Defines the command-line flags; only when run as a script."""
  flags.DEFINE_string("input", None, "TFRecord file, folder or glob (comma-separated).")
  flags.DEFINE_string("vocab", None, "vocab.txt to decode examples and check ids.")
  flags.DEFINE_integer("max_seq_length", None,
                       "Expected max_seq_length (default: that of the first record).")
  flags.DEFINE_integer("max_predictions_per_seq", None,
                       "Expected max_predictions_per_seq (default: the first record's).")
  flags.DEFINE_integer("num_examples", 2, "Records decoded to text.")
  flags.DEFINE_integer("stats_records", 100000,
                       "Records parsed for the spec check and statistics (0: all).",
                       lower_bound=0)
  flags.DEFINE_bool("check_crc", True, "Check the CRCs of every record.")


def run_inspect(inputs, vocab=None, max_seq_length=None, max_predictions_per_seq=None,
                num_examples=2, stats_records=100000, check_crc=True, out=None,
                err=None):
  """Inspects the files and prints the report, as the command does.

  Args:
    inputs: comma-separated TFRecord files, folders or globs.
    vocab, max_seq_length, max_predictions_per_seq, num_examples, stats_records,
      check_crc: as inspect_files.
    out: stream for the report (default stdout).
    err: stream for the error line (default stderr).

  Returns:
    the exit status: 0 all good, 1 corrupt or malformed records, 2 bad input.
  """
  out = out or sys.stdout
  err = err or sys.stderr
  try:
    patterns = [p.strip() for p in (inputs or "").split(",") if p.strip()]
    if not patterns:
      # No file is no data: a report of 0 records with an "ok" spec would pass a check.
      raise InspectError("--input is empty; pass --input=<records folder, glob or file>")
    files = []
    for pattern in patterns:
      files.extend(input_pipeline.list_record_files(pattern, "--input"))
    report = inspect_files(files, vocab, max_seq_length, max_predictions_per_seq,
                           num_examples, stats_records, check_crc)
  except (InspectError, ValueError) as e:
    err.write("inspect_tfrecords: error: %s\n" % e)
    return 2
  for line in format_report(report):
    out.write(line + "\n")
  return 1 if report["corrupt"] or report["spec_errors"] else 0


def main(argv):
  """Prints the report; exits 1 on corrupt or malformed records, 2 on bad input."""
  if len(argv) > 1:
    errors.unexpected_arguments("inspect_tfrecords", argv[1:])
  tf.logging.set_verbosity(tf.logging.ERROR)
  flag_values = flags.FLAGS
  errors.require_flags("inspect_tfrecords", flag_values, (
      ("input", "TFRecord files, folders or globs, comma-separated"),))
  sys.exit(run_inspect(flag_values.input, flag_values.vocab, flag_values.max_seq_length,
                       flag_values.max_predictions_per_seq, flag_values.num_examples,
                       flag_values.stats_records, flag_values.check_crc))


if __name__ == "__main__":
  define_flags()
  errors.run_main("inspect_tfrecords", main)
