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

A packed record (python3 -m bert_pretrain.pack_records writes them) holds up to
max_sequences_per_pack (k) such sequences one after the other in one row of
max_seq_length tokens, with the features and conventions of Habana's and Graphcore's
packed BERT TFRecords (NVIDIA's packed HDF5 keeps per-pack lengths instead:
packed_input_len, packed_masked_lm_len):

  input_ids                int64   [max_seq_length]   the sequences' tokens one after the
                                                      other, zero padded
  input_mask               int64   [max_seq_length]   the index of the sequence a token
                                                      belongs to, 1..k; 0 on padding
  segment_ids              int64   [max_seq_length]   each sequence's own, 0 on padding
  positions                int64   [max_seq_length]   0, 1, ... restarting at each
                                                      sequence's [CLS]; 0 on padding
  masked_lm_positions      int64   [max_predictions_per_pack]  positions in the row,
                                                      ascending (so by sequence), 0 padded
  masked_lm_ids            int64   [max_predictions_per_pack]
  masked_lm_weights        float32 [max_predictions_per_pack]  1.0 per prediction, 0.0
                                                      padding (the sequence of a
                                                      prediction is input_mask there)
  next_sentence_positions  int64   [k]                slot j: the position of sequence
                                                      j+1's [CLS]; 0 for an empty slot
  next_sentence_labels     int64   [k]                slot j: its label; 0 when empty
  next_sentence_weights    float32 [k]                1.0 for a sequence, 0.0 when empty

