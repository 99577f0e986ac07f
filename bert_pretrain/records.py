"""The pretraining TFRecord format: its features, its framing, and checks of both.

Every reader and writer of pretraining records goes through this module: the trainer's
input pipeline, create_pretraining_data, inspect_records and the wiki pipeline.

A record is a tf.train.Example with seven features, as Google's and MLCommons'
create_pretraining_data write them:

  input_ids             int64   [max_seq_length]   [CLS] A [SEP] B [SEP], zero padded
  input_mask            int64   [max_seq_length]   1 on real tokens, 0 on padding
  segment_ids           int64   [max_seq_length]   0 for [CLS] A [SEP], 1 for B [SEP]
  masked_lm_positions   int64   [max_predictions_per_seq]  ascending, zero padded
  masked_lm_ids         int64   [max_predictions_per_seq]  original ids at those positions
  masked_lm_weights     float32 [max_predictions_per_seq]  1.0 per prediction, 0.0 padding
  next_sentence_labels  int64   [1]                1 if B is a random segment, else 0

A TFRecord file frames each serialized example as

  length (uint64, little endian) | masked crc32c of length (4 bytes) |
  data (length bytes) | masked crc32c of data (4 bytes)

so a record at byte `offset` holds its data at offset + 12 and ends at
offset + 16 + length. The framing alone gives every record's place (record_offsets,
a seek per record) and shows a file cut short; TensorFlow's reader checks the CRCs
(corrupt_records).

The module reads top to bottom: the feature spec, the framing, parsing one record into
numpy arrays, validating it, and serializing one for a writer.
"""

import errno
import os
import shutil
import tempfile

import numpy as np
import tensorflow.compat.v1 as tf

# ----------------------------------------------------------------------------------------
# The feature spec.
# ----------------------------------------------------------------------------------------

# (name, dtype, length): the length is the name of the setting it equals, or a number.
FEATURES = (
    ("input_ids", tf.int64, "max_seq_length"),
    ("input_mask", tf.int64, "max_seq_length"),
    ("segment_ids", tf.int64, "max_seq_length"),
    ("masked_lm_positions", tf.int64, "max_predictions_per_seq"),
    ("masked_lm_ids", tf.int64, "max_predictions_per_seq"),
    ("masked_lm_weights", tf.float32, "max_predictions_per_seq"),
    ("next_sentence_labels", tf.int64, 1),
)
FEATURE_NAMES = tuple(name for name, _, _ in FEATURES)
INT_FEATURES = tuple(name for name, dtype, _ in FEATURES if dtype == tf.int64)
FLOAT_FEATURES = tuple(name for name, dtype, _ in FEATURES if dtype == tf.float32)
# The features that hold token ids, which must be inside the vocab.
TOKEN_ID_FEATURES = ("input_ids", "masked_lm_ids")
# The features whose lengths are a set's max_seq_length and max_predictions_per_seq.
SET_LENGTH_FEATURES = ("input_ids", "masked_lm_ids")


def feature_lengths(max_seq_length, max_predictions_per_seq):
  """The number of values of each feature.

  Args:
    max_seq_length: int, the length the token features are padded to.
    max_predictions_per_seq: int, the length the masked LM features are padded to.

  Returns:
    dict from feature name to int, in FEATURE_NAMES order.
  """
  settings = {"max_seq_length": max_seq_length,
              "max_predictions_per_seq": max_predictions_per_seq}
  return {name: settings.get(length, length) for name, _, length in FEATURES}


def feature_spec(max_seq_length, max_predictions_per_seq):
  """The tf.parse_example spec of one pretraining record.

  Args:
    max_seq_length, max_predictions_per_seq: as feature_lengths.

  Returns:
    dict from feature name to tf.FixedLenFeature, in FEATURE_NAMES order.
  """
  lengths = feature_lengths(max_seq_length, max_predictions_per_seq)
  return {name: tf.FixedLenFeature([lengths[name]], dtype) for name, dtype, _ in FEATURES}


# ----------------------------------------------------------------------------------------
# The framing.
# ----------------------------------------------------------------------------------------

# Bytes before a record's data (length and its CRC) and after it (the data's CRC).
HEADER_BYTES = 12
FOOTER_BYTES = 4


def record_offsets(path):
  """Returns the (offset, length) of each record of a TFRecord file from its framing alone.

  Reads the 12-byte headers only (a seek per record), so it is fast on large files.

  Args:
    path: a TFRecord file.

  Returns:
    (offsets, error): list of (byte offset, data length), and None or a message
    saying where the file ends inside a record.
  """
  size = tf.gfile.Stat(path).length
  offsets = []
  with tf.gfile.GFile(path, "rb") as reader:
    offset = 0
    while offset < size:
      header = reader.read(HEADER_BYTES)
      if len(header) < HEADER_BYTES:
        return offsets, ("cut short: it ends inside the header of record %d at byte %d"
                         % (len(offsets), offset))
      length = int.from_bytes(header[:8], "little")
      end = offset + HEADER_BYTES + length + FOOTER_BYTES
      if end > size:
        return offsets, ("cut short or corrupt: record %d at byte %d claims %d bytes but "
                         "the file ends at byte %d" % (len(offsets), offset, length, size))
      offsets.append((offset, length))
      reader.seek(end)
      offset = end
  return offsets, None


