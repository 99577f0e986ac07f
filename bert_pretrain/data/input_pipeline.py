"""TFRecord input of BERT pretraining: file checks, bad records and the tf.data pipeline.

The records' format (the feature spec, the framing, what makes a record valid) is
bert_pretrain/data/records.py's; this module finds the files of a run, checks them before
training, locates a bad record met while training and builds the tf.data pipeline.
"""

import collections
import os
import re

import tensorflow.compat.v1 as tf

from bert_pretrain.data import records

# Folders whose records together are smaller than this are read whole before the first
# step (once MLPerf's clock runs), so a corrupt record is reported before any step; larger
# sets check the first record of each file, and a corrupt record met later is located
# when the pipeline reaches it (find_bad_records).
FULL_CHECK_MAX_BYTES = 256 * 1024 * 1024

# The in-graph check of token ids fails with a message that starts with this, so that
# the training loop can tell it from other errors and locate the record.
TOKEN_ID_ERROR = "token id outside the vocab"

# A record that cannot be trained on: its file, index in the file, byte offset of its
# header (or where the file is cut) and what is wrong with it.
BadRecord = collections.namedtuple("BadRecord", ["path", "index", "offset", "problem"])
# What --skip_corrupt_records leaves out: records, the records of the set (None when
# not counted), bad, a list of BadRecord.
SkippedRecords = collections.namedtuple("SkippedRecords", ["records", "bad"])


def constant_features(batch_size, max_seq_length, max_predictions_per_seq):
  """A batch of the feature spec's shapes made of constants: the input of a graph that
  only needs the model's variables (a fresh checkpoint, a benchmark)."""
  return {
      "input_ids": tf.zeros([batch_size, max_seq_length], tf.int32),
      "input_mask": tf.ones([batch_size, max_seq_length], tf.int32),
      "segment_ids": tf.zeros([batch_size, max_seq_length], tf.int32),
      "masked_lm_positions": tf.zeros([batch_size, max_predictions_per_seq], tf.int32),
      "masked_lm_ids": tf.zeros([batch_size, max_predictions_per_seq], tf.int32),
      "masked_lm_weights": tf.ones([batch_size, max_predictions_per_seq], tf.float32),
      "next_sentence_labels": tf.zeros([batch_size, 1], tf.int32),
  }


# The files a training run writes beside its checkpoints: a checkpoint's data shards,
# TensorFlow's `checkpoint` file and its event files.
_RUN_FILE = re.compile(r"(\.data-\d+-of-\d+|^checkpoint|^events\.out\.tfevents\..*)$")


def list_record_files(files_dir, flag_name="--input_files_dir"):
  """Lists the TFRecord files of a folder (or a glob, or one file), sorted.

  Hidden files and files that are plainly something else (.txt, .json, .md, .index)
  are skipped, so a folder that also holds a README or a manifest still works.

  Raises:
    ValueError: the folder is missing, or holds no record file.
  """
  if not files_dir:
    raise ValueError("%s is empty; pass %s=/path/to/tfrecords" % (flag_name, flag_name))
  if tf.gfile.IsDirectory(files_dir):
    names = [os.path.join(files_dir, n) for n in tf.gfile.ListDirectory(files_dir)]
  elif tf.gfile.Exists(files_dir):
    names = [files_dir]
  else:
    names = tf.gfile.Glob(files_dir)
    if not names:
      raise ValueError("%s=%s does not exist; pass the folder that holds the TFRecord files"
                       % (flag_name, files_dir))
  run_files = sorted((os.path.basename(n) for n in names if _RUN_FILE.search(
      os.path.basename(n))), key=lambda name: (".data-" not in name, name))
  if run_files:
    # Its checkpoints would otherwise be "corrupt records", and the fix offered, removing
    # them, would lose the run.
    raise ValueError("%s=%s holds a run's checkpoints or logs (%s), not TFRecords; pass the "
                     "folder of the records" % (flag_name, files_dir, run_files[0]))
  skipped_suffixes = (".txt", ".json", ".md", ".index", ".tsv", ".log")
  # ".tmp" anywhere in the name: a half-written output of create_pretraining_data or
  # bert_pretrain/wiki (part-00001.tmp-1234) is never training data.
  files = sorted(n for n in names
                 if not os.path.basename(n).startswith(".") and ".tmp" not in os.path.basename(n)
                 and not n.endswith(skipped_suffixes) and not tf.gfile.IsDirectory(n))
  files = [f for f in files if tf.gfile.Stat(f).length > 0]
  folders = sorted(os.path.basename(n.rstrip("/")) for n in names if tf.gfile.IsDirectory(n))
  if not files and folders:  # the dataset's root, say (train_data/, eval_data/)
    raise ValueError("%s=%s holds no TFRecord files, only folders (%s); point it at the "
                     "folder that holds them" % (flag_name, files_dir, ", ".join(folders[:5])))
  if not files:
    raise ValueError("%s=%s holds no TFRecord files; point it at the folder that holds them "
                     "(make them with python3 -m bert_pretrain.create_pretraining_data)"
                     % (flag_name, files_dir))
  return files


