# coding=utf-8
r"""Creates BERT pretraining TFRecords (masked LM + next sentence) from raw text.

Input: UTF-8 text files, one sentence a line, a blank line between documents.
Output: TFRecord files of tf.train.Example protos with the features of Google's BERT
(google-research/bert create_pretraining_data.py), consumed by run_pretraining; the
format is bert_pretrain/data/records.py's (input_ids, input_mask, segment_ids of
max_seq_length values, masked_lm_positions, masked_lm_ids, masked_lm_weights of
max_predictions_per_seq, next_sentence_labels).

The rules are Google's: documents are shuffled; each pass (dupe_factor of them) cuts
every document into chunks of sentences up to a target length (shorter, uniform in
[2, max_seq_length - 3], for a whole document with probability short_seq_prob); A is a
random number of the chunk's leading sentences, B the rest, or with probability 0.5 (or
always when the chunk is one sentence) text from a random other document, in which case
the chunk's unused sentences go back to be used by the next chunk; the longer of A and B
loses a token from its front or back (coin flip) until the pair fits; then
min(max_predictions_per_seq, max(1, round(len * masked_lm_prob))) tokens (whole words
with do_whole_word_mask) are masked: 80% become [MASK], 10% stay, 10% become a uniformly
random vocab token. The instances of all passes are shuffled and written round-robin.

What differs from Google's script is how the work is done, 10x faster or more (1.1-1.8
MB/s of text per core at 512/76/dupe 10, where Google's makes ~0.1): lines are
tokenized in bulk (FullTokenizer.tokenize_to_ids, still Google's tokens); documents are
numpy id arrays with sentence bounds, so A and B are slices; truncation draws binomial
counts instead of a coin per token; masking is vectorized over batches of instances at
write time (one draw per batch); and the Example protos are encoded straight to wire
bytes, identical to protobuf's deterministic serialization. So the random stream, and
hence the exact instances, differ from Google's for the same seed; the statistics do
not (tests/test_create_pretraining_data.py compares them). Also, the end of a file ends
a document, and each output is written under a temporary name and renamed when
complete. The same inputs and seed give byte-identical files. Whole-word masking
picks words per instance in Python and runs at about half that speed.

The flags are Google's; their defaults are this recipe's (MLPerf BERT: 512 tokens, 76
predictions) rather than Google's 128 and 20.

Usage:
  python3 -m bert_pretrain.create_pretraining_data --input_file=data/*.txt \
    --output_file=out/part-0.tfrecord --vocab_file=vocab.txt --max_seq_length=512 \
    --max_predictions_per_seq=76 --dupe_factor=10
"""

import bisect
import os
import random
import sys
import time

from absl import flags
from absl import logging
import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain import config
from bert_pretrain import errors
from bert_pretrain.data import records
from bert_pretrain.data import tokenization
from bert_pretrain.wiki import workdir

# Lines tokenized per batch call: large enough to amortize the call, small enough that
# the Encoding objects of one batch stay a few MB.
_TOKENIZE_BATCH_LINES = 20000
# Examples encoded per vectorized batch.
_SERIALIZE_BATCH = 512


class Document(object):
  """One document: its token ids and where each sentence starts."""

  __slots__ = ("token_ids", "sentence_bounds")

  def __init__(self, token_ids, sentence_bounds):
    """Creates the document.

    Args:
      token_ids: 1-D numpy array of the ids of all its sentences, concatenated.
      sentence_bounds: list of ints, sentence i is token_ids[bounds[i]:bounds[i + 1]];
        bounds[0] is 0 and bounds[-1] is len(token_ids).
    """
    self.token_ids = token_ids
    self.sentence_bounds = sentence_bounds

  @property
  def num_sentences(self):
    return len(self.sentence_bounds) - 1


def expand_input_files(input_files):
  """Expands comma-separated paths and glob patterns into a list of existing files.

  Args:
    input_files: str (comma-separated) or list of str; each a path or glob pattern.

  Returns:
    list of file paths, patterns expanded in sorted order.

  Raises:
    ValueError: if nothing is given, a path does not exist or is a folder, a pattern
      matches nothing, or a file comes twice (its documents would be read twice).
  """
  if isinstance(input_files, str):
    input_files = input_files.split(",")
  patterns = [p.strip() for p in input_files if p and p.strip()]
  if not patterns:
    raise ValueError("no input files given; pass --input_file=<text file, glob or list>")
  paths = []
  for pattern in patterns:
    if any(c in pattern for c in "*?["):
      matches = sorted(tf.io.gfile.glob(pattern))
      if not matches:
        raise ValueError("input pattern %r matches no files; check --input_file" % pattern)
      paths.extend(matches)
    elif tf.io.gfile.isdir(pattern):
      if not tf.io.gfile.listdir(pattern):
        raise ValueError("input file %r is an empty folder; pass the corpus's text files "
                         "(one sentence a line, a blank line between documents)" % pattern)
      # prepare_wiki's text shards have no extension.
      files = "*.txt" if tf.io.gfile.glob(os.path.join(pattern, "*.txt")) else "*"
      raise ValueError("input file %r is a folder; pass the text files in it, e.g. "
                       "--input_file=%s" % (pattern, os.path.join(pattern, files)))
    elif not tf.io.gfile.exists(pattern):
      raise ValueError("input file %r does not exist; check --input_file" % pattern)
    else:
      paths.append(pattern)
  seen = set()
  for path in paths:
    if os.path.realpath(path) in seen:
      raise ValueError("input file %s is given twice in --input_file (named and matched by "
                       "a pattern, say): its documents would be read twice; list each once"
                       % path)
    seen.add(os.path.realpath(path))
  return paths