max_predictions_per_pack is max_predictions_per_seq + k (79 for MLPerf's 76 and 3), as
Habana's and Graphcore's; see max_predictions_per_pack(). Habana's and Graphcore's
packers write the sequence index into masked_lm_weights; here it stays a weight, so the
masked-LM loss sum(weights * loss) / sum(weights) of a batch of packs is that of the
same sequences unpacked. A record is packed when it has any of PACKED_ONLY
(is_packed, record_layout).

The module reads top to bottom: the feature spec, the framing, parsing one record into
numpy arrays, validating it, the packed format (its spec, packing and unpacking
sequences, validating a pack), and serializing records for a writer (serialize_examples:
create_pretraining_data's and pack_records' one way to make their bytes).
"""

import collections
import errno
import functools
import logging
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


class _NoIteratorDeprecation(logging.Filter):
  """Drops TensorFlow's deprecation warning of tf_record_iterator."""

  def filter(self, record):
    return "tf_record_iterator" not in record.getMessage()


def record_iterator(path):
  """tf.io.tf_record_iterator(path) without its deprecation warning, four lines that
  would come before a tool's one-line error (its replacement needs eager execution)."""
  logger = tf.get_logger()
  if not any(isinstance(f, _NoIteratorDeprecation) for f in logger.filters):
    logger.addFilter(_NoIteratorDeprecation())
  return tf.io.tf_record_iterator(path)


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
        for _ in record_iterator(source):
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


def parse_example(serialized, as_numpy=True, packed=False):
  """Parses one serialized record into its features' values, without checking lengths.

  Args:
    serialized: bytes of a tf.train.Example.
    as_numpy: return numpy arrays; with False, the protobuf's own value lists
      (sequences with len() and indexing), which is several times faster for a check
      that reads a few features of every record.
    packed: False: the features of FEATURE_NAMES; True: those of PACKED_FEATURE_NAMES;
      None: whichever the record is (is_packed).

  Returns:
    dict from each name of FEATURE_NAMES (PACKED_FEATURE_NAMES for a packed record) to
    its values, as many as the record holds: with as_numpy, a 1-D numpy array, int64
    for the int64 features and float32 for the float ones.

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
  if packed is None:
    packed = is_packed(features)
  names, int_names, float_names = ((PACKED_FEATURE_NAMES, PACKED_INT_FEATURES,
                                    PACKED_FLOAT_FEATURES) if packed else
                                   (FEATURE_NAMES, INT_FEATURES, FLOAT_FEATURES))
  missing = [name for name in int_names + float_names if name not in features]
  if missing:
    raise RecordError("lacks the feature %s" % missing[0],
                      missing=[name for name in names if name in missing])
  values = {}
  for name in int_names + float_names:
    feature = features[name]
    kind = feature.WhichOneof("kind")
    want = "float_list" if name in float_names else "int64_list"
    if kind != want:
      raise RecordError("feature %s is a %s, not a %s" % (name, kind, want))
    values[name] = getattr(feature, kind).value
    if as_numpy:
      # A slice is a plain list, which numpy converts faster than the protobuf's.
      values[name] = np.array(values[name][:],
                              dtype=np.float32 if name in float_names else np.int64)
  return {name: values[name] for name in names}


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
  batch = {name: np.asarray(values[name])[None] for name in FEATURE_NAMES}
  return example_problems(batch, vocab_size)[0]


def example_problems(values, vocab_size=None):
  """example_problem for a batch of records of the right lengths, row by row.

  Args:
    values: dict from each name of FEATURE_NAMES to a 2-D numpy array [records, its
      length], as tf.io.parse_example gives them.
    vocab_size: (optional) token ids must be in [0, vocab_size).

  Returns:
    list with, for each record, None or the first way it breaks the spec (the messages
    of example_problem).
  """
  mask = values["input_mask"]
  rows = len(mask)
  length = mask.sum(axis=1)
  real = np.arange(mask.shape[1]) < length[:, None]
  weights = values["masked_lm_weights"]
  num_predictions = (weights > 0).sum(axis=1)
  predicted = np.arange(weights.shape[1]) < num_predictions[:, None]
  positions = values["masked_lm_positions"]
  labels = values["next_sentence_labels"][:, 0]
  checks = [
      (np.any(mask != real, axis=1), "input_mask is not a run of ones followed by zeros"),
      (np.any((values["input_ids"] != 0) & ~real, axis=1),
       "input_ids are not zero-padded after the input_mask"),
      (np.any(weights != predicted, axis=1),
       "masked_lm_weights are not ones followed by zeros"),
      (np.any(predicted & ((positions < 1) | (positions >= length[:, None])), axis=1) |
       np.any(predicted[:, 1:] & (np.diff(positions, axis=1) <= 0), axis=1),
       "masked_lm_positions are not ascending positions inside the sequence"),
      ((labels != 0) & (labels != 1), "next_sentence_labels is %d, not 0 or 1"),
  ]
  if vocab_size:
    outside = np.zeros(rows, bool)
    for name in TOKEN_ID_FEATURES:
      outside |= np.any((values[name] < 0) | (values[name] >= vocab_size), axis=1)
    checks.append((outside, "token id %d is outside the vocab (%d tokens)"))
  problems = [None] * rows
  for bad, message in checks:
    for row in np.flatnonzero(bad):
      if problems[row] is None:
        if message.startswith("next_sentence_labels"):
          message_row = message % labels[row]
        elif message.startswith("token id"):
          row_values = {name: values[name][row] for name in TOKEN_ID_FEATURES}
          message_row = message % (token_ids_outside(row_values, vocab_size).max(),
                                   vocab_size)
        else:
          message_row = message
        problems[row] = message_row
  return problems


# ----------------------------------------------------------------------------------------
# The packed format.
# ----------------------------------------------------------------------------------------

# (name, dtype, length), as FEATURES; the names and dtypes are Habana's packed records'.
PACKED_FEATURES = (
    ("input_ids", tf.int64, "max_seq_length"),
    ("input_mask", tf.int64, "max_seq_length"),
    ("segment_ids", tf.int64, "max_seq_length"),
    ("positions", tf.int64, "max_seq_length"),
    ("masked_lm_positions", tf.int64, "max_predictions_per_pack"),
    ("masked_lm_ids", tf.int64, "max_predictions_per_pack"),
    ("masked_lm_weights", tf.float32, "max_predictions_per_pack"),
    ("next_sentence_positions", tf.int64, "max_sequences_per_pack"),
    ("next_sentence_labels", tf.int64, "max_sequences_per_pack"),
    ("next_sentence_weights", tf.float32, "max_sequences_per_pack"),
)
PACKED_FEATURE_NAMES = tuple(name for name, _, _ in PACKED_FEATURES)
PACKED_INT_FEATURES = tuple(name for name, dtype, _ in PACKED_FEATURES if dtype == tf.int64)
PACKED_FLOAT_FEATURES = tuple(name for name, dtype, _ in PACKED_FEATURES
                              if dtype == tf.float32)
# The features only a packed record has.
PACKED_ONLY = tuple(name for name in PACKED_FEATURE_NAMES if name not in FEATURE_NAMES)

# What a record holds: packed or not, and the lengths of its features (max_predictions is
# max_predictions_per_seq for a record of one sequence, max_predictions_per_pack for a
# packed one; max_sequences is 1 for an unpacked record).
RecordLayout = collections.namedtuple(
    "RecordLayout", ["packed", "max_seq_length", "max_predictions", "max_sequences"])


def max_predictions_per_pack(max_predictions_per_seq, max_sequences_per_pack):
  """The number of masked-LM values of a pack: max_predictions_per_seq + k.

  create_pretraining_data predicts min(max_predictions_per_seq, max(1, round(length *
  masked_lm_prob))) tokens of a sequence; sequences sharing max_seq_length tokens thus
  have at most max_seq_length * masked_lm_prob + k / 2 predictions (+ k/2 from the
  rounding), which is at most max_predictions_per_seq + k when max_predictions_per_seq
  >= max_seq_length * masked_lm_prob - k / 2 (MLPerf: 512 * 0.15 + 1.5 = 78.3 <= 79).
  This is Habana's and Graphcore's length; k times max_predictions_per_seq (228) would
  triple the masked-LM head's gathers for nothing. The packer checks each pack against
  it with the predictions the sequences really have, so other data is packed correctly,
  at worst into more packs.

  Args:
    max_predictions_per_seq: int, the unpacked records' masked-LM length.
    max_sequences_per_pack: int, k.

  Returns:
    int.
  """
  return max_predictions_per_seq + max_sequences_per_pack


def packed_feature_lengths(max_seq_length, max_predictions_per_pack, max_sequences_per_pack):
  """The number of values of each packed feature.

  Args:
    max_seq_length: int, the tokens of a pack.
    max_predictions_per_pack: int, the masked-LM values of a pack.
    max_sequences_per_pack: int, the sequence slots of a pack (k).

  Returns:
    dict from feature name to int, in PACKED_FEATURE_NAMES order.
  """
  settings = {"max_seq_length": max_seq_length,
              "max_predictions_per_pack": max_predictions_per_pack,
              "max_sequences_per_pack": max_sequences_per_pack}
  return {name: settings[length] for name, _, length in PACKED_FEATURES}


def packed_feature_spec(max_seq_length, max_predictions_per_pack, max_sequences_per_pack):
  """The tf.parse_example spec of one packed record.

  Args:
    max_seq_length, max_predictions_per_pack, max_sequences_per_pack: as
      packed_feature_lengths.

  Returns:
    dict from feature name to tf.FixedLenFeature, in PACKED_FEATURE_NAMES order.
  """
  lengths = packed_feature_lengths(max_seq_length, max_predictions_per_pack,
                                   max_sequences_per_pack)
  return {name: tf.FixedLenFeature([lengths[name]], dtype)
          for name, dtype, _ in PACKED_FEATURES}


def is_packed(feature_names):
  """Whether a record with these features is packed (has any of PACKED_ONLY).

  Args:
    feature_names: a container of feature names: a dict from parse_example, a
      tf.train.Example's feature map, a feature spec.

  Returns:
    bool.
  """
  return any(name in feature_names for name in PACKED_ONLY)


def record_layout(serialized):
  """What one serialized record is: packed or not, and its feature lengths.

  This is how a reader tells packed records from unpacked ones by their features.

  Args:
    serialized: bytes of a tf.train.Example.

  Returns:
    RecordLayout; the lengths are those of input_ids, masked_lm_ids and (packed)
    next_sentence_labels.

  Raises:
    RecordError: as parse_example.
  """
  values = parse_example(serialized, as_numpy=False, packed=None)
  packed = is_packed(values)
  return RecordLayout(packed, len(values["input_ids"]), len(values["masked_lm_ids"]),
                      len(values["next_sentence_labels"]) if packed else 1)


def pack_sequences(sequences, max_seq_length, max_predictions_per_pack,
                   max_sequences_per_pack):
  """Packs parsed unpacked records into one packed record's values.

  Args:
    sequences: list of 1 to max_sequences_per_pack dicts from parse_example (numpy),
      each valid (example_problem None); they fill slots 1, 2, ... in this order.
    max_seq_length, max_predictions_per_pack, max_sequences_per_pack: the pack's
      lengths (packed_feature_lengths).

  Returns:
    dict from each name of PACKED_FEATURE_NAMES to a 1-D numpy array (int64 or float32).

  Raises:
    ValueError: too many sequences, tokens or predictions for the pack.
  """
  batch = {name: np.stack([np.asarray(values[name]) for values in sequences])
           for name in FEATURE_NAMES}
  packed = pack_batch(batch, np.zeros(len(sequences), np.int64), 1, max_seq_length,
                      max_predictions_per_pack, max_sequences_per_pack)
  return {name: values[0] for name, values in packed.items()}


def pack_batch(values, pack_of, num_packs, max_seq_length, max_predictions_per_pack,
               max_sequences_per_pack):
  """Packs a batch of parsed unpacked records into num_packs packed records.

  Args:
    values: dict from each name of FEATURE_NAMES to a 2-D numpy array [sequences, its
      length] of valid records (example_problems None).
    pack_of: int array [sequences], the pack of each sequence, non-decreasing: a
      pack's sequences are consecutive rows and fill its slots in row order.
    num_packs: int, the packs made (each gets at least one sequence).
    max_seq_length, max_predictions_per_pack, max_sequences_per_pack: the packs'
      lengths (packed_feature_lengths).

  Returns:
    dict from each name of PACKED_FEATURE_NAMES to a 2-D numpy array [num_packs, its
    length], int64 or float32.

  Raises:
    ValueError: a pack gets too many sequences, tokens or predictions, or none.
  """
  pack_of = np.asarray(pack_of, np.int64)
  count = len(pack_of)
  lengths = packed_feature_lengths(max_seq_length, max_predictions_per_pack,
                                   max_sequences_per_pack)
  packed = {name: np.zeros((num_packs, lengths[name]),
                           np.float32 if dtype == tf.float32 else np.int64)
            for name, dtype, _ in PACKED_FEATURES}
  if count and np.any(np.diff(pack_of) < 0):
    raise ValueError("pack_of is not non-decreasing")
  sequences_per_pack = np.bincount(pack_of, minlength=num_packs)
  if len(sequences_per_pack) > num_packs or np.any(sequences_per_pack == 0):
    raise ValueError("pack_of does not give each of the %d packs a sequence" % num_packs)
  if sequences_per_pack.max() > max_sequences_per_pack:
    raise ValueError("%d sequences do not fit a pack of %d" % (sequences_per_pack.max(),
                                                               max_sequences_per_pack))
  first_row = np.cumsum(sequences_per_pack) - sequences_per_pack
  slot = np.arange(count) - first_row[pack_of]
  tokens = np.count_nonzero(values["input_mask"], axis=1)
  predictions = np.count_nonzero(values["masked_lm_weights"], axis=1)

  def starts_in_pack(sizes):
    """Where each sequence's part begins in its pack, and each pack's total."""
    before = np.cumsum(sizes) - sizes
    return before - before[first_row[pack_of]], np.bincount(pack_of, sizes, num_packs)

  offset, pack_tokens = starts_in_pack(tokens)
  first_prediction, pack_predictions = starts_in_pack(predictions)
  if pack_tokens.max() > max_seq_length:
    raise ValueError("the sequences have more than max_seq_length %d tokens"
                     % max_seq_length)
  if pack_predictions.max() > max_predictions_per_pack:
    raise ValueError("the sequences have more than max_predictions_per_pack %d "
                     "predictions" % max_predictions_per_pack)

  # A pack's tokens are its sequences' tokens one after the other, and the batch's
  # sequences are in pack and slot order: the real tokens of the batch, row by row, are
  # the packs' tokens, pack by pack.
  real = np.arange(values["input_mask"].shape[1]) < tokens[:, None]
  filled = np.arange(max_seq_length) < pack_tokens[:, None]
  packed["input_ids"][filled] = values["input_ids"][real]
  packed["segment_ids"][filled] = values["segment_ids"][real]
  packed["input_mask"][filled] = np.repeat(slot + 1, tokens)
  packed["positions"][filled] = np.nonzero(real)[1]
  predicted = np.arange(values["masked_lm_weights"].shape[1]) < predictions[:, None]
  filled = np.arange(max_predictions_per_pack) < pack_predictions[:, None]
  packed["masked_lm_positions"][filled] = (values["masked_lm_positions"][predicted] +
                                           np.repeat(offset, predictions))
  packed["masked_lm_ids"][filled] = values["masked_lm_ids"][predicted]
  packed["masked_lm_weights"][filled] = values["masked_lm_weights"][predicted]
  packed["next_sentence_positions"][pack_of, slot] = offset
  packed["next_sentence_labels"][pack_of, slot] = values["next_sentence_labels"][:, 0]
  packed["next_sentence_weights"][pack_of, slot] = 1.0
  return packed


def unpack_example(values, max_predictions_per_seq):
  """The unpacked records of a packed record's sequences, as pack_sequences took them.

  Args:
    values: dict from parse_example(..., packed=True) (numpy) of a valid pack
      (packed_example_problem None).
    max_predictions_per_seq: int, the masked-LM length of the records made.

  Returns:
    list of dicts from each name of FEATURE_NAMES to a 1-D numpy array, one per
    sequence in slot order, padded as create_pretraining_data pads (zeros).
  """
  max_seq_length = len(values["input_ids"])
  mask = values["input_mask"]
  weights = values["masked_lm_weights"]
  predicted = np.flatnonzero(weights)
  # The sequence each prediction belongs to.
  owner = mask[values["masked_lm_positions"][predicted]]
  sequences = []
  for slot in np.flatnonzero(values["next_sentence_weights"]):
    tokens = np.flatnonzero(mask == slot + 1)
    start, length = int(tokens[0]), len(tokens)
    mine = predicted[owner == slot + 1]
    count = len(mine)
    record = {
        "input_ids": np.zeros(max_seq_length, np.int64),
        "input_mask": np.zeros(max_seq_length, np.int64),
        "segment_ids": np.zeros(max_seq_length, np.int64),
        "masked_lm_positions": np.zeros(max_predictions_per_seq, np.int64),
        "masked_lm_ids": np.zeros(max_predictions_per_seq, np.int64),
        "masked_lm_weights": np.zeros(max_predictions_per_seq, np.float32),
        "next_sentence_labels": values["next_sentence_labels"][slot:slot + 1].astype(np.int64),
    }
    record["input_ids"][:length] = values["input_ids"][start:start + length]
    record["input_mask"][:length] = 1
    record["segment_ids"][:length] = values["segment_ids"][start:start + length]
    record["masked_lm_positions"][:count] = values["masked_lm_positions"][mine] - start
    record["masked_lm_ids"][:count] = values["masked_lm_ids"][mine]
    record["masked_lm_weights"][:count] = weights[mine]
    sequences.append(record)
  return sequences


def packed_example_problem(values, max_seq_length, max_predictions_per_pack,
                           max_sequences_per_pack, vocab_size=None):
  """Returns the first way a parsed packed record breaks the packed format, or None.

  Checks the lengths, then the layout pack_sequences writes: input_mask the sequence
  indices 1, 1, ..., 2, ... in order then zeros, input_ids zero-padded after them,
  positions restarting at 0 at each sequence, segment ids 0 or 1 (0 on padding),
  next_sentence_positions at each sequence's first token with weight 1.0 (0, 0.0 in
  the empty slots after them), labels 0 or 1, masked_lm_weights ones then zeros at
  ascending positions inside the sequences and never at a [CLS], ids inside the vocab.

  Args:
    values: dict from parse_example(..., packed=True) (numpy).
    max_seq_length, max_predictions_per_pack, max_sequences_per_pack: the lengths the
      record should have.
    vocab_size: (optional) token ids must be in [0, vocab_size).

  Returns:
    None, or a str such as "positions do not restart at 0 at each sequence".
  """
  lengths = packed_feature_lengths(max_seq_length, max_predictions_per_pack,
                                   max_sequences_per_pack)
  for name, _, setting in PACKED_FEATURES:
    if len(values[name]) != lengths[name]:
      return "%s has %d values, not %s %d" % (name, len(values[name]), setting,
                                              lengths[name])
  mask = values["input_mask"]
  used = int(np.count_nonzero(mask))
  steps = np.diff(mask[:used])
  if (used == 0 or mask[0] != 1 or np.any(mask[used:] != 0) or np.any(steps < 0) or
      np.any(steps > 1)):
    return ("input_mask is not the sequence indices 1, 2, ... of the tokens followed by "
            "zeros")
  if np.any(values["input_ids"][used:] != 0):
    return "input_ids are not zero-padded after the last sequence"
  num_sequences = int(mask[used - 1])
  if num_sequences > max_sequences_per_pack:
    return ("input_mask holds %d sequences, more than max_sequences_per_pack %d"
            % (num_sequences, max_sequences_per_pack))
  starts = np.concatenate([[0], np.flatnonzero(steps) + 1])
  expected = np.zeros(max_seq_length, np.int64)
  expected[:used] = np.arange(used) - starts[mask[:used] - 1]
  if np.any(values["positions"] != expected):
    return "positions do not restart at 0 at each sequence"
  segments = values["segment_ids"]
  if np.any((segments != 0) & (segments != 1)) or np.any(segments[used:] != 0):
    return "segment_ids are not 0 or 1 on the sequences and 0 on padding"
  slot_weights = values["next_sentence_weights"]
  if (np.any(slot_weights[:num_sequences] != 1) or
      np.any(slot_weights[num_sequences:] != 0)):
    return ("next_sentence_weights are not 1.0 for each of the %d sequences then 0.0"
            % num_sequences)
  if (np.any(values["next_sentence_positions"][:num_sequences] != starts) or
      np.any(values["next_sentence_positions"][num_sequences:] != 0)):
    return "next_sentence_positions are not the positions of the sequences' [CLS]"
  labels = values["next_sentence_labels"]
  if np.any((labels != 0) & (labels != 1)) or np.any(labels[num_sequences:] != 0):
    return "next_sentence_labels are not 0 or 1 (0 in the empty slots)"
  weights = values["masked_lm_weights"]
  count = int(np.count_nonzero(weights))
  if np.any(weights[count:] != 0) or np.any(weights[:count] != 1):
    if count and np.all(weights[:count] == np.round(weights[:count])) and weights.max() > 1:
      return ("masked_lm_weights hold sequence indices (Habana's and Graphcore's packers "
              "write them), not 1.0 weights; pack the unpacked records with python3 -m "
              "bert_pretrain.pack_records")
    return "masked_lm_weights are not ones followed by zeros"
  positions = values["masked_lm_positions"][:count]
  if count and (positions.max() >= used or np.any(np.diff(positions) <= 0) or
                np.any(np.isin(positions, starts))):
    return "masked_lm_positions are not ascending positions inside the sequences"
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
    values: dict from every name of FEATURE_NAMES (of PACKED_FEATURE_NAMES for a packed
      record: is_packed) to a sequence (or 1-D numpy array) of its values, ints for the
      int64 features and floats for the float ones, already padded.

  Returns:
    bytes: tf.train.Example's deterministic serialization (map entries sorted by name).
  """
  return serialize_examples({name: np.asarray(value)[None] for name, value in values.items()
                             if name in PACKED_FEATURE_NAMES + FEATURE_NAMES})[0]


