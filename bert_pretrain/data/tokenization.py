# coding=utf-8
"""BERT WordPiece tokenization with Google's rules, plus a fast path and vocab building.

The reference classes (BasicTokenizer, WordpieceTokenizer) implement the rules of
google-research/bert's tokenization.py in pure Python:

  1. Clean the text: drop NUL, U+FFFD and control characters, turn every whitespace
     character into a plain space.
  2. Put spaces around CJK ideographs so each one is a word of its own.
  3. Split on whitespace. With do_lower_case, lower-case each word and strip accents
     (NFD, then drop the non-spacing marks).
  4. Split each word into runs of non-punctuation and single punctuation characters.
  5. WordPiece: greedy longest-match-first against the vocab, continuation pieces
     prefixed with "##"; a word longer than 200 characters, or one that cannot be
     covered by vocab pieces, becomes a single "[UNK]".

FullTokenizer.tokenize runs the same rules through the Rust `tokenizers` library when
it is installed. The two agree on every character whose handling does not depend on its
neighbours or on the Unicode tables of either side; FullTokenizer checks each non-ASCII
character once (in a few contexts) and sends any text holding a character on which
they disagree to the reference code, so its output is always Google's. Disagreements
found by scanning all code points: the Greek capital sigma when lower-casing (Python
turns a word-final one into "ς", `tokenizers` into "σ"), unassigned code points (Google
drops them as category Cn, `tokenizers` keeps them), ~500 characters newer than the
Unicode tables compiled into `tokenizers`, and the CJK ideographs U+2B820-U+2B91F
(`tokenizers` does not split them off).

FullTokenizer.tokenize_to_ids is the bulk path of data creation, ~17x faster than the
reference code on English text: on ASCII text Google's rules reduce to one regex split
over all the texts, and each distinct word's WordPiece ids are computed once by the
reference code and cached; other texts go to `tokenizers` in one batch.

build_wordpiece_vocab trains a WordPiece vocab in Google's vocab.txt format.
"""

import collections
import heapq
import itertools
import os
import re
import unicodedata

import numpy as np

try:  # The fast path is optional: without `tokenizers` everything runs the reference code.
  import tokenizers
  from tokenizers import normalizers as hf_normalizers
  from tokenizers import pre_tokenizers as hf_pre_tokenizers
  from tokenizers import models as hf_models
except ImportError:  # pragma: no cover - exercised only where tokenizers is missing
  tokenizers = None

UNK_TOKEN = "[UNK]"
# The special tokens of a vocab built here, in id order; [PAD] must be id 0 because the
# TFRecords pad input_ids with 0.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_INPUT_CHARS_PER_WORD = 200

# On "simple" text Google's rules reduce to: delete the ASCII control characters,
# lower-case, and split into runs of word characters and single punctuation characters
# (anything else separates words). Simple text holds ASCII plus the non-ASCII characters
# that _simple_text_patterns() finds to behave alone as a word, punctuation or space
# character (accented Latin letters, Greek and Cyrillic letters but the capital sigma,
# dashes, curly quotes, ...).
_ASCII_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_ASCII_PUNCTUATION = "!-/:-@\\[-`{-~"
# Non-ASCII blocks searched for simple characters: Latin-1 Supplement, Latin Extended-A
# and -B, Greek and Cyrillic, General Punctuation, Currency Symbols.
_SIMPLE_CANDIDATE_RANGES = ((0xA0, 0x250), (0x370, 0x500), (0x2000, 0x2070),
                            (0x20A0, 0x20C1))
# Joins texts for one regex pass; a private-use character, which is never simple.
_TEXT_SEPARATOR = "\ue000"
_simple_patterns = None
# Bound on the word cache of the ASCII path (a few hundred MB at most).
_WORD_CACHE_MAX_WORDS = 2000000


def convert_to_unicode(text):
  """Returns `text` as str, decoding bytes as UTF-8 (dropping invalid bytes).

  Args:
    text: str or bytes.

  Returns:
    The text as a Python str.

  Raises:
    ValueError: if `text` is neither str nor bytes.
  """
  if isinstance(text, str):
    return text
  if isinstance(text, bytes):
    return text.decode("utf-8", "ignore")
  raise ValueError("convert_to_unicode: unsupported type %s; pass str or bytes"
                   % type(text).__name__)


