"""TFRecord input of BERT pretraining: the MLPerf feature spec, file checks and tf.data.

Every record holds input_ids, input_mask, segment_ids (int64, max_seq_length),
masked_lm_positions, masked_lm_ids (int64, max_predictions_per_seq), masked_lm_weights
(float32, max_predictions_per_seq) and next_sentence_labels (int64, 1), as written by
Google's and MLCommons' create_pretraining_data.
"""

import os
import struct

import tensorflow.compat.v1 as tf

# Folders whose records together are smaller than this are read whole before training,
# so a corrupt record is reported before any step runs; larger sets check the first
# record of each file and report a corrupt record when the pipeline reaches it.
FULL_CHECK_MAX_BYTES = 256 * 1024 * 1024


def feature_spec(max_seq_length, max_predictions_per_seq):
  """The tf.parse_example spec of one pretraining record."""
  return {
      "input_ids": tf.FixedLenFeature([max_seq_length], tf.int64),
      "input_mask": tf.FixedLenFeature([max_seq_length], tf.int64),
      "segment_ids": tf.FixedLenFeature([max_seq_length], tf.int64),
      "masked_lm_positions": tf.FixedLenFeature([max_predictions_per_seq], tf.int64),
      "masked_lm_ids": tf.FixedLenFeature([max_predictions_per_seq], tf.int64),
      "masked_lm_weights": tf.FixedLenFeature([max_predictions_per_seq], tf.float32),
      "next_sentence_labels": tf.FixedLenFeature([1], tf.int64),
  }


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
  skipped_suffixes = (".txt", ".json", ".md", ".index", ".tsv", ".log")
  # ".tmp" anywhere in the name: a half-written output of create_pretraining_data or
  # tools/prepare_wiki.py (part-00001.tmp-1234) is never training data.
  files = sorted(n for n in names
                 if not os.path.basename(n).startswith(".") and ".tmp" not in os.path.basename(n)
                 and not n.endswith(skipped_suffixes) and not tf.gfile.IsDirectory(n))
  files = [f for f in files if tf.gfile.Stat(f).length > 0]
  if not files:
    raise ValueError("%s=%s holds no TFRecord files; point it at the folder that holds them "
                     "(make them with python3 -m bert_pretrain.create_pretraining_data)"
                     % (flag_name, files_dir))
  return files


def _record_lengths(path):
  """Yields (offset, length) of each record of a TFRecord file from its framing alone.

  Raises:
    ValueError: the file ends inside a record (truncated or not a TFRecord file).
  """
  size = tf.gfile.Stat(path).length
  with tf.gfile.GFile(path, "rb") as f:
    offset = 0
    while offset < size:
      header = f.read(12)
      if len(header) < 12:
        raise ValueError("corrupt TFRecord file %s: it ends inside the record at byte %d; "
                         "re-create or remove the file" % (path, offset))
      (length,) = struct.unpack("<Q", header[:8])
      end = offset + 12 + length + 4
      if end > size:
        raise ValueError("corrupt TFRecord file %s: record at byte %d claims %d bytes but the "
                         "file ends at %d; re-create or remove the file"
                         % (path, offset, length, size))
      yield offset, length
      f.seek(end)
      offset = end


def check_record_files(files, max_seq_length, max_predictions_per_seq, vocab_size=None,
                       full_check=None):
  """Checks that the files are readable TFRecords of the expected sequence lengths.

  Reads the first record of every file and parses it with the feature spec; when the
  files are small (or full_check) every record is read, which also verifies the CRCs.

  Args:
    files: list of TFRecord paths.
    max_seq_length: expected length of input_ids, input_mask, segment_ids.
    max_predictions_per_seq: expected length of the masked_lm_* features.
    vocab_size: (optional) token ids of the first record must be below it.
    full_check: read every record; default: when the files total < FULL_CHECK_MAX_BYTES.

  Returns:
    The number of records counted (exact with full_check, else None).

  Raises:
    ValueError: a file is corrupt, not a TFRecord of pretraining examples, or of other
      lengths; the message names the file and the flags to change.
  """
  if full_check is None:
    full_check = sum(tf.gfile.Stat(f).length for f in files) < FULL_CHECK_MAX_BYTES
  total = 0
  for path in files:
    if full_check:
      # The framing check names the offset of a truncation; the iterator checks CRCs.
      for _ in _record_lengths(path):
        pass
      try:
        records = list(tf.io.tf_record_iterator(path))
      except tf.errors.DataLossError as e:
        raise ValueError("corrupt TFRecord file %s (%s); re-create or remove the file"
                         % (path, e.message.splitlines()[0]))
      total += len(records)
    else:
      try:
        records = [next(tf.io.tf_record_iterator(path))]
      except (tf.errors.DataLossError, StopIteration) as e:
        raise ValueError("corrupt TFRecord file %s (%s); re-create or remove the file"
                         % (path, e))
    if not records:
      raise ValueError("TFRecord file %s holds no records; re-create or remove it" % path)
    _check_example(path, records[0], max_seq_length, max_predictions_per_seq, vocab_size)
  return total if full_check else None