def _varint(value):
  """Protobuf varint bytes of a non-negative int."""
  out = bytearray()
  while True:
    byte = value & 0x7F
    value >>= 7
    if value:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)


def _varint_rows(matrix):
  """Protobuf varints of every value of a 2-D int (or bool) array, row by row.

  Returns:
    (data, ends): bytes of all values' varints in row-major order, and the int64 array
    of where each row's bytes end in data.
  """
  matrix = np.asarray(matrix)
  rows, columns = matrix.shape
  if matrix.dtype == bool:  # a mask: one byte a value, as it is
    return matrix.tobytes(), np.arange(1, rows + 1) * columns
  matrix = matrix.astype(np.int64, copy=False)
  if matrix.size == 0:
    return b"", np.zeros(rows, np.int64)
  if matrix.min() < 0:
    # Negative int64s are their two's complement, 10 bytes, as protobuf writes them.
    unsigned, width = matrix.astype(np.uint64), 10
  else:
    top = int(matrix.max())
    unsigned = matrix.astype(np.uint32 if top < 2 ** 32 else np.uint64)
    width = 1
    while width < 10 and top >= 1 << (7 * width):
      width += 1
  if width == 1:
    return unsigned.astype(np.uint8).tobytes(), np.arange(1, rows + 1) * columns
  flat = unsigned.reshape(-1)
  if width <= 3:  # token ids: each value's size and bytes looked up, one word a value
    sizes, words = _varint_table(top.bit_length())
    size = np.take(sizes, flat)
    code = np.take(words, flat).view(np.uint8).reshape(-1, 4)
  else:
    size = np.ones(flat.shape, np.uint8)
    for index in range(1, width):
      size += flat >= flat.dtype.type(1 << (7 * index))
    code = np.empty(flat.shape + (width,), np.uint8)
    for index in range(width):
      code[:, index] = ((flat >> flat.dtype.type(7 * index)) & flat.dtype.type(0x7F)) | (
          (size > index + 1).astype(np.uint8) << np.uint8(7))
  ends = np.cumsum(size, dtype=np.int64)
  starts = ends - size
  data = np.empty(int(ends[-1]) + width, np.uint8)
  # Every value's byte i goes to start + i, highest i first: a value shorter than i + 1
  # bytes spills onto the next value's first bytes, which a later pass overwrites.
  for index in range(width - 1, -1, -1):
    data[starts + index] = code[:, index]
  return data[:int(ends[-1])].tobytes(), ends.reshape(rows, columns)[:, -1]