_SHARD_NAME = re.compile(r"^(.*)-(\d+)-of-(\d+)$")


def missing_shards(files):
  """The shards the names of `files` count but which are not among them: for a name
  like part-00002-of-00500, the other indexes below 500 of that stem. Returns (the
  missing names, sorted; the shards the names count), ([], 0) when none is missing."""
  present = collections.defaultdict(set)
  for path in files:
    match = _SHARD_NAME.match(os.path.basename(path))
    if match:
      key = (os.path.dirname(path), match.group(1), len(match.group(2)), match.group(3))
      present[key].add(int(match.group(2)))
  missing, counted = [], 0
  for (folder, stem, width, total), indexes in sorted(present.items()):
    counted += int(total)
    missing.extend(os.path.join(folder, "%s-%0*d-of-%s" % (stem, width, i, total))
                   for i in range(int(total)) if i not in indexes)
  return (sorted(missing), counted) if missing else ([], 0)


def training_layout(files, max_seq_length, max_predictions_per_seq):
  """Whether a training set is packed, from the first record of its first file that
  has a readable one (a corrupt record is check_training_files' to name).

  Args:
    files: the set's TFRecord files.
    max_seq_length, max_predictions_per_seq: the run's (of one sequence).

  Returns:
    (max_predictions, max_sequences): the records' masked-LM length and, for packed
    records, their sequence slots (None for unpacked ones).

  Raises:
    ValueError: packed records of other lengths than the run's, with the flags to pass.
  """
  layout = None
  for path in files:
    try:
      layout = records.record_layout(next(records.record_iterator(path)))
      break
    except (records.RecordError, tf.errors.DataLossError, StopIteration):
      continue
  if layout is None or not layout.packed:
    return max_predictions_per_seq, None
  expected = records.max_predictions_per_pack(max_predictions_per_seq, layout.max_sequences)
  if layout.max_seq_length != max_seq_length or layout.max_predictions != expected:
    raise ValueError(
        "%s holds packed records of max_seq_length %d and %d masked positions for %d "
        "sequences, but the run's --max_seq_length=%d --max_predictions_per_seq=%d make "
        "packs of %d and %d; pass --max_seq_length=%d --max_predictions_per_seq=%d"
        % (path, layout.max_seq_length, layout.max_predictions, layout.max_sequences,
           max_seq_length, max_predictions_per_seq, max_seq_length, expected,
           layout.max_seq_length, layout.max_predictions - layout.max_sequences))
  return layout.max_predictions, layout.max_sequences