def _not_text(path, data, offset):
  """What a file that is not UTF-8 is, with the fix: TFRecords or a compressed file
  (a dump) are named as such."""
  if data.startswith((b"BZh", b"\x1f\x8b")):
    return ("compressed (%s), not text; pass the text (a Wikipedia dump goes through "
            "tools/prepare_wiki.sh)" % ("bzip2" if data.startswith(b"BZh") else "gzip"))
  try:
    next(records.record_iterator(path))
    return "TFRecords (made already), not text; pass the text files they were made from"
  except Exception:  # pylint: disable=broad-except  (not framed as records: text)
    pass
  return "not UTF-8 (bad byte at offset %d); convert it to UTF-8" % offset


def read_documents(input_files, tokenizer, id_dtype):
  """Reads and tokenizes the input files into documents.

  Like Google: every line is stripped, a blank line ends a document, a line without
  tokens is dropped, and documents without sentences are dropped. Unlike Google, the
  end of a file also ends a document.

  Args:
    input_files: list of paths of UTF-8 text files.
    tokenizer: a tokenization.FullTokenizer.
    id_dtype: numpy dtype to keep token ids in.

  Returns:
    (documents, num_input_bytes, num_sentences): list of Document, and counts.

  Raises:
    ValueError: if a file is not valid UTF-8.
  """
  documents = []
  num_input_bytes = 0
  num_sentences = 0
  for path in input_files:
    with tf.io.gfile.GFile(path, "rb") as reader:
      data = reader.read()
    num_input_bytes += len(data)
    try:
      text = data.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError("input file %r is %s" % (path, _not_text(path, data, e.start)))
    # Each non-blank line with the number of the document it belongs to. Google reads
    # lines split on "\n" only, then strips them.
    lines = []
    line_documents = []
    document_number = 0
    for line in text.split("\n"):
      line = line.strip()
      if line:
        lines.append(line)
        line_documents.append(document_number)
      else:
        document_number += 1
    del text, data
    sentences_by_document = [[] for _ in range(document_number + 1)]
    for start in range(0, len(lines), _TOKENIZE_BATCH_LINES):
      batch = lines[start:start + _TOKENIZE_BATCH_LINES]
      for offset, ids in enumerate(tokenizer.tokenize_to_ids(batch)):
        if len(ids):
          sentences_by_document[line_documents[start + offset]].append(ids)
    for sentences in sentences_by_document:
      if not sentences:
        continue
      num_sentences += len(sentences)
      bounds = [0]
      for ids in sentences:
        bounds.append(bounds[-1] + len(ids))
      documents.append(Document(np.concatenate(sentences).astype(id_dtype), bounds))
  return documents, num_input_bytes, num_sentences


def num_tokens_to_truncate(len_a, len_b, max_num_tokens):
  """How many tokens Google's truncate_seq_pair removes from A and from B.

  Google removes one token at a time from the longer segment (from B on a tie) until
  the pair fits; which end each token comes from is a coin flip that does not change
  these counts, so they follow from the lengths alone.

  Args:
    len_a: int, length of segment A.
    len_b: int, length of segment B.
    max_num_tokens: int, the most tokens A and B may hold together.

  Returns:
    (trim_a, trim_b): tokens to remove from A and from B.
  """
  excess = len_a + len_b - max_num_tokens
  if excess <= 0:
    return 0, 0
  gap = abs(len_a - len_b)
  if excess <= gap:
    return (excess, 0) if len_a > len_b else (0, excess)
  # Once the two are equal, B loses a token first and then they alternate.
  rest = excess - gap
  trim_a = rest // 2
  trim_b = rest - trim_a
  if len_a > len_b:
    trim_a += gap
  else:
    trim_b += gap
  return trim_a, trim_b


class NumpyRandom(object):
  """Array draws: numpy's PCG64 Generator, or RandomState on numpy < 1.17 (TF 1.15 era)."""

  def __init__(self, seed):
    """Seeds the generator.

    Args:
      seed: int.
    """
    if hasattr(np.random, "Generator"):
      generator = np.random.Generator(np.random.PCG64(seed))
      self.random = generator.random
      self._raw = generator.bit_generator.random_raw
    else:  # pragma: no cover - numpy < 1.17
      state = np.random.RandomState(seed % 2 ** 32)
      self.random = state.random_sample
      self._raw = lambda shape: state.randint(0, 2 ** 63, size=shape, dtype=np.uint64)

  def random_uint64(self, shape):
    """Returns a uint64 array of `shape` with at least 63 uniform random low bits."""
    return self._raw(shape)