# Above this share of [UNK] tokens, a warning: BERT's vocabs leave well under 1% of
# Wikipedia unknown, a wrong vocab or the wrong casing most of it.
UNKNOWN_WARNING_SHARE = 0.05


def unknown_tokens_warning(num_unknown, num_tokens, fix):
  """One line when more than UNKNOWN_WARNING_SHARE of a text's tokens are [UNK], else
  None.

  Args:
    num_unknown: the text's [UNK] tokens.
    num_tokens: all its tokens.
    fix: what to pass instead, in the flags of the tool that warns.
  """
  if num_unknown <= UNKNOWN_WARNING_SHARE * num_tokens:
    return None
  return ("%d of the %d tokens of the text (%.0f%%) are [UNK]: the vocab does not fit the "
          "text; %s" % (num_unknown, num_tokens, 100.0 * num_unknown / num_tokens, fix))


def casing_mismatch(vocab_file, do_lower_case, vocab_flag):
  """What to pass when the vocab's casing (a cased vocab has tokens with upper-case
  letters) and do_lower_case disagree; None when they agree or the vocab is unreadable.

  Args:
    vocab_file: the vocab the text is tokenized with.
    do_lower_case: whether it is lower-cased.
    vocab_flag: the tool's flag for the vocab, e.g. "--vocab_file".
  """
  try:
    cased = any(token != token.lower() for token in load_vocab(vocab_file)
                if not (token.startswith("[") and token.endswith("]")))
  except (OSError, ValueError):
    return None
  if not cased and not do_lower_case:
    return ("the vocab is uncased (no upper-case token): pass --do_lower_case=true (the "
            "default), or %s=<a cased vocab.txt>" % vocab_flag)
  if cased and do_lower_case:
    return ("the vocab is cased: pass --do_lower_case=false, or %s=<an uncased vocab.txt>"
            % vocab_flag)
  return None


def casing_fix(vocab_file, do_lower_case, vocab_flag):
  """The fix unknown_tokens_warning names: the casing where the vocab's and
  do_lower_case's disagree (casing_mismatch), else another vocab."""
  return (casing_mismatch(vocab_file, do_lower_case, vocab_flag) or
          "pass %s=<the model's vocab.txt>" % vocab_flag)


def missing_special_tokens(vocab):
  """The SPECIAL_TOKENS but [PAD] (id 0 pads whatever its token) that a vocab
  (load_vocab's dict) lacks, in their order: pretraining writes them and a tokenizer of
  the model needs them."""
  return [token for token in SPECIAL_TOKENS if token != "[PAD]" and token not in vocab]


def load_vocab(vocab_file):
  """Reads a vocab file (one token a line; the line number is the id) into a dict.

  Like Google's, a token listed twice keeps the id of its last line, and ids follow line
  numbers, so the ids stay those of the checkpoint the vocab came with.

  Args:
    vocab_file: path of the vocab.txt file.

  Returns:
    dict from token (str) to id (int), in file order.

  Raises:
    ValueError: if the file is missing or holds no tokens.
  """
  if os.path.isdir(vocab_file):
    inside = os.path.join(vocab_file, "vocab.txt")
    raise ValueError("vocab file %r is a folder; pass the vocab file%s" % (
        vocab_file, ", e.g. %s" % inside if os.path.isfile(inside) else " in it"))
  if not os.path.isfile(vocab_file):
    raise ValueError("vocab file %r does not exist; pass --vocab_file=<path to vocab.txt>"
                     % (vocab_file,))
  vocab = {}
  with open(vocab_file, "rb") as reader:
    for index, line in enumerate(reader):
      vocab[convert_to_unicode(line).strip()] = index
  if not vocab:
    raise ValueError("vocab file %r is empty; it needs one WordPiece token a line"
                     % (vocab_file,))
  return vocab


def convert_by_vocab(vocab, items):
  """Maps each item through `vocab` (tokens to ids or ids to tokens).

  Args:
    vocab: dict to look items up in.
    items: iterable of keys of `vocab`.

  Returns:
    list of the mapped values.

  Raises:
    ValueError: naming the first item that is not in `vocab`.
  """
  try:
    return [vocab[item] for item in items]
  except KeyError as e:
    raise ValueError("%r is not in the vocab; use a vocab that contains it" % (e.args[0],))