def find_bad_records(path, max_seq_length, max_predictions_per_seq, vocab_size=None,
                     max_sequences=None):
  """Every record of a file that cannot be trained on, in file order.

  Checks the framing (a file cut short), the CRCs, that each record is a pretraining
  example of the run's lengths, and that its token ids are inside the vocab.

  Args:
    path: a TFRecord file.
    max_seq_length, max_predictions_per_seq: the lengths of the run (of a pack's
      masked-LM features, for packed records).
    vocab_size: (optional) token ids must be in [0, vocab_size).
    max_sequences: None for unpacked records; for packed ones, their sequence slots.

  Returns:
    (num_records, bad): the records the framing holds (a cut record not counted), and
    a list of BadRecord.
  """
  offsets, framing_error = records.record_offsets(path)
  bad = [BadRecord(path, index, offset, message)
         for index, offset, message in records.corrupt_records(path, offsets)]
  skipped = set(r.index for r in bad)
  for index, offset, serialized in records.read_records(path, offsets):
    if index in skipped:
      continue
    problem = _record_problem(serialized, max_seq_length, max_predictions_per_seq,
                              vocab_size, max_sequences)
    if problem:
      bad.append(BadRecord(path, index, offset, problem))
  bad.sort(key=lambda r: r.index)
  if framing_error:
    bad.append(BadRecord(path, len(offsets), records.framed_end(offsets),
                         "the file is " + framing_error))
  return len(offsets), bad


def _record_problem(serialized, max_seq_length, max_predictions_per_seq, vocab_size,
                    max_sequences=None):
  """What makes one serialized record unusable for training (records.py's checks), or
  None: not an example of the spec, other lengths, a token id outside the vocab (a
  packed record: any break of the packed format)."""
  if max_sequences is not None:
    try:
      values = records.parse_example(serialized, packed=True)
    except records.RecordError as e:
      return "it %s" % e if e.missing else str(e)
    return records.packed_example_problem(values, max_seq_length, max_predictions_per_seq,
                                          max_sequences, vocab_size)
  try:
    values = records.parse_example(serialized, as_numpy=False)
  except records.RecordError as e:
    return "it %s" % e if e.missing else str(e)
  wrong = records.wrong_length(values, max_seq_length, max_predictions_per_seq,
                               records.SET_LENGTH_FEATURES + records.FEATURE_NAMES)
  if wrong:
    return "%s has %d values, not %d" % wrong
  if vocab_size:
    outside = records.token_ids_outside(values, vocab_size)
    if outside.size:
      return "token id %d is outside the vocab (vocab_size %d)" % (outside[0], vocab_size)
  return None


def locate_bad_record(files, max_seq_length, max_predictions_per_seq, vocab_size=None,
                      error_message="", max_sequences=None):
  """The first bad record of `files`, for an error met while training.

  TensorFlow names the byte offset of a corrupt record but not its file; files with a
  record (or a cut) at that offset are read first.

  Args:
    files: the TFRecord files the failing pipeline read.
    max_seq_length, max_predictions_per_seq, vocab_size, max_sequences: as
      find_bad_records.
    error_message: TensorFlow's error text ("corrupted record at 18866").

  Returns:
    a BadRecord, or None when every record of the files is good.
  """
  hint = re.search(r"(?:corrupted|truncated) record at (\d+)", error_message or "")
  if hint:
    at = int(hint.group(1))
    def near_hint(path):
      offsets, framing_error = records.record_offsets(path)
      starts = set(o for o, _ in offsets)
      return not (at in starts or at - 12 in starts or framing_error)
    files = sorted(files, key=near_hint)
  for path in files:
    _, bad = find_bad_records(path, max_seq_length, max_predictions_per_seq, vocab_size,
                              max_sequences)
    if bad:
      return bad[0]
  return None


def describe_bad_record(record):
  """'FILE record 40 (byte 18854): the CRC does not match the data'."""
  return "%s record %d (byte %d): %s" % (record.path, record.index, record.offset,
                                        record.problem)