def _randint(rng, low, high):
  """A uniform int in [low, high] from `rng`, like rng.randint but several times cheaper.

  Scaling a 53-bit uniform float changes each outcome's probability by at most
  (high - low + 1) / 2**53, far below anything measurable.
  """
  return low + int(rng.random() * (high - low + 1))


def _trim(tokens, num_to_remove, rng):
  """Removes `num_to_remove` tokens, each from the front or back with probability 1/2."""
  if num_to_remove <= 0:
    return tokens
  # The number of front removals is Binomial(n, 1/2): the set bits of n random bits.
  from_front = bin(rng.getrandbits(num_to_remove)).count("1")
  return tokens[from_front:len(tokens) - (num_to_remove - from_front)]


def create_instances_from_document(documents, document_index, max_seq_length,
                                   short_seq_prob, rng, instances):
  """Cuts one document into (A, B, is_random_next) instances, Google's way.

  Args:
    documents: list of all Document (B may come from another one).
    document_index: int, which document to cut.
    max_seq_length: int, the most tokens of an instance, with [CLS] and two [SEP].
    short_seq_prob: float, probability of a shorter target length for this document.
    rng: random.Random for the draws.
    instances: list to append (tokens_a, tokens_b, is_random_next) to; A and B are
      views of the documents' id arrays.
  """
  document = documents[document_index]
  token_ids = document.token_ids
  bounds = document.sentence_bounds
  num_sentences = len(bounds) - 1
  # Leave room for [CLS], [SEP], [SEP].
  max_num_tokens = max_seq_length - 3
  # Mostly fill the sequence (padding is wasted compute), but sometimes aim shorter to
  # match fine-tuning inputs; as in Google's code, once per document.
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = _randint(rng, 2, max_num_tokens)

  chunk_start = 0
  while chunk_start < num_sentences:
    # The chunk takes sentences until it holds target_seq_length tokens or the
    # document ends: it ends with the first sentence that reaches the target.
    chunk_end = min(bisect.bisect_left(bounds, bounds[chunk_start] + target_seq_length,
                                       chunk_start + 1), num_sentences)
    num_chunk = chunk_end - chunk_start
    # A is a random number of the chunk's leading sentences, so the split is a real
    # sentence boundary and next-sentence prediction is not trivial.
    a_end = chunk_start + (_randint(rng, 1, num_chunk - 1) if num_chunk >= 2 else 1)
    tokens_a = token_ids[bounds[chunk_start]:bounds[a_end]]
    if num_chunk == 1 or rng.random() < 0.5:
      is_random_next = True
      target_b_length = target_seq_length - len(tokens_a)
      # Avoid the same document; ten tries, as Google.
      for _ in range(10):
        random_index = _randint(rng, 0, len(documents) - 1)
        if random_index != document_index:
          break
      other = documents[random_index]
      other_bounds = other.sentence_bounds
      start = _randint(rng, 0, len(other_bounds) - 2)
      end = min(bisect.bisect_left(other_bounds, other_bounds[start] + target_b_length,
                                   start + 1), len(other_bounds) - 1)
      tokens_b = other.token_ids[other_bounds[start]:other_bounds[end]]
      # The chunk's sentences after A were not used: put them back for the next chunk.
      chunk_start = a_end
    else:
      is_random_next = False
      tokens_b = token_ids[bounds[a_end]:bounds[chunk_end]]
      chunk_start = chunk_end

    trim_a, trim_b = num_tokens_to_truncate(len(tokens_a), len(tokens_b), max_num_tokens)
    instances.append((_trim(tokens_a, trim_a, rng), _trim(tokens_b, trim_b, rng),
                      is_random_next))


def assemble_batch(instances, max_seq_length, cls_id, sep_id):
  """Lays instances out as [CLS] A [SEP] B [SEP] rows of a zero-padded id matrix.

  Args:
    instances: list of (tokens_a, tokens_b, is_random_next).
    max_seq_length: int, the row length.
    cls_id: int, id of [CLS].
    sep_id: int, id of [SEP].

  Returns:
    (tokens, lengths, lengths_a, is_random_next): int64 array [batch, max_seq_length],
    int64 arrays [batch] of sequence and A lengths, bool array [batch].
  """
  num_rows = len(instances)
  tokens = np.zeros((num_rows, max_seq_length), dtype=np.int64)
  lengths_a = np.empty(num_rows, dtype=np.int64)
  lengths = np.empty(num_rows, dtype=np.int64)
  is_random_next = np.empty(num_rows, dtype=bool)
  for row, (tokens_a, tokens_b, random_next) in enumerate(instances):
    len_a = len(tokens_a)
    tokens[row, 1:len_a + 1] = tokens_a
    tokens[row, len_a + 2:len_a + 2 + len(tokens_b)] = tokens_b
    lengths_a[row] = len_a
    lengths[row] = len_a + len(tokens_b) + 3
    is_random_next[row] = random_next
  rows = np.arange(num_rows)
  tokens[:, 0] = cls_id
  tokens[rows, lengths_a + 1] = sep_id
  tokens[rows, lengths - 1] = sep_id
  return tokens, lengths, lengths_a, is_random_next