def whitespace_tokenize(text):
  """Strips `text` and splits it on whitespace.

  Args:
    text: str.

  Returns:
    list of str, the whitespace-separated words.
  """
  return text.split()


def _is_whitespace(char):
  """Whether `char` is whitespace: space, \\t, \\n, \\r or Unicode category Zs."""
  # \t, \n and \r are control characters in Unicode, but BERT treats them as spaces.
  if char in (" ", "\t", "\n", "\r"):
    return True
  return unicodedata.category(char) == "Zs"


def _is_control(char):
  """Whether `char` is a control character (any Unicode category C*, except \\t\\n\\r)."""
  if char in ("\t", "\n", "\r"):
    return False
  return unicodedata.category(char).startswith("C")


def _is_punctuation(char):
  """Whether `char` is punctuation: ASCII non-alphanumeric symbols or Unicode P*."""
  cp = ord(char)
  # Characters such as "^", "$" and "`" are not Unicode punctuation, but BERT treats
  # every non-letter, non-digit, non-space ASCII character as punctuation.
  if (33 <= cp <= 47) or (58 <= cp <= 64) or (91 <= cp <= 96) or (123 <= cp <= 126):
    return True
  return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp):
  """Whether code point `cp` is a CJK Unified Ideograph (the blocks BERT splits on).

  Hiragana, katakana and hangul are not in these blocks: they stay words written with
  spaces, like Latin text.
  """
  return ((0x4E00 <= cp <= 0x9FFF) or (0x3400 <= cp <= 0x4DBF) or
          (0x20000 <= cp <= 0x2A6DF) or (0x2A700 <= cp <= 0x2B73F) or
          (0x2B740 <= cp <= 0x2B81F) or (0x2B820 <= cp <= 0x2CEAF) or
          (0xF900 <= cp <= 0xFAFF) or (0x2F800 <= cp <= 0x2FA1F))


def _simple_text_patterns():
  """Finds the simple characters and returns regexes for the simple-text path.

  A non-ASCII character is simple if, next to ASCII letters, both BasicTokenizers treat
  it as a space, as a punctuation mark they keep unchanged, or as part of the word,
  where lower-casing maps it to one simple word character and does not depend on its
  neighbours. Found with this Python's own Unicode tables, so it always agrees with the
  reference code.

  Returns:
    (not_simple, words): compiled regexes; not_simple finds a character outside simple
    text, words.findall splits simple text into words, punctuation and _TEXT_SEPARATOR.
  """
  global _simple_patterns
  if _simple_patterns is not None:
    return _simple_patterns
  lower = BasicTokenizer(do_lower_case=True)
  cased = BasicTokenizer(do_lower_case=False)
  spaces, punctuation, words = [], [], set()
  for start, end in _SIMPLE_CANDIDATE_RANGES:
    for char in map(chr, range(start, end)):
      probe = "a" + char + "a"
      as_lower = lower.tokenize(probe)
      as_cased = cased.tokenize(probe)
      if as_lower == as_cased == ["a", "a"]:
        spaces.append(char)
      elif as_lower == as_cased == ["a", char, "a"] and _is_punctuation(char):
        punctuation.append(char)
      elif (as_cased == [probe] and len(as_lower) == 1 and char != "\u03a3" and
            len(char.lower()) == 1 and char.lower().lower() == char.lower() and
            unicodedata.category(char)[0] in "LNS"):
        words.add(char)
  # Lower-casing must stay within the word characters the regex knows.
  words = sorted(c for c in words if c.lower() in words or c.lower().isascii())
  allowed = "".join(spaces + punctuation + words)
  not_simple = re.compile("[^\x00-\x7f%s]" % allowed)
  word_re = re.compile("[A-Za-z0-9%s]+|[%s%s]|%s" % (
      "".join(words), _ASCII_PUNCTUATION, "".join(punctuation), _TEXT_SEPARATOR))
  _simple_patterns = (not_simple, word_re)
  return _simple_patterns