def check_corrupt_share(num_records, bad, max_share, flag="--max_corrupt_share"):
  """Raises ValueError when more than max_share of num_records are bad.

  Args:
    num_records: records of the set.
    bad: list of BadRecord found in it.
    max_share: the largest acceptable fraction.

  Raises:
    ValueError: naming the count, the first bad record and what to do.
  """
  if bad and len(bad) > max_share * max(num_records, 1):
    raise ValueError("%d of %d training records are corrupt (%.3g%%), more than "
                     "%s=%g allows; first: %s; re-create the files (inspect them with "
                     "python3 tools/inspect_tfrecords.py) or raise %s"
                     % (len(bad), num_records, 100.0 * len(bad) / max(num_records, 1),
                        flag, max_share, describe_bad_record(bad[0]), flag))


def check_record_files(files, max_seq_length, max_predictions_per_seq, vocab_size=None,
                       full_check=None, full_check_max_bytes=FULL_CHECK_MAX_BYTES,
                       max_sequences=None, lengths_of=None, skippable=True):
  """Checks that the files are readable TFRecords of the expected sequence lengths.

  Reads the first record of every file and parses it with the feature spec; when the
  files are small (or full_check) every record is read, which also verifies the CRCs.

  Args:
    files: list of TFRecord paths.
    max_seq_length: expected length of input_ids, input_mask, segment_ids.
    max_predictions_per_seq: expected length of the masked_lm_* features.
    vocab_size: (optional) token ids of the first record must be below it.
    full_check: read every record; default: when the files total < full_check_max_bytes.
    full_check_max_bytes: see full_check.
    max_sequences: None for unpacked records; for packed ones, their sequence slots
      (max_predictions_per_seq is then a pack's masked-LM length).
    lengths_of: (optional) what holds the lengths the files must have, when the flags
      are not to be changed for them (e.g. "the training records", for an evaluation
      set); by default the flags, unless most files have the flags' lengths and the
      others not (_file_of_the_flags_lengths).
    skippable: whether a corrupt file's fix may be --skip_corrupt_records.

  Returns:
    The number of records counted (exact with full_check, else None).

  Raises:
    ValueError: a file is corrupt, not a TFRecord of pretraining examples, or of other
      lengths; the message names the file, the record and the flags to change.
  """
  if full_check is None:
    full_check = sum(tf.gfile.Stat(f).length for f in files) < full_check_max_bytes
  total = 0
  fix = "re-create or remove the file" + (", or pass --skip_corrupt_records" if skippable
                                          else "")
  if lengths_of is None and max_sequences is None:
    lengths_of = _file_of_the_flags_lengths(files, (max_seq_length, max_predictions_per_seq))
  for path in files:
    if full_check:
      # The framing names the offset of a truncation; the iterator checks CRCs.
      offsets, framing_error = records.record_offsets(path)
      if framing_error:
        raise ValueError("corrupt TFRecord file %s: %s; %s" % (path, framing_error, fix))
      try:
        serialized = list(records.record_iterator(path))
      except tf.errors.DataLossError:
        index, offset, message = records.corrupt_records(path, offsets)[0]
        raise ValueError("corrupt TFRecord file %s record %d (byte %d): %s; %s"
                         % (path, index, offset, message, fix))
      total += len(serialized)
    else:
      try:
        serialized = [next(records.record_iterator(path))]
      except (tf.errors.DataLossError, StopIteration) as e:
        raise ValueError("corrupt TFRecord file %s (%s); re-create or remove the file"
                         % (path, e))
    if not serialized:
      raise ValueError("TFRecord file %s holds no records; re-create or remove it" % path)
    _check_example(path, serialized[0], max_seq_length, max_predictions_per_seq, vocab_size,
                   max_sequences, lengths_of)
  return total if full_check else None


def _file_of_the_flags_lengths(files, lengths):
  """Where the files' first records disagree on their lengths and most have the flags'
  `lengths` (max_seq_length, max_predictions_per_seq), the first of those files: the
  others are to be made again, not the flags changed. Else None."""
  found = {}
  for path in files:
    try:
      values = records.parse_example(next(records.record_iterator(path)), packed=None)
      found[path] = tuple(len(values[name]) for name in records.SET_LENGTH_FEATURES)
    except (records.RecordError, tf.errors.DataLossError, StopIteration, KeyError):
      continue  # check_record_files names what is wrong with it
  counts = collections.Counter(found.values())
  if len(counts) < 2 or counts.most_common(1)[0][0] != lengths:
    return None
  return next(path for path in files if found.get(path) == lengths)