def batch_features(tokens, lengths, lengths_a, positions, labels, counts, is_random_next):
  """A masked batch's features (records.FEATURE_NAMES), for records.serialize_examples.

  Args:
    tokens, lengths, lengths_a, is_random_next: as assemble_batch returns them.
    positions, labels, counts: as MaskedLmMasker.mask_batch returns them.

  Returns:
    dict from each feature name to its [batch, length] array.
  """
  columns = np.arange(tokens.shape[1])
  in_sequence = columns < lengths[:, None]
  return {"input_ids": tokens, "input_mask": in_sequence,
          "segment_ids": in_sequence & (columns >= (lengths_a + 2)[:, None]),
          "masked_lm_positions": positions, "masked_lm_ids": labels,
          "masked_lm_weights": np.arange(positions.shape[1]) < counts[:, None],
          "next_sentence_labels": is_random_next[:, None]}


class MaskedLmMasker(object):
  """Picks and applies the masked LM predictions of a batch of instances, vectorized."""

  def __init__(self, vocab, masked_lm_prob, max_predictions_per_seq, do_whole_word_mask,
               np_rng):
    """Creates the masker.

    Args:
      vocab: dict from token to id (the tokenizer's vocab).
      masked_lm_prob: float, the fraction of tokens to predict.
      max_predictions_per_seq: int, the most predictions per instance.
      do_whole_word_mask: whether to mask all WordPieces of a word together.
      np_rng: NumpyRandom for the draws.
    """
    self.mask_id = vocab["[MASK]"]
    self.masked_lm_prob = masked_lm_prob
    self.max_predictions_per_seq = max_predictions_per_seq
    self.do_whole_word_mask = do_whole_word_mask
    self.np_rng = np_rng
    # Google draws the random replacement from the vocab's distinct tokens.
    self.vocab_ids = np.array(sorted(vocab.values()), dtype=np.int64)
    is_continuation = np.zeros(max(vocab.values()) + 1, dtype=bool)
    for token, token_id in vocab.items():
      if token.startswith("##"):
        is_continuation[token_id] = True
    self.is_continuation = is_continuation
    self._last_keys_cache = None

  def _last_keys(self, seq_length):
    """Sort keys of non-candidates: the top bit, then the column (cached)."""
    if self._last_keys_cache is None or len(self._last_keys_cache) != seq_length:
      self._last_keys_cache = np.uint64(1 << 63) | np.arange(seq_length, dtype=np.uint64)
    return self._last_keys_cache

  def num_to_predict(self, lengths):
    """Google's prediction count per instance: min(max, max(1, round(len * prob))).

    Args:
      lengths: int array of sequence lengths.

    Returns:
      int64 array of the same shape.
    """
    # np.round rounds half to even on the float64 product, exactly as Python's round.
    counts = np.round(np.asarray(lengths, dtype=np.float64) * self.masked_lm_prob)
    return np.minimum(self.max_predictions_per_seq,
                      np.maximum(1, counts)).astype(np.int64)

  def mask_batch(self, tokens, lengths, lengths_a):
    """Masks a batch in place and returns what the model must predict.

    Args:
      tokens: int64 array [batch, max_seq_length] from assemble_batch; modified in place.
      lengths: int64 array [batch], sequence lengths.
      lengths_a: int64 array [batch], A lengths (the middle [SEP] is at len_a + 1).

    Returns:
      (positions, labels, counts): int64 arrays [batch, max_predictions_per_seq] of the
      masked positions (ascending, zero padded) and the original ids there (zero
      padded), and int64 [batch] of how many predictions each row has.
    """
    num_rows, seq_length = tokens.shape
    num_predictions = self.max_predictions_per_seq
    num_to_predict = self.num_to_predict(lengths)
    positions = np.zeros((num_rows, num_predictions), dtype=np.int64)
    if self.do_whole_word_mask:
      counts = np.empty(num_rows, dtype=np.int64)
      for row in range(num_rows):
        chosen = self._choose_whole_words(tokens[row, :lengths[row]], int(lengths_a[row]),
                                          int(num_to_predict[row]))
        positions[row, :len(chosen)] = chosen
        counts[row] = len(chosen)
    else:
      counts = np.minimum(num_to_predict, lengths - 3)
      # Each row's `count` smallest of iid random keys over its candidates are a
      # uniform random subset, as the first `count` of Google's shuffled candidates.
      # A key is 54 random bits above the column's bits, so one plain sort of the keys
      # (much faster than argsort) orders the columns; ties have odds ~2**-54.
      column_bits = max(1, int(seq_length - 1).bit_length())
      columns = np.arange(seq_length, dtype=np.uint64)
      keys = self.np_rng.random_uint64((num_rows, seq_length))
      keys >>= np.uint64(column_bits + 1)
      keys <<= np.uint64(column_bits)
      keys |= columns
      # [CLS], the two [SEP] and the padding sort last: the top bit is theirs alone.
      # (Compared as int32, and copied under a mask: both several times cheaper than
      # uint64 compares and boolean indexing.)
      not_candidate = (np.arange(seq_length, dtype=np.int32) >=
                       (lengths - 1).astype(np.int32)[:, None])
      not_candidate[:, 0] = True
      not_candidate[np.arange(num_rows), lengths_a + 1] = True
      np.copyto(keys, np.broadcast_to(self._last_keys(seq_length), keys.shape),
                where=not_candidate)
      most = int(counts.max())
      keys.sort(axis=1)
      chosen = (keys[:, :most] & np.uint64((1 << column_bits) - 1)).astype(np.int64)
      chosen[np.arange(most) >= counts[:, None]] = seq_length
      chosen.sort(axis=1)
      positions[:, :most] = np.where(chosen < seq_length, chosen, 0)
    valid = np.arange(num_predictions) < counts[:, None]
    labels = np.where(valid, np.take_along_axis(tokens, positions, axis=1), 0)
    # One uniform draw per prediction: < 0.8 [MASK], [0.8, 0.9) keep, >= 0.9 a random
    # token (the draw rescaled from [0.9, 1) to [0, 1) picks which).
    decisions = self.np_rng.random((num_rows, num_predictions))
    rows = np.broadcast_to(np.arange(num_rows)[:, None], positions.shape)
    to_mask = valid & (decisions < 0.8)
    tokens[rows[to_mask], positions[to_mask]] = self.mask_id
    to_random = valid & (decisions >= 0.9)
    picks = ((decisions[to_random] - 0.9) * 10.0 * len(self.vocab_ids)).astype(np.int64)
    np.clip(picks, 0, len(self.vocab_ids) - 1, out=picks)
    tokens[rows[to_random], positions[to_random]] = self.vocab_ids[picks]
    return positions, labels, counts

  def _choose_whole_words(self, tokens, len_a, num_to_predict):
    """Picks whole words to mask in one instance, Google's way.

    A word is a token and the "##" tokens after it. As in Google's code, a "##" token
    right after the middle [SEP] continues the last word of A. Words are visited in
    random order; one that would exceed num_to_predict is skipped, and the visit stops
    once num_to_predict tokens are chosen.

    Args:
      tokens: 1-D int array [CLS] A [SEP] B [SEP], unpadded.
      len_a: int, length of A.
      num_to_predict: int, the most tokens to choose.

    Returns:
      int64 array of the chosen positions, ascending.
    """
    candidates = np.concatenate([np.arange(1, len_a + 1),
                                 np.arange(len_a + 2, len(tokens) - 1)])
    starts_word = ~self.is_continuation[tokens[candidates]]
    starts_word[0] = True
    word_of_candidate = np.cumsum(starts_word) - 1
    word_starts = np.flatnonzero(starts_word)
    word_sizes = np.diff(np.append(word_starts, len(candidates)))
    num_words = len(word_starts)
    order = np.argsort(self.np_rng.random(num_words), kind="stable")
    sizes_in_order = word_sizes[order]
    # Every word before the first one that overflows is taken; after it, one by one.
    running = np.cumsum(sizes_in_order)
    num_prefix = int(np.searchsorted(running, num_to_predict, side="right"))
    selected = np.zeros(num_words, dtype=bool)
    selected[order[:num_prefix]] = True
    total = int(running[num_prefix - 1]) if num_prefix else 0
    if total < num_to_predict:
      for word, size in zip(order[num_prefix + 1:].tolist(),
                            sizes_in_order[num_prefix + 1:].tolist()):
        if total >= num_to_predict:
          break
        if total + size <= num_to_predict:
          selected[word] = True
          total += size
    return candidates[selected[word_of_candidate]]