class BasicTokenizer(object):
  """Google's pre-WordPiece step: cleaning, CJK splitting, lower case, punctuation."""

  def __init__(self, do_lower_case=True):
    """Creates the tokenizer.

    Args:
      do_lower_case: whether to lower-case and strip accents (uncased models).
    """
    self.do_lower_case = do_lower_case

  def tokenize(self, text):
    """Splits `text` into words and punctuation marks.

    Args:
      text: str or UTF-8 bytes.

    Returns:
      list of str tokens (before WordPiece).
    """
    text = self._clean_text(convert_to_unicode(text))
    text = self._tokenize_chinese_chars(text)
    split_tokens = []
    for token in whitespace_tokenize(text):
      if self.do_lower_case:
        token = self._run_strip_accents(token.lower())
      split_tokens.extend(self._run_split_on_punc(token))
    return whitespace_tokenize(" ".join(split_tokens))

  def _run_strip_accents(self, text):
    """Decomposes `text` (NFD) and drops the non-spacing marks (accents)."""
    return "".join(c for c in unicodedata.normalize("NFD", text)
                   if unicodedata.category(c) != "Mn")

  def _run_split_on_punc(self, text):
    """Splits `text` so every punctuation character is a token of its own."""
    pieces = []
    start_new_word = True
    for char in text:
      if _is_punctuation(char):
        pieces.append(char)
        start_new_word = True
      else:
        if start_new_word:
          pieces.append("")
        start_new_word = False
        pieces[-1] += char
    return pieces

  def _tokenize_chinese_chars(self, text):
    """Puts spaces around every CJK ideograph in `text`."""
    output = []
    for char in text:
      if _is_chinese_char(ord(char)):
        output.extend((" ", char, " "))
      else:
        output.append(char)
    return "".join(output)

  def _clean_text(self, text):
    """Drops NUL, U+FFFD and control characters; maps whitespace to a space."""
    output = []
    for char in text:
      cp = ord(char)
      if cp == 0 or cp == 0xFFFD or _is_control(char):
        continue
      output.append(" " if _is_whitespace(char) else char)
    return "".join(output)


class WordpieceTokenizer(object):
  """Greedy longest-match-first WordPiece, as in Google's BERT."""

  def __init__(self, vocab, unk_token=UNK_TOKEN,
               max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD):
    """Creates the tokenizer.

    Args:
      vocab: dict (or set) of the WordPiece tokens.
      unk_token: token emitted for a word that cannot be split into vocab pieces.
      max_input_chars_per_word: words longer than this become `unk_token` whole.
    """
    self.vocab = vocab
    self.unk_token = unk_token
    self.max_input_chars_per_word = max_input_chars_per_word

  def tokenize(self, text):
    """Splits already basic-tokenized `text` into WordPiece tokens.

    For example "unaffable" -> ["un", "##aff", "##able"].

    Args:
      text: str, words separated by whitespace (the output of BasicTokenizer joined).

    Returns:
      list of WordPiece token strings.
    """
    output_tokens = []
    for token in whitespace_tokenize(convert_to_unicode(text)):
      if len(token) > self.max_input_chars_per_word:
        output_tokens.append(self.unk_token)
        continue
      sub_tokens = []
      start = 0
      while start < len(token):
        end = len(token)
        current_piece = None
        while start < end:
          piece = token[start:end]
          if start > 0:
            piece = "##" + piece
          if piece in self.vocab:
            current_piece = piece
            break
          end -= 1
        if current_piece is None:
          # One uncovered character makes the whole word unknown, not just that piece.
          sub_tokens = [self.unk_token]
          break
        sub_tokens.append(current_piece)
        start = end
      output_tokens.extend(sub_tokens)
    return output_tokens