def check_training_files(files, max_seq_length, max_predictions_per_seq, vocab_size,
                         skip_corrupt=False, max_corrupt_share=0.0, max_sequences=None):
  """The up-front check of a training set; with skip_corrupt, finds the records to skip.

  Without skip_corrupt this is check_record_files on each file's first record (the
  layout; the run reads small sets whole later, on MLPerf's clock). With it, every
  record is read (framing, CRC, lengths, token ids) and the bad ones are returned, to be
  left out by make_dataset; the files' format is still checked on a good first record.

  Args:
    files: list of TFRecord paths.
    max_seq_length, max_predictions_per_seq, vocab_size, max_sequences: as
      find_bad_records.
    skip_corrupt: find bad records instead of failing on the first.
    max_corrupt_share: the largest fraction of bad records skip_corrupt accepts.

  Returns:
    (num_records, bad): num_records is None unless every record was counted; bad is
    a list of BadRecord (empty without skip_corrupt).

  Raises:
    ValueError: as check_record_files; with skip_corrupt, more than max_corrupt_share
      of the records are bad.
  """
  if not skip_corrupt:
    return check_record_files(files, max_seq_length, max_predictions_per_seq, vocab_size,
                              full_check=False, max_sequences=max_sequences), []
  total, bad = 0, []
  for path in files:
    count, file_bad = find_bad_records(path, max_seq_length, max_predictions_per_seq,
                                       vocab_size, max_sequences)
    # A cut tail (index == count) is one bad record more, beyond those the framing holds.
    total += count + sum(1 for r in file_bad if r.index == count)
    bad.extend(file_bad)
  # A set of other lengths gets its own message rather than "all records corrupt".
  bad_first = set(r.path for r in bad if r.index == 0)
  check_record_files([f for f in files if f not in bad_first], max_seq_length,
                     max_predictions_per_seq, vocab_size, full_check=False,
                     max_sequences=max_sequences)
  check_corrupt_share(total, bad, max_corrupt_share)
  return total, bad


def _check_example(path, serialized, max_seq_length, max_predictions_per_seq, vocab_size,
                   max_sequences=None, lengths_of=None):
  """Raises ValueError unless `serialized` is a pretraining example of the given lengths
  (packed into max_sequences slots, unless None) whose token ids are below vocab_size;
  the message names the file and the fix (for other lengths: the flags to pass, or,
  where `lengths_of` holds the run's lengths, to make the file with those)."""
  try:
    values = records.parse_example(serialized, packed=None)
  except records.RecordError as e:
    if e.not_an_example:
      raise ValueError("%s is not a TFRecord file of tf.train.Example records; point the "
                       "flag at the pretraining TFRecords" % path)
    if e.missing:
      raise ValueError("%s lacks the features %s; it is not BERT pretraining data (make it "
                       "with python3 -m bert_pretrain.create_pretraining_data)"
                       % (path, sorted(e.missing)))
    raise ValueError("%s: %s; the file is not valid pretraining data" % (path, e))
  if records.is_packed(values) != (max_sequences is not None):
    kinds = ("packed", "unpacked") if max_sequences is None else ("unpacked", "packed")
    raise ValueError("%s holds %s records where %s ones are expected: a training set is "
                     "of one kind (its first file's), the evaluation set unpacked, as "
                     "MLPerf's eval_10k; pass the folder of one kind (python3 -m "
                     "bert_pretrain.pack_records packs a set)" % (path, kinds[0], kinds[1]))
  if max_sequences is not None:
    problem = records.packed_example_problem(values, max_seq_length,
                                             max_predictions_per_seq, max_sequences,
                                             vocab_size)
    if problem:
      raise ValueError("%s: %s; the file is not valid packed pretraining data"
                       % (path, problem))
    return
  seq_length, predictions = [len(values[name]) for name in records.SET_LENGTH_FEATURES]
  if (seq_length != max_seq_length or predictions != max_predictions_per_seq) and lengths_of:
    raise ValueError("%s holds records of max_seq_length %d and max_predictions_per_seq %d, "
                     "but the run's are %d and %d, as in %s; make it again with those (or "
                     "move it out)" % (path, seq_length, predictions, max_seq_length,
                                       max_predictions_per_seq, lengths_of))
  if seq_length != max_seq_length or predictions != max_predictions_per_seq:
    raise ValueError("%s holds records of max_seq_length %d and max_predictions_per_seq %d, "
                     "but the run uses %d and %d; pass --max_seq_length=%d "
                     "--max_predictions_per_seq=%d"
                     % (path, seq_length, predictions, max_seq_length,
                        max_predictions_per_seq, seq_length, predictions))
  wrong = records.wrong_length(values, max_seq_length, max_predictions_per_seq)
  if wrong:
    raise ValueError("%s: feature %s has %d values, expected %d; the file is not valid "
                     "pretraining data" % ((path,) + wrong))
  if vocab_size:
    # Only ids above the vocab: a negative id is left to the in-graph check, which
    # names its record.
    outside = records.token_ids_outside(values, vocab_size)
    if outside.size and outside.max() >= vocab_size:
      raise ValueError("%s holds token id %d but vocab_size is %d: the data was made with a "
                       "larger vocab; use the bert_config.json that matches its vocab"
                       % (path, outside.max(), vocab_size))