def _check_arguments(output_files, max_seq_length, max_predictions_per_seq,
                     masked_lm_prob, short_seq_prob, dupe_factor, random_seed):
  """Raises ValueError naming the first bad argument and how to fix it."""
  if not output_files:
    raise ValueError("no output files given; pass --output_file=<path[,path...]>")
  if len(set(output_files)) != len(output_files):
    raise ValueError("an output file is listed twice in %s; list each once" % output_files)
  if max_seq_length < 5:
    raise ValueError("max_seq_length=%d is too small; it must be >= 5 ([CLS] A [SEP] B "
                     "[SEP] with A and B at least one token)" % max_seq_length)
  if not 1 <= max_predictions_per_seq <= max_seq_length:
    raise ValueError("max_predictions_per_seq=%d must be between 1 and max_seq_length=%d"
                     % (max_predictions_per_seq, max_seq_length))
  if not 0.0 < masked_lm_prob <= 1.0:
    raise ValueError("masked_lm_prob=%g must be in (0, 1]; BERT uses 0.15" % masked_lm_prob)
  if not 0.0 <= short_seq_prob <= 1.0:
    raise ValueError("short_seq_prob=%g must be in [0, 1]; BERT uses 0.1" % short_seq_prob)
  if dupe_factor < 1:
    raise ValueError("dupe_factor=%d must be >= 1" % dupe_factor)
  if random_seed < 0:
    raise ValueError("random_seed=%d must be >= 0" % random_seed)