def framed_end(offsets):
  """The byte where the last record of `offsets` ends (0 for none): where a cut starts.

  Args:
    offsets: list of (byte offset, data length), as record_offsets returns.

  Returns:
    int.
  """
  if not offsets:
    return 0
  offset, length = offsets[-1]
  return offset + HEADER_BYTES + length + FOOTER_BYTES


def corrupt_records(path, offsets):
  """Finds the records whose CRCs do not match, going on past each one.

  TensorFlow's reader checks the CRCs but stops at the first bad record; after one,
  the rest of the file is copied to a temporary file and read from there.

  Args:
    path: a TFRecord file whose framing is intact up to len(offsets) records.
    offsets: its record_offsets.

  Returns:
    list of (record index, byte offset, message).
  """
  found = []
  start = 0
  source = path
  temporary = None
  try:
    while start < len(offsets):
      index = start
      try:
        for _ in tf.io.tf_record_iterator(source):
          index += 1
          if index >= len(offsets):
            break
        break
      except tf.errors.DataLossError:
        # TensorFlow's message gives offsets in the copy; the framing gives ours.
        if index >= len(offsets):
          break
        found.append((index, offsets[index][0], "the CRC does not match the data"))
        start = index + 1
        if start >= len(offsets):
          break
        if temporary is None:
          handle, temporary = tempfile.mkstemp(suffix=".tfrecord")
          os.close(handle)
        with tf.gfile.GFile(path, "rb") as reader, open(temporary, "wb") as writer:
          reader.seek(offsets[start][0])
          shutil.copyfileobj(reader, writer)
        source = temporary
  finally:
    if temporary:
      os.remove(temporary)
  return found


def read_records(path, offsets, indices=None):
  """Yields the serialized examples of a file at the places its framing gives.

  The CRCs are not checked here (corrupt_records does that).

  Args:
    path: a TFRecord file.
    offsets: its record_offsets.
    indices: (optional) a set of record indices to read; default: every record.

  Yields:
    (record index, byte offset, serialized example as bytes), in file order.
  """
  with tf.gfile.GFile(path, "rb") as reader:
    for index, (offset, length) in enumerate(offsets):
      if indices is None or index in indices:
        reader.seek(offset + HEADER_BYTES)
        yield index, offset, reader.read(length)


# ----------------------------------------------------------------------------------------
# Parsing one record.
# ----------------------------------------------------------------------------------------


class RecordError(ValueError):
  """A record that is not a pretraining example; str() says why.

  Attributes:
    missing: the features it lacks, in FEATURE_NAMES order (empty unless that is the
      problem).
    not_an_example: True when the bytes are not a tf.train.Example at all.
  """

  def __init__(self, message, missing=(), not_an_example=False):
    super(RecordError, self).__init__(message)
    self.missing = tuple(missing)
    self.not_an_example = not_an_example


def parse_example(serialized, as_numpy=True):
  """Parses one serialized record into its features' values, without checking lengths.

  Args:
    serialized: bytes of a tf.train.Example.
    as_numpy: return numpy arrays; with False, the protobuf's own value lists
      (sequences with len() and indexing), which is several times faster for a check
      that reads a few features of every record.

  Returns:
    dict from each name of FEATURE_NAMES to its values, as many as the record holds:
    with as_numpy, a 1-D numpy array, int64 for INT_FEATURES and float32 for
    FLOAT_FEATURES.

  Raises:
    RecordError: the bytes are not a tf.train.Example ("not a tf.train.Example"), a
      feature is missing ("lacks the feature input_mask", the first in INT_FEATURES
      then FLOAT_FEATURES order) or of the other dtype ("feature masked_lm_weights is a
      int64_list, not a float_list").
  """
  example = tf.train.Example()
  try:
    example.ParseFromString(serialized)
  except Exception:  # pylint: disable=broad-except
    raise RecordError("not a tf.train.Example", not_an_example=True)
  features = example.features.feature
  missing = [name for name in INT_FEATURES + FLOAT_FEATURES if name not in features]
  if missing:
    raise RecordError("lacks the feature %s" % missing[0],
                      missing=[name for name in FEATURE_NAMES if name in missing])
  values = {}
  for name in INT_FEATURES + FLOAT_FEATURES:
    feature = features[name]
    kind = feature.WhichOneof("kind")
    want = "float_list" if name in FLOAT_FEATURES else "int64_list"
    if kind != want:
      raise RecordError("feature %s is a %s, not a %s" % (name, kind, want))
    values[name] = getattr(feature, kind).value
    if as_numpy:
      # A slice is a plain list, which numpy converts faster than the protobuf's.
      values[name] = np.array(values[name][:],
                              dtype=np.float32 if name in FLOAT_FEATURES else np.int64)
  return {name: values[name] for name in FEATURE_NAMES}


# ----------------------------------------------------------------------------------------
# Validating one record.
# ----------------------------------------------------------------------------------------