def _make_fast_tokenizer(vocab, do_lower_case):
  """Builds a `tokenizers.Tokenizer` configured like Google's BERT tokenization.

  Args:
    vocab: dict from token to id (as returned by load_vocab).
    do_lower_case: whether to lower-case and strip accents.

  Returns:
    a tokenizers.Tokenizer, or None when `tokenizers` is not installed or the vocab has
    no "[UNK]" (the Rust WordPiece needs it; the reference code then does the work).
  """
  if tokenizers is None or UNK_TOKEN not in vocab:
    return None
  fast = tokenizers.Tokenizer(hf_models.WordPiece(
      vocab=dict(vocab), unk_token=UNK_TOKEN,
      max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
  fast.normalizer = hf_normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case,
      lowercase=do_lower_case)
  fast.pre_tokenizer = hf_pre_tokenizers.BertPreTokenizer()
  return fast


class FullTokenizer(object):
  """Google's end-to-end BERT tokenizer (basic + WordPiece), fast where possible."""

  def __init__(self, vocab_file, do_lower_case=True, use_fast=True):
    """Loads the vocab and sets up the tokenizers.

    Args:
      vocab_file: path of a vocab.txt (one token a line).
      do_lower_case: whether to lower-case and strip accents (uncased models).
      use_fast: whether to use the `tokenizers` fast path when it is installed.

    Raises:
      ValueError: if the vocab file is missing or empty.
    """
    self.vocab = load_vocab(vocab_file)
    self.inv_vocab = {v: k for k, v in self.vocab.items()}
    self.do_lower_case = do_lower_case
    self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
    self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)
    self._fast = _make_fast_tokenizer(self.vocab, do_lower_case) if use_fast else None
    # Per non-ASCII character: True if the fast path handles it as the reference does.
    self._char_is_safe = {}
    # Word -> WordPiece ids, for the ASCII path of tokenize_to_ids.
    self._word_ids_cache = {}

  @property
  def has_fast_path(self):
    """Whether the `tokenizers` fast path is in use."""
    return self._fast is not None

  def reference_tokenize(self, text):
    """Tokenizes `text` with the pure-Python reference rules.

    Args:
      text: str or UTF-8 bytes.

    Returns:
      list of WordPiece token strings.
    """
    split_tokens = []
    for token in self.basic_tokenizer.tokenize(text):
      split_tokens.extend(self.wordpiece_tokenizer.tokenize(token))
    return split_tokens

  def _fast_pre_tokens(self, text):
    """Returns the words the fast path hands to WordPiece for `text`."""
    normalized = self._fast.normalizer.normalize_str(text)
    return [word for word, _ in self._fast.pre_tokenizer.pre_tokenize_str(normalized)]

  def _is_safe_char(self, char):
    """Whether the fast path treats `char` as the reference does (cached per char)."""
    safe = self._char_is_safe.get(char)
    if safe is None:
      # Compare alone and next to letters, which catches context rules such as Python's
      # final sigma as well as differing Unicode tables.
      safe = all(self._fast_pre_tokens(probe) == self.basic_tokenizer.tokenize(probe)
                 for probe in (char, "A" + char, char + "A", "A" + char + "A",
                               "a" + char + "a"))
      self._char_is_safe[char] = safe
    return safe

  def can_use_fast_path(self, text):
    """Whether the fast path gives the reference tokens for `text`.

    Args:
      text: str.

    Returns:
      bool: True when the fast path is on and every character of `text` is handled
      alike by both implementations.
    """
    if self._fast is None:
      return False
    if text.isascii():
      return True
    return all(self._is_safe_char(c) for c in set(text) if ord(c) > 127)

  def tokenize(self, text):
    """Tokenizes `text` into WordPiece tokens with Google's rules.

    Args:
      text: str or UTF-8 bytes.

    Returns:
      list of WordPiece token strings.
    """
    text = convert_to_unicode(text)
    if self.can_use_fast_path(text):
      return self._fast.encode(text, add_special_tokens=False).tokens
    return self.reference_tokenize(text)

  def tokenize_to_ids(self, texts):
    """Tokenizes many texts straight to ids; the bulk path of data creation.

    Simple texts (ASCII, accented letters, common punctuation; see
    _simple_text_patterns) take a pure-Python path: Google's rules reduce to deleting
    control characters, lower-casing, and one regex split over all the texts, and each
    distinct word's ids are computed once by the reference code and cached. On English
    this is ~4x faster than the Rust tokenizer, whose per-token overhead dominates.
    Other texts go to the Rust tokenizer in one batch, or to the reference code if they
    hold a character on which the two disagree.

    Args:
      texts: list of str.

    Returns:
      list (one entry per text) of int32 numpy arrays of token ids.
    """
    not_simple = _simple_text_patterns()[0]
    results = [None] * len(texts)
    simple_indices = []
    fast_indices = []
    for index, text in enumerate(texts):
      if not not_simple.search(text):
        simple_indices.append(index)
      elif self.can_use_fast_path(text):
        fast_indices.append(index)
      else:
        results[index] = np.array(
            self.convert_tokens_to_ids(self.reference_tokenize(text)), dtype=np.int32)
    if simple_indices:
      for index, ids in zip(simple_indices,
                            self._simple_to_ids([texts[i] for i in simple_indices])):
        results[index] = ids
    if fast_indices:
      encode_batch = getattr(self._fast, "encode_batch_fast", self._fast.encode_batch)
      encodings = encode_batch([texts[i] for i in fast_indices], add_special_tokens=False)
      for index, encoding in zip(fast_indices, encodings):
        results[index] = np.array(encoding.ids, dtype=np.int32)
    return results

  def _simple_to_ids(self, texts):
    """Google's tokenization of simple texts, as int32 id arrays (see tokenize_to_ids).

    All texts are joined and split by one regex pass, so the per-text Python work is a
    few slices.
    """
    word_re = _simple_text_patterns()[1]
    cache = self._word_ids_cache
    if len(cache) > _WORD_CACHE_MAX_WORDS:
      cache.clear()
    # The separator is a word of its own for the regex; its "ids" mark where each text
    # ends.
    cache[_TEXT_SEPARATOR] = [-1]
    joined = _TEXT_SEPARATOR.join(texts)
    if _ASCII_CONTROL_RE.search(joined):  # Rare, so only then pay for a second pass.
      joined = _ASCII_CONTROL_RE.sub("", joined)
    if self.do_lower_case:
      joined = joined.lower()
    words = word_re.findall(joined)
    for word in set(words).difference(cache):
      # An ASCII word is already lower-cased (if asked) and free of punctuation.
      pieces = (self.wordpiece_tokenizer.tokenize(word) if word.isascii() else
                self.reference_tokenize(word))
      cache[word] = self.convert_tokens_to_ids(pieces)
    flat = np.array(list(itertools.chain.from_iterable(map(cache.__getitem__, words))),
                    dtype=np.int32)
    separators = np.flatnonzero(flat == -1).tolist()
    starts = [0] + [i + 1 for i in separators]
    ends = separators + [len(flat)]
    return [flat[start:end] for start, end in zip(starts, ends)]

  def convert_tokens_to_ids(self, tokens):
    """Maps WordPiece tokens to their vocab ids.

    Args:
      tokens: iterable of token strings.

    Returns:
      list of int ids.

    Raises:
      ValueError: naming a token that is not in the vocab.
    """
    return convert_by_vocab(self.vocab, tokens)

  def convert_ids_to_tokens(self, ids):
    """Maps vocab ids back to WordPiece tokens.

    Args:
      ids: iterable of ints.

    Returns:
      list of token strings.

    Raises:
      ValueError: naming an id that is not in the vocab.
    """
    return convert_by_vocab(self.inv_vocab, [int(i) for i in ids])