def create_pretraining_data(input_files, output_files, vocab_file, do_lower_case=True,
                            max_seq_length=config.MAX_SEQ_LENGTH,
                            max_predictions_per_seq=config.MAX_PREDICTIONS_PER_SEQ,
                            masked_lm_prob=config.MASKED_LM_PROB,
                            short_seq_prob=config.SHORT_SEQ_PROB,
                            dupe_factor=config.DUPE_FACTOR, random_seed=config.DATA_SEED,
                            do_whole_word_mask=False):
  """Turns text files into BERT pretraining TFRecord files.

  Args:
    input_files: list of paths or glob patterns (or one comma-separated str) of UTF-8
      text files: one sentence a line, a blank line between documents.
    output_files: list of TFRecord paths (or one comma-separated str); instances are
      written round-robin over them. Each is written under a temporary name and renamed
      when complete.
    vocab_file: path of the WordPiece vocab.txt.
    do_lower_case: whether to lower-case and strip accents (uncased models).
    max_seq_length: int, tokens per instance including [CLS] and two [SEP].
    max_predictions_per_seq: int, the most masked LM predictions per instance.
    masked_lm_prob: float, the fraction of tokens to mask.
    short_seq_prob: float, probability of a shorter target length for a document.
    dupe_factor: int, passes over the data (each with different cuts and masks).
    random_seed: int; the same inputs and seed give byte-identical output.
    do_whole_word_mask: whether to mask all WordPieces of a word together.

  Returns:
    dict of statistics: num_input_files, num_input_bytes, num_documents, num_sentences,
    num_input_tokens, num_unknown_tokens, num_instances, num_instance_tokens,
    num_masked_tokens, num_random_next, num_one_sentence_documents, seconds.

  Raises:
    ValueError: on a bad argument or input, with the problem and the fix.
  """
  start_time = time.time()
  output_files = output_paths(output_files)
  _check_arguments(output_files, max_seq_length, max_predictions_per_seq, masked_lm_prob,
                   short_seq_prob, dupe_factor, random_seed)
  input_paths = expand_input_files(input_files)
  clashes = set(os.path.realpath(p) for p in input_paths) & set(
      os.path.realpath(p) for p in output_files)
  if clashes:
    raise ValueError("output file %r is also an input file; write elsewhere"
                     % sorted(clashes)[0])
  if os.path.realpath(vocab_file) in set(os.path.realpath(p) for p in output_files):
    raise ValueError("output file %r is also the vocab file; write elsewhere" % vocab_file)
  tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
  missing = tokenization.missing_special_tokens(tokenizer.vocab)
  if missing:
    raise ValueError("vocab file %r lacks %s; use a BERT vocab with [CLS] [SEP] [MASK] "
                     "[UNK]" % (vocab_file, " ".join(missing)))
  max_id = max(tokenizer.vocab.values())
  id_dtype = np.uint16 if max_id < 2 ** 16 else np.int32

  documents, num_input_bytes, num_sentences = read_documents(input_paths, tokenizer,
                                                             id_dtype)
  if not documents:
    raise ValueError("the input files %s hold no text; give text files with one sentence "
                     "a line" % input_paths)
  logging.info("Read %d documents, %d sentences, %d bytes from %d files",
               len(documents), num_sentences, num_input_bytes, len(input_paths))

  # Scalar draws come from Python's Random (cheap per call), array draws from numpy.
  rng = random.Random(random_seed)
  np_rng = NumpyRandom(random_seed)
  rng.shuffle(documents)
  instances = []
  for _ in range(dupe_factor):
    for document_index in range(len(documents)):
      create_instances_from_document(documents, document_index, max_seq_length,
                                     short_seq_prob, rng, instances)
  rng.shuffle(instances)

  masker = MaskedLmMasker(tokenizer.vocab, masked_lm_prob, max_predictions_per_seq,
                          do_whole_word_mask, np_rng)
  unknown_id = tokenizer.vocab[tokenization.UNK_TOKEN]
  stats = {
      "num_input_files": len(input_paths),
      "num_input_bytes": num_input_bytes,
      "num_documents": len(documents),
      "num_sentences": num_sentences,
      "num_input_tokens": int(sum(len(d.token_ids) for d in documents)),
      "num_unknown_tokens": int(sum(np.count_nonzero(d.token_ids == unknown_id)
                                    for d in documents)),
      "num_instances": len(instances),
      "num_random_next": int(sum(instance[2] for instance in instances)),
      "num_one_sentence_documents": sum(1 for d in documents if d.num_sentences == 1),
  }
  stats.update(write_examples(instances, output_files, masker, tokenizer.vocab["[CLS]"],
                              tokenizer.vocab["[SEP]"], max_seq_length,
                              max_predictions_per_seq))
  stats["seconds"] = time.time() - start_time
  logging.info("Wrote %d instances to %d files: %s", len(instances), len(output_files),
               stats)
  return stats