def rank_files(files, num_shards, shard_index):
  """The files one rank of an evaluation (make_dataset, is_training=False) reads: every
  num_shards-th when there are at least as many files as ranks, otherwise all of them
  (each rank reads every num_shards-th record)."""
  if num_shards > 1 and len(files) >= num_shards:
    return files[shard_index::num_shards]
  return files


def make_dataset(files, batch_size, max_seq_length, max_predictions_per_seq, is_training,
                 num_shards=1, shard_index=0, shuffle_buffer=10000, seed=None,
                 num_parallel_reads=4, vocab_size=None, skip_records=(), skip_samples=0,
                 local_shards=1, max_sequences=None):
  """A tf.data.Dataset of parsed pretraining batches.

  Training: one order of the records for the whole job, whatever its layout (ranks,
  replicas, batch, accumulation): files shuffled and interleaved, records shuffled in
  a buffer, the set repeated (training_records). It is cut into micro-batches of
  batch_size records (full, so every step has the same shape), and the job's
  num_shards replicas take them in turn: micro-batch w goes to replica w mod
  num_shards. So each update consumes the next global batch of the order (batch_size x
  accumulation x replicas records), and a run resumed on another layout, skipping the
  records consumed so far (skip_samples), continues the same order with no record
  repeated or left out. The price: every process reads every record's bytes (and holds
  the shuffle buffer of serialized records) but parses only its own micro-batches, so
  each process reads at the job's rate rather than its own (with N processes, N times
  the bytes: a record of sequence 512 is a few KB, so a job of 1000 sequences/s has
  each process read a few MB/s). A process that drives local_shards
  replicas (mirrored) gets their micro-batches one after the other, as the strategy
  hands them out.

  Evaluation: files in order, one pass, the last batch may be smaller; with several
  ranks each reads distinct records: whole files when there are at least as many
  files as ranks, otherwise every num_shards-th record.

  Files holding records of skip_records are not read by TFRecordDataset (it cannot go
  on past a corrupt record); their good records are cut out of the file's bytes and
  mixed into the stream in proportion to their size.

  The order is deterministic for a given seed (the parallel interleave and map keep
  their input order). Skipping happens after the shuffle and before parsing, so it
  costs a read of the skipped records only.

  Args:
    files: list of TFRecord paths (list_record_files).
    batch_size: examples per batch of one replica.
    max_seq_length, max_predictions_per_seq: the lengths of the records.
    is_training: training or evaluation order, as above.
    num_shards, shard_index: training: the job's replicas and the first replica of this
      process; evaluation: the ranks and this rank.
    shuffle_buffer: records held for shuffling (training).
    seed: (optional) shuffle seed; the same on every process of a job.
    num_parallel_reads: files read at once (part of the order: the same in every run).
    vocab_size: (optional) every batch is checked in the graph for token ids outside
      [0, vocab_size); the error starts with TOKEN_ID_ERROR.
    skip_records: BadRecords to leave out (check_training_files).
    skip_samples: (training) records of the order to skip first: an int or an int64
      scalar Tensor (e.g. a placeholder fed when the iterator is initialized).
    local_shards: (training) replicas this process drives: it takes the micro-batches
      of replicas shard_index .. shard_index + local_shards - 1.
    max_sequences: None for unpacked records; for packed ones (records.py), their
      sequence slots: batch_size counts packs, max_predictions_per_seq is a pack's
      masked-LM length, and the batches hold the packed features.

  Returns:
    A Dataset of dicts name -> Tensor: int32 [batch_size, max_seq_length] for input_ids,
    input_mask, segment_ids; int32 [batch_size, max_predictions_per_seq] for
    masked_lm_positions and masked_lm_ids; float32 [batch_size, max_predictions_per_seq]
    for masked_lm_weights; int32 [batch_size, 1] for next_sentence_labels. Packed:
    those of records.PACKED_FEATURES alike (int32, masked_lm_weights and
    next_sentence_weights float32).
  """
  spec = (records.feature_spec(max_seq_length, max_predictions_per_seq)
          if max_sequences is None else
          records.packed_feature_spec(max_seq_length, max_predictions_per_seq, max_sequences))
  if is_training:
    dataset = training_records(files, shuffle_buffer, seed, num_parallel_reads, skip_records)
    dataset = dataset.skip(tf.cast(skip_samples, tf.int64))
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if local_shards < num_shards:
      # One micro-batch of every replica at a time; this process keeps its replicas'.
      dataset = dataset.batch(num_shards, drop_remainder=True)
      dataset = dataset.map(lambda group: group[shard_index:shard_index + local_shards])
      dataset = dataset.apply(tf.data.experimental.unbatch())
  else:
    dataset = _evaluation_records(files, num_shards, shard_index, skip_records)
    dataset = dataset.batch(batch_size)

  def parse(serialized):
    # Parsing a whole batch at once is much cheaper than one example at a time.
    features = tf.parse_example(serialized, spec)
    if vocab_size:
      ids = tf.concat([tf.reshape(features[name], [-1])
                       for name in records.TOKEN_ID_FEATURES], 0)
      check = tf.Assert(tf.logical_and(tf.reduce_min(ids) >= 0,
                                       tf.reduce_max(ids) < vocab_size),
                        [TOKEN_ID_ERROR, tf.reduce_max(ids), "vocab_size", vocab_size])
      with tf.control_dependencies([check]):
        features = {name: tf.identity(t) for name, t in features.items()}
    return {name: tf.cast(t, tf.int32) if t.dtype == tf.int64 else t
            for name, t in features.items()}

  # parse has no Python control flow on tensors: AutoGraph's conversion would only cost
  # start-up time (about half a second a run).
  dataset = dataset.map(tf.autograph.experimental.do_not_convert(parse),
                        num_parallel_calls=tf.data.experimental.AUTOTUNE)
  dataset = dataset.prefetch(tf.data.experimental.AUTOTUNE)
  return dataset.with_options(without_autotune_thread())