def _check_example(path, serialized, max_seq_length, max_predictions_per_seq, vocab_size):
  """Raises ValueError unless `serialized` is a pretraining example of the given lengths."""
  example = tf.train.Example()
  try:
    example.ParseFromString(serialized)
  except Exception:  # pylint: disable=broad-except
    raise ValueError("%s is not a TFRecord file of tf.train.Example records; point the flag "
                     "at the pretraining TFRecords" % path)
  features = example.features.feature
  expected = feature_spec(max_seq_length, max_predictions_per_seq)
  missing = sorted(set(expected) - set(features))
  if missing:
    raise ValueError("%s lacks the features %s; it is not BERT pretraining data (make it with "
                     "python3 -m bert_pretrain.create_pretraining_data)" % (path, missing))
  lengths = {}
  for name in expected:
    feature = features[name]
    lengths[name] = max(len(feature.int64_list.value), len(feature.float_list.value))
  seq_length = lengths["input_ids"]
  predictions = lengths["masked_lm_ids"]
  if seq_length != max_seq_length or predictions != max_predictions_per_seq:
    raise ValueError("%s holds records of max_seq_length %d and max_predictions_per_seq %d, "
                     "but the run uses %d and %d; pass --max_seq_length=%d "
                     "--max_predictions_per_seq=%d"
                     % (path, seq_length, predictions, max_seq_length,
                        max_predictions_per_seq, seq_length, predictions))
  for name, length in lengths.items():
    want = expected[name].shape[0]
    if length != want:
      raise ValueError("%s: feature %s has %d values, expected %d; the file is not valid "
                       "pretraining data" % (path, name, length, want))
  if vocab_size:
    largest_id = max(list(features["input_ids"].int64_list.value) +
                     list(features["masked_lm_ids"].int64_list.value))
    if largest_id >= vocab_size:
      raise ValueError("%s holds token id %d but vocab_size is %d: the data was made with a "
                       "larger vocab; use the bert_config.json that matches its vocab"
                       % (path, largest_id, vocab_size))


def make_dataset(files, batch_size, max_seq_length, max_predictions_per_seq, is_training,
                 num_shards=1, shard_index=0, shuffle_buffer=10000, seed=None,
                 num_parallel_reads=4, skip_batches=0):
  """A tf.data.Dataset of parsed pretraining batches.

  Training: files are shuffled and interleaved, records shuffled in a buffer, the set
  repeats, batches are full (drop_remainder) so every step has the same shape.
  Evaluation: files in order, one pass, the last batch may be smaller.

  With several ranks (num_shards > 1) each rank reads distinct records: whole files
  when there are at least as many files as ranks, otherwise every num_shards-th record.

  The order is deterministic for a given seed (the parallel interleave and map keep
  their input order), so a resumed run continues the data order of the run it resumes
  by skipping the batches that run consumed (skip_batches): the skip happens after the
  shuffle and before parsing, so it costs a read of the skipped records only.

  Args:
    files: list of TFRecord paths (list_record_files).
    batch_size: examples per batch on this rank.
    max_seq_length, max_predictions_per_seq: the lengths of the records.
    is_training: training or evaluation order, as above.
    num_shards, shard_index: number of ranks and this rank's index.
    shuffle_buffer: records held for shuffling (training).
    seed: (optional) shuffle seed.
    num_parallel_reads: files read at once.
    skip_batches: (training) batches of this rank to skip first: an int or an int64
      scalar Tensor (e.g. a placeholder fed when the iterator is initialized).

  Returns:
    A Dataset of dicts name -> Tensor: int32 [batch_size, max_seq_length] for input_ids,
    input_mask, segment_ids; int32 [batch_size, max_predictions_per_seq] for
    masked_lm_positions and masked_lm_ids; float32 [batch_size, max_predictions_per_seq]
    for masked_lm_weights; int32 [batch_size, 1] for next_sentence_labels.
  """
  spec = feature_spec(max_seq_length, max_predictions_per_seq)
  shard_files = num_shards > 1 and len(files) >= num_shards
  if shard_files:
    files = files[shard_index::num_shards]

  if is_training and (num_shards == 1 or shard_files):
    dataset = tf.data.Dataset.from_tensor_slices(tf.constant(files))
    dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
    dataset = dataset.interleave(tf.data.TFRecordDataset,
                                 cycle_length=min(num_parallel_reads, len(files)),
                                 block_length=1,
                                 num_parallel_calls=tf.data.experimental.AUTOTUNE)
  else:
    # Record sharding reads the files in one fixed order on every rank, so that
    # shard() hands each rank distinct records.
    dataset = tf.data.TFRecordDataset(files)
    if num_shards > 1:
      dataset = dataset.shard(num_shards, shard_index)
    if is_training:
      dataset = dataset.repeat()
  if is_training:
    dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    dataset = dataset.skip(tf.cast(skip_batches, tf.int64) * batch_size)

  def parse(serialized):
    # Parsing a whole batch at once is much cheaper than one example at a time.
    features = tf.parse_example(serialized, spec)
    return {name: tf.cast(t, tf.int32) if t.dtype == tf.int64 else t
            for name, t in features.items()}

  dataset = dataset.batch(batch_size, drop_remainder=is_training)
  dataset = dataset.map(parse, num_parallel_calls=tf.data.experimental.AUTOTUNE)
  return dataset.prefetch(tf.data.experimental.AUTOTUNE)