# Above this share of random next sentences (Google's rules give about half), a warning:
# next-sentence prediction then learns little.
RANDOM_NEXT_WARNING_SHARE = 0.75


def random_next_warning(stats):
  """One line when most instances got a random next sentence, else None.

  Args:
    stats: create_pretraining_data's statistics.
  """
  if not stats["num_instances"] or \
      stats["num_random_next"] <= RANDOM_NEXT_WARNING_SHARE * stats["num_instances"]:
    return None
  return ("%d of %d instances (%.0f%%) have a random next sentence, where documents of "
          "several sentences give about half; %d of the %d documents have one sentence, "
          "whose B always comes from another document: write one sentence a line, with a "
          "blank line between documents only"
          % (stats["num_random_next"], stats["num_instances"],
             100.0 * stats["num_random_next"] / stats["num_instances"],
             stats["num_one_sentence_documents"], stats["num_documents"]))


def write_examples(instances, output_files, masker, cls_id, sep_id, max_seq_length,
                   max_predictions_per_seq):
  """Masks instances and writes them round-robin over TFRecord files.

  Each file is written under a temporary name and renamed when all are complete, so a
  reader never takes a half-written file for a finished one; an error or a signal, also
  between two renames, leaves none of this call's files.

  Args:
    instances: list of (tokens_a, tokens_b, is_random_next), in output order.
    output_files: list of TFRecord paths.
    masker: MaskedLmMasker.
    cls_id: int, id of [CLS].
    sep_id: int, id of [SEP].
    max_seq_length: int, the length token features are padded to.
    max_predictions_per_seq: int, the length masked LM features are padded to.

  Returns:
    dict with num_instance_tokens (tokens before padding) and num_masked_tokens.
  """
  temporary_files = ["%s.tmp-%d" % (path, os.getpid()) for path in output_files]
  for path in output_files:
    directory = os.path.dirname(path)
    if directory and not tf.io.gfile.exists(directory):
      tf.io.gfile.makedirs(directory)
  num_instance_tokens = 0
  num_masked_tokens = 0
  writers = []
  renaming = []  # (temporary, final) of the renames begun
  current = 0  # the file being written: a full disk's line names its folder
  try:
    for current, path in enumerate(temporary_files):
      writers.append(tf.io.TFRecordWriter(path))
    writer_index = 0
    for start in range(0, len(instances), _SERIALIZE_BATCH):
      tokens, lengths, lengths_a, is_random_next = assemble_batch(
          instances[start:start + _SERIALIZE_BATCH], max_seq_length, cls_id, sep_id)
      positions, labels, counts = masker.mask_batch(tokens, lengths, lengths_a)
      num_instance_tokens += int(lengths.sum())
      num_masked_tokens += int(counts.sum())
      for record in records.serialize_examples(batch_features(
          tokens, lengths, lengths_a, positions, labels, counts, is_random_next)):
        current = writer_index
        writers[writer_index].write(record)
        writer_index = (writer_index + 1) % len(writers)
    for current, writer in enumerate(writers):
      writer.close()
    for current, (temporary, final) in enumerate(zip(temporary_files, output_files)):
      renaming.append((temporary, final))  # before: a signal can land as the call returns
      if "://" in final:
        tf.io.gfile.rename(temporary, final, overwrite=True)
      else:
        os.replace(temporary, final)
  except BaseException as e:
    # Every temporary file goes, also when closing one fails again on the full disk; so do
    # the files already renamed (their temporary is gone): part of a set was not asked for.
    for writer in writers:
      try:
        writer.close()
      except tf.errors.OpError:
        pass
    renamed = [final for temporary, final in renaming if not tf.io.gfile.exists(temporary)]
    for temporary in temporary_files + renamed:
      try:
        if tf.io.gfile.exists(temporary):
          tf.io.gfile.remove(temporary)
      except tf.errors.OpError:
        pass
    if (isinstance(e, tf.errors.OpError) and errors.is_disk_full(e) and
        "://" not in output_files[current]):
      raise records.os_error_from_tf(e, output_files[current]) from e
    # The file asked for, not this call's temporary one, which is gone.
    if isinstance(e, OSError) and e.filename == temporary_files[current]:
      raise OSError(e.errno, e.strerror, output_files[current]) from e
    if (isinstance(e, tf.errors.OpError) and type(e) is not tf.errors.OpError and
        temporary_files[current] in (e.message or "")):
      raise type(e)(e.node_def, e.op, e.message.replace(
          temporary_files[current], output_files[current])) from e
    raise
  return {"num_instance_tokens": num_instance_tokens,
          "num_masked_tokens": num_masked_tokens}