def build_wordpiece_vocab(text_files, vocab_size, output_file, do_lower_case=True):
  """Trains a WordPiece vocab on text files and writes it as a Google vocab.txt.

  The same text always gives the same vocab (the `tokenizers` trainer breaks ties in
  hash order, so it gave a different vocab, and different training data, on each run).
  The special tokens come first, [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0..4), then the
  characters, then the learned pieces in the order they were learned; one token a line.

  Args:
    text_files: list of paths of UTF-8 text files.
    vocab_size: the largest vocab wanted (a small corpus may yield fewer tokens).
    output_file: where to write the vocab; written to a temporary name, then renamed.
    do_lower_case: whether to lower-case and strip accents, as the tokenizer will.

  Returns:
    the number of tokens written.

  Raises:
    ValueError: on a missing text file or too small a vocab_size.
  """
  if isinstance(text_files, str):
    text_files = [text_files]
  if not text_files:
    raise ValueError("build_wordpiece_vocab: no text files given; pass at least one")
  for path in text_files:
    if not os.path.isfile(path):
      raise ValueError("text file %r does not exist; pass existing UTF-8 text files"
                       % (path,))
  if vocab_size < len(SPECIAL_TOKENS) + 1:
    raise ValueError("vocab_size=%d is too small; it must exceed the %d special tokens"
                     % (vocab_size, len(SPECIAL_TOKENS)))
  basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
  word_counts = collections.Counter()
  for path in text_files:
    with open(path, encoding="utf-8") as reader:
      for line in reader:
        word_counts.update(basic_tokenizer.tokenize(line))
  tokens = _learn_wordpieces(word_counts, vocab_size - len(SPECIAL_TOKENS))
  tokens = list(SPECIAL_TOKENS) + [t for t in tokens if t not in SPECIAL_TOKENS]
  tmp_file = "%s.tmp-%d" % (output_file, os.getpid())
  with open(tmp_file, "w", encoding="utf-8") as writer:
    for token in tokens:
      writer.write(token + "\n")
  os.replace(tmp_file, output_file)
  return len(tokens)