@functools.lru_cache(maxsize=None)
def _varint_table(bits):
  """(sizes, words): the varint size of every value below 2 ** bits (at most 21), and
  its bytes in a little-endian 32-bit word."""
  values = np.arange(1 << bits, dtype=np.uint32)
  sizes = np.ones(values.shape, np.uint8)
  for index in range(1, 3):
    sizes += values >= 1 << (7 * index)
  codes = np.zeros(values.shape + (4,), np.uint8)
  for index in range(3):
    codes[:, index] = ((values >> (7 * index)) & 0x7F) | ((sizes > index + 1) << 7)
  return sizes, codes.view("<u4").reshape(-1)


def serialize_examples(values):
  """Serializes records: tf.train.Example's deterministic bytes, made with numpy.

  Args:
    values: dict from every name of FEATURE_NAMES (of PACKED_FEATURE_NAMES for packed
      records) to a 2-D array [records, its length], ints (or bools) for the int64
      features and floats (or bools) for the float ones.

  Returns:
    list of bytes, one per record: what tf.train.Example(...).SerializeToString(
    deterministic=True) gives (the map entries sorted by name, packed value lists).

  Raises:
    ValueError: the features have different numbers of records.
  """
  packed = is_packed(values)
  names = sorted(PACKED_FEATURE_NAMES if packed else FEATURE_NAMES)
  float_names = PACKED_FLOAT_FEATURES if packed else FLOAT_FEATURES
  rows = len(values[names[0]])
  if any(len(values[name]) != rows for name in names):
    raise ValueError("the features have different numbers of records: %s" % ", ".join(
        "%s %d" % (name, len(values[name])) for name in names))
  parts = []  # per feature: each row's map entry up to its values, then its values
  for name in names:
    if name in float_names:
      data = np.ascontiguousarray(values[name], dtype="<f4").tobytes()
      width = 4 * np.shape(values[name])[1]
      ends = np.arange(1, rows + 1, dtype=np.int64) * width
    else:
      data, ends = _varint_rows(values[name])
    ends = [0] + ends.tolist()
    lengths = [end - start for start, end in zip(ends[:-1], ends[1:])]
    kind = 0x12 if name in float_names else 0x1A
    prefixes = {length: _entry_prefix(name.encode("utf-8"), kind, length)
                for length in set(lengths)}
    parts.append(list(map(prefixes.__getitem__, lengths)))
    parts.append([data[start:end] for start, end in zip(ends[:-1], ends[1:])])
  return [_example_header(len(features)) + features
          for features in map(b"".join, zip(*parts))]


@functools.lru_cache(maxsize=None)
def _example_header(length):
  return b"\x0a" + _varint(length)  # Example.features, field 1


@functools.lru_cache(maxsize=None)
def _entry_prefix(name, kind, payload_length):
  """The bytes of a Features map entry before its values: the entry, the Feature
  (kind 0x12: float_list, 0x1A: int64_list) and the packed value list."""
  value_list = (b"\x0a" + _varint(payload_length)) if payload_length else b""
  feature = bytes([kind]) + _varint(len(value_list) + payload_length) + value_list
  entry = (b"\x0a" + _varint(len(name)) + name + b"\x12" +
           _varint(len(feature) + payload_length) + feature)
  return b"\x0a" + _varint(len(entry) + payload_length) + entry


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