def define_flags():
  """Defines the command-line flags (Google's names); only when run as a script."""
  flags.DEFINE_string("input_file", None,
                      "Input text file(s): comma-separated paths or glob patterns.")
  flags.DEFINE_string("output_file", None,
                      "Output TFRecord file(s), comma-separated; written round-robin.")
  flags.DEFINE_string("vocab_file", None, "The WordPiece vocab.txt of the model.")
  flags.DEFINE_bool("do_lower_case", True,
                    "Lower-case and strip accents (True for uncased models).")
  flags.DEFINE_bool("do_whole_word_mask", False,
                    "Mask whole words rather than single WordPieces.")
  flags.DEFINE_integer("max_seq_length", config.MAX_SEQ_LENGTH, "Maximum sequence length.")
  flags.DEFINE_integer("max_predictions_per_seq", config.MAX_PREDICTIONS_PER_SEQ,
                       "Maximum number of masked LM predictions per sequence.")
  flags.DEFINE_integer("random_seed", config.DATA_SEED, "Random seed for data generation.")
  flags.DEFINE_integer("dupe_factor", config.DUPE_FACTOR,
                       "Number of passes over the input (each with different masks).")
  flags.DEFINE_float("masked_lm_prob", config.MASKED_LM_PROB, "Masked LM probability.")
  flags.DEFINE_float("short_seq_prob", config.SHORT_SEQ_PROB,
                     "Probability of a shorter target length for a document.")


def output_paths(output_files):
  """The list of output paths from a list or one comma-separated str."""
  if isinstance(output_files, str):
    return [p.strip() for p in output_files.split(",") if p.strip()]
  return list(output_files)


def check_new_outputs(output_files):
  """Raises ValueError if an output path is taken: the command never replaces records
  an earlier run wrote (the library function does, for the pipelines that own them)."""
  for path in output_paths(output_files):
    if path.endswith("/"):
      raise ValueError("--output_file=%s ends in '/', a folder's name; pass a file path in "
                       "it, e.g. %spart-0" % (path, path))
    if tf.io.gfile.isdir(path):
      raise ValueError("--output_file=%s is a folder; pass a file path in it, e.g. %s"
                       % (path, os.path.join(path, "part-0")))
    if tf.io.gfile.exists(path):
      raise ValueError("--output_file=%s already exists and would be replaced; delete it "
                       "to make it again, or pass another path" % path)
    if "://" in path:
      continue
    reason = errors.unwritable_folder(os.path.dirname(os.path.abspath(path)))
    if reason:
      raise ValueError("--output_file=%s cannot be written: %s" % (path, reason))


def print_summary(stats, vocab_file, do_lower_case):
  """Prints the warnings (to stderr) and the summary line of a finished run."""
  unknown = tokenization.unknown_tokens_warning(
      stats["num_unknown_tokens"], stats["num_input_tokens"],
      tokenization.casing_fix(vocab_file, do_lower_case, "--vocab_file"))
  for warning in (unknown, random_next_warning(stats)):
    if warning:
      print("create_pretraining_data: warning: %s" % warning, file=sys.stderr)
  print("create_pretraining_data: %d instances from %d documents (%.2f MB) in %.1f s, "
        "%d masked tokens" % (stats["num_instances"], stats["num_documents"],
                              stats["num_input_bytes"] / 1e6, stats["seconds"],
                              stats["num_masked_tokens"]))


def main(argv):
  """Runs create_pretraining_data from the flags; exits with one line on bad input or a
  file error (2, as every tool) or a signal (130 for Ctrl-C, 143 for SIGTERM)."""
  if len(argv) > 1:
    errors.unexpected_arguments("create_pretraining_data", argv[1:])
  flag_values = flags.FLAGS
  errors.require_flags("create_pretraining_data", flag_values, (
      ("input_file", "the text files (one sentence a line, documents split by blank lines)"),
      ("output_file", "the TFRecord files to write"),
      ("vocab_file", "the model's vocab.txt")))
  errors.take_stop_signals()
  outputs = output_paths(flag_values.output_file)
  checked = False
  try:
    check_new_outputs(outputs)
    checked = True
    workdir.remove_dead_temporaries(outputs)
    stats = create_pretraining_data(
        input_files=flag_values.input_file,
        output_files=outputs,
        vocab_file=flag_values.vocab_file,
        do_lower_case=flag_values.do_lower_case,
        max_seq_length=flag_values.max_seq_length,
        max_predictions_per_seq=flag_values.max_predictions_per_seq,
        masked_lm_prob=flag_values.masked_lm_prob,
        short_seq_prob=flag_values.short_seq_prob,
        dupe_factor=flag_values.dupe_factor,
        random_seed=flag_values.random_seed,
        do_whole_word_mask=flag_values.do_whole_word_mask)
    print_summary(stats, flag_values.vocab_file, flag_values.do_lower_case)
  except ValueError as e:
    errors.print_error("create_pretraining_data", e)
    return 2
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM's errors.Terminated
    # The outputs were new and a stopped write removes all of them: all there means done.
    written = checked and all(tf.io.gfile.exists(path) for path in outputs)
    return errors.stopped_by_signal(
        "create_pretraining_data", e,
        "its files were written, only the summary was cut short" if written else
        "its files were not written: run the same command again")
  except (EnvironmentError, tf.errors.OpError) as e:
    if not errors.is_file_error(e):
      raise
    errors.print_error("create_pretraining_data", errors.os_error_message(e))
    return 2
  return 0


if __name__ == "__main__":
  define_flags()
  errors.run_main("create_pretraining_data", main)