def _learn_wordpieces(word_counts, size):
  """Learns up to `size` WordPiece tokens from word counts, deterministically.

  Each word starts as its characters, continuation ones prefixed with "##" ("cat" ->
  c ##a ##t). The characters come first, the most frequent first if they do not all
  fit. Then, as BPE and the `tokenizers` WordPiece trainer do, the adjacent pair of
  pieces seen most often over all words is merged into one piece, again and again;
  ties go to the pair whose merged text sorts first.

  Args:
    word_counts: dict from word (str, after BasicTokenizer) to its count.
    size: the largest number of tokens wanted.

  Returns:
    list of str tokens in id order.
  """
  words = sorted(w for w in word_counts if len(w) <= MAX_INPUT_CHARS_PER_WORD)
  counts = [word_counts[w] for w in words]
  pieces = [[w[0]] + ["##" + c for c in w[1:]] for w in words]
  char_counts = collections.Counter()
  for word_pieces, count in zip(pieces, counts):
    for piece in word_pieces:
      char_counts[piece] += count
  by_frequency = sorted(char_counts, key=lambda piece: (-char_counts[piece], piece))
  vocab = sorted(by_frequency[:size])
  known = set(vocab)
  # Words with a character left out cannot be covered; they take no part in merging.
  kept = [i for i, word_pieces in enumerate(pieces) if known.issuperset(word_pieces)]

  def merged(pair):
    return pair[0] + pair[1][2:]

  pair_counts = collections.Counter()
  pair_words = collections.defaultdict(set)  # Pair -> indexes of words that may hold it.
  for i in kept:
    for pair in zip(pieces[i], pieces[i][1:]):
      pair_counts[pair] += counts[i]
      pair_words[pair].add(i)
  heap = [(-count, merged(pair), pair) for pair, count in pair_counts.items()]
  heapq.heapify(heap)
  while len(vocab) < size and heap:
    negative_count, token, pair = heapq.heappop(heap)
    count = pair_counts.get(pair, 0)
    if count != -negative_count:
      # Stale: the pair's count fell since this entry was pushed (a rise pushes a new
      # entry, so entries are never below the count). Back in line at its count.
      if count > 0:
        heapq.heappush(heap, (-count, token, pair))
      continue
    before = {}  # Pair -> its count before this merge, for the pairs it changes.
    for i in pair_words.pop(pair):
      old = pieces[i]
      new, j = [], 0
      while j < len(old):
        if j + 1 < len(old) and (old[j], old[j + 1]) == pair:
          new.append(token)
          j += 2
        else:
          new.append(old[j])
          j += 1
      if len(new) == len(old):
        continue
      for other in zip(old, old[1:]):
        before.setdefault(other, pair_counts[other])
        pair_counts[other] -= counts[i]
      for other in zip(new, new[1:]):
        before.setdefault(other, pair_counts[other])
        pair_counts[other] += counts[i]
        pair_words[other].add(i)
      pieces[i] = new
    for other, count in before.items():
      if pair_counts[other] <= 0:
        del pair_counts[other]
      elif pair_counts[other] > count:
        heapq.heappush(heap, (-pair_counts[other], merged(other), other))
    if token not in known:
      known.add(token)
      vocab.append(token)
  return vocab