def wrong_length(values, max_seq_length, max_predictions_per_seq, order=FEATURE_NAMES):
  """The first feature whose number of values is not the spec's.

  Args:
    values: dict from parse_example (numpy arrays or not).
    max_seq_length, max_predictions_per_seq: the lengths the record should have.
    order: the feature names in the order to check them; names not in it are not
      checked (SET_LENGTH_FEATURES + FEATURE_NAMES names the set's lengths first).

  Returns:
    None, or (feature name, its number of values, the number expected).
  """
  lengths = feature_lengths(max_seq_length, max_predictions_per_seq)
  for name in order:
    if len(values[name]) != lengths[name]:
      return name, len(values[name]), lengths[name]
  return None


def token_ids_outside(values, vocab_size):
  """The token ids of a record outside [0, vocab_size).

  Args:
    values: dict from parse_example (numpy arrays or not).
    vocab_size: int, one more than the largest valid id.

  Returns:
    1-D int64 numpy array of the ids outside, those of input_ids first, then those of
    masked_lm_ids, each in record order; empty when all are inside.
  """
  ids = np.concatenate([np.array(values[name][:], dtype=np.int64)
                        for name in TOKEN_ID_FEATURES])
  return ids[(ids < 0) | (ids >= vocab_size)]


def example_problem(values, max_seq_length, max_predictions_per_seq, vocab_size=None):
  """Returns the first way a parsed record breaks the spec, or None.

  Beyond what training needs (the lengths, ids inside the vocab), this checks the
  layout create_pretraining_data writes: input_mask a run of ones then zeros,
  input_ids zero-padded after it, masked_lm_weights ones then zeros, masked positions
  ascending inside the sequence (after [CLS]), next_sentence_labels 0 or 1.

  Args:
    values: dict from parse_example.
    max_seq_length: expected length of the token features.
    max_predictions_per_seq: expected length of the masked LM features.
    vocab_size: (optional) token ids must be in [0, vocab_size).

  Returns:
    None, or a str such as "input_ids has 64 values, not max_seq_length 128".
  """
  wrong = wrong_length(values, max_seq_length, max_predictions_per_seq)
  if wrong:
    name, found, want = wrong
    setting = dict((n, length) for n, _, length in FEATURES)[name]
    if setting == 1:
      return "%s has %d values, not 1" % (name, found)
    return "%s has %d values, not %s %d" % (name, found, setting, want)
  mask = values["input_mask"]
  length = int(mask.sum())
  if not (np.all(mask[:length] == 1) and np.all(mask[length:] == 0)):
    return "input_mask is not a run of ones followed by zeros"
  if np.any(values["input_ids"][length:] != 0):
    return "input_ids are not zero-padded after the input_mask"
  weights = values["masked_lm_weights"]
  num_predictions = int((weights > 0).sum())
  positions = values["masked_lm_positions"][:num_predictions]
  if np.any(weights[num_predictions:] != 0) or np.any(weights[:num_predictions] != 1):
    return "masked_lm_weights are not ones followed by zeros"
  if num_predictions and (positions.min() < 1 or positions.max() >= length or
                          np.any(np.diff(positions) <= 0)):
    return "masked_lm_positions are not ascending positions inside the sequence"
  if values["next_sentence_labels"][0] not in (0, 1):
    return "next_sentence_labels is %d, not 0 or 1" % values["next_sentence_labels"][0]
  if vocab_size:
    outside = token_ids_outside(values, vocab_size)
    if outside.size:
      return "token id %d is outside the vocab (%d tokens)" % (outside.max(), vocab_size)
  return None


# ----------------------------------------------------------------------------------------
# Writing.
# ----------------------------------------------------------------------------------------


def serialize_example(values):
  """Serializes one record: the bytes create_pretraining_data writes for these values.

  Args:
    values: dict from every name of FEATURE_NAMES to a sequence (or 1-D numpy array) of
      its values, ints for INT_FEATURES and floats for FLOAT_FEATURES, already padded.

  Returns:
    bytes: tf.train.Example's deterministic serialization (map entries sorted by name).
  """
  features = {}
  for name in FEATURE_NAMES:
    if name in FLOAT_FEATURES:
      features[name] = tf.train.Feature(
          float_list=tf.train.FloatList(value=[float(v) for v in values[name]]))
    else:
      features[name] = tf.train.Feature(
          int64_list=tf.train.Int64List(value=[int(v) for v in values[name]]))
  example = tf.train.Example(features=tf.train.Features(feature=features))
  return example.SerializeToString(deterministic=True)


def os_error_from_tf(error, path):
  """TensorFlow's error writing a record file as OSError, so a full disk reads the same
  everywhere.

  Only builtin exceptions cross a process pool intact, hence OSError here.

  Args:
    error: a tf.errors.OpError raised while writing `path`.
    path: the file being written.

  Returns:
    OSError with errno ENOSPC for a full disk, else EIO with TensorFlow's first line.
  """
  message = error.message.splitlines()[0] if error.message else str(error)
  if "No space left on device" in message:
    return OSError(errno.ENOSPC, "No space left on device", path)
  return OSError(errno.EIO, "TensorFlow could not write it: %s" % message, path)