def training_records(files, shuffle_buffer=10000, seed=None, num_parallel_reads=4,
                     skip_records=()):
  """The serialized training records in the run's order, repeated without end: the
  files shuffled (anew each pass) and read num_parallel_reads at a time, interleaved,
  records shuffled in a buffer of shuffle_buffer. It depends on the files, the seed,
  the buffer and num_parallel_reads only, not on the job's layout (make_dataset).

  Returns:
    A Dataset of string scalars.
  """
  (files, damaged, skipped) = _split_damaged(files, skip_records)
  dataset = None
  if files:
    dataset = tf.data.Dataset.from_tensor_slices(tf.constant(files))
    dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
    dataset = dataset.interleave(tf.data.TFRecordDataset,
                                 cycle_length=min(num_parallel_reads, len(files)),
                                 block_length=1,
                                 num_parallel_calls=tf.data.experimental.AUTOTUNE)
  if damaged:
    kept = _good_records(damaged, skipped).repeat()
    if dataset is None:
      dataset = kept
    else:
      sizes = [float(sum(tf.gfile.Stat(f).length for f in group)) for group in (files, damaged)]
      dataset = tf.data.experimental.sample_from_datasets(
          [dataset, kept], [size / sum(sizes) for size in sizes], seed=seed)
  return dataset.shuffle(shuffle_buffer, seed=seed)


def _split_damaged(files, skip_records):
  """(files without skipped records, files with some, {path: indices to skip})."""
  skipped = collections.defaultdict(set)
  for record in skip_records:
    skipped[record.path].add(record.index)
  return ([f for f in files if f not in skipped], [f for f in files if f in skipped],
          skipped)


def _evaluation_records(files, num_shards, shard_index, skip_records):
  """The serialized evaluation records of one rank, in file order, one pass (see
  make_dataset)."""
  shard_files = num_shards > 1 and len(files) >= num_shards
  files = rank_files(files, num_shards, shard_index)
  (files, damaged, skipped) = _split_damaged(files, skip_records)
  dataset = None
  if files:
    # Record sharding reads the files in one fixed order on every rank, so that
    # shard() hands each rank distinct records.
    dataset = tf.data.TFRecordDataset(files)
    if num_shards > 1 and not shard_files:
      dataset = dataset.shard(num_shards, shard_index)
  if damaged:
    kept = _good_records(damaged, skipped)
    if num_shards > 1 and not shard_files:
      kept = kept.shard(num_shards, shard_index)
    dataset = kept if dataset is None else dataset.concatenate(kept)
  return dataset


def without_autotune_thread():
  """tf.data.Options that turn off tf.data's autotuning thread.

  That thread sleeps between its rounds for up to a minute, and destroying an iterator
  waits for it to wake: re-initializing the eval iterator took 0.1 s or 53 s (TF 2.15,
  measured in the demo), closing the session up to 14 s. Without it AUTOTUNE still
  means something: parallel calls default to the threads of the runner (at most 16)
  and prefetch buffers still grow when the consumer waits.
  """
  options = tf.data.Options()
  if hasattr(options, "autotune"):  # TensorFlow 2.5 and later
    options.autotune.enabled = False
  else:
    options.experimental_optimization.autotune = False
  return options


def _good_records(paths, skipped):
  """A Dataset of the serialized records of `paths` but those skipped, in file order.

  Each file is read whole into memory once a pass and its records are cut out at the
  offsets its framing gives (the CRCs were checked when the bad records were found).

  Args:
    paths: TFRecord files.
    skipped: dict path -> set of record indices to leave out.
  """
  datasets = []
  for path in paths:
    offsets, _ = records.record_offsets(path)
    keep = [(offset + records.HEADER_BYTES, length)
            for index, (offset, length) in enumerate(offsets) if index not in skipped[path]]
    if not keep:
      continue
    starts = tf.constant([k[0] for k in keep], tf.int64)
    lengths = tf.constant([k[1] for k in keep], tf.int64)
    def cut(content, starts=starts, lengths=lengths):
      pieces = tf.data.Dataset.from_tensor_slices((starts, lengths))
      return pieces.map(lambda start, length: tf.strings.substr(content, start, length))
    datasets.append(tf.data.Dataset.from_tensors(path).map(tf.io.read_file).flat_map(cut))
  if not datasets:
    return tf.data.Dataset.from_tensor_slices(tf.constant([], tf.string))
  dataset = datasets[0]
  for other in datasets[1:]:
    dataset = dataset.concatenate(other)
  return dataset
