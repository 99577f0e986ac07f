# coding=utf-8
"""Tests of bert_pretrain.data.tokenization: Google's rules, the fast paths, vocab building."""

import os
import random
import unicodedata

import pytest

from bert_pretrain.data import tokenization

SAMPLE_TEXT = os.path.join(os.path.dirname(__file__), "data", "sample_text.txt")

# Text that exercises every rule: accents, punctuation runs, CJK, control characters,
# tabs and newlines, unknown and very long words, emoji, mixed case, other scripts.
TRICKY_TEXTS = [
    "Café naïve Ångström résumé façade Œuvre ØRSTED",
    "Hello!!! What?!... (yes) [no] {maybe} \"quoted\" 'single' a--b a_b #tag @you",
    "$100.00 + 5% = ~`^|\\ <tag/> a&b;c:d",
    "我爱北京天安门。中文，标点！",
    "Mixed 中文 and English多字节 text",
    "null\x00byte bell\x07 del\x7f repl\ufffd zero\u200bwidth bom\ufeffmark",
    "tab\tseparated\nnew line\r\ncarriage\x0bvt\x0cff\x1cfs",
    "non\u00a0breaking\u2003em\u3000ideographic\u2028line\u2029para",
    "xyzzyplugh qwrtpsdfgh unaffable unwanted",
    "a" * 199 + " " + "b" * 200 + " " + "c" * 201,
    "emoji 😀 🥲🫠 👍🏽 family 👨‍👩‍👧 flag 🇯🇵",
    "MiXeD CaSe WoRdS ALLCAPS lowercase",
    "İstanbul ǅemal ﬁnance Straße ǈ",
    "Ελληνικά Русский текст עברית العربية हिन्दी",
    "한국어 カタカナ ひらがな ｆｕｌｌｗｉｄｔｈ",
    "e\u0301 combining K\u0301 a\u0308\u0304 stacked",
    "",
    "   \t\n  ",
]
# Text on which the Rust tokenizer disagrees with Google's rules: lower-casing, Python
# turns a word-final capital sigma into "ς", the Rust tokenizer into "σ"; U+0378 is unassigned, and
# Google drops it (category Cn) while the Rust tokenizer keeps it.
DISAGREEMENT_TEXTS = ["ΟΔΟΣ ΣΟΦΙΑ", "a\u0378b"]


def _write_lines(path, lines):
  with open(path, "w", encoding="utf-8") as f:
    for line in lines:
      f.write(line + "\n")
  return str(path)


def _char_vocab(texts, do_lower_case):
  """A vocab holding every character (alone and as "##c") of the texts' basic tokens.

  With it no ordinary word is [UNK], so fast and reference paths are compared on the
  actual characters rather than on [UNK]. do_lower_case None covers both modes.
  """
  modes = (True, False) if do_lower_case is None else (do_lower_case,)
  chars = set()
  for mode in modes:
    basic = tokenization.BasicTokenizer(do_lower_case=mode)
    for text in texts:
      for token in basic.tokenize(text):
        chars.update(token)
  tokens = list(tokenization.SPECIAL_TOKENS) + ["hello", "##llo", "un", "##aff", "##able"]
  for c in sorted(chars):
    tokens += [c, "##" + c]
  # "c" * 201 must still be [UNK] for being too long, not for a missing piece.
  return tokens


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def char_tokenizer(request, tmp_path_factory):
  do_lower_case = request.param
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  sample = open(SAMPLE_TEXT, encoding="utf-8").read().split("\n")
  _write_lines(path, _char_vocab(TRICKY_TEXTS + DISAGREEMENT_TEXTS + sample,
                                 do_lower_case))
  return tokenization.FullTokenizer(str(path), do_lower_case=do_lower_case)


def test_basic_tokenizer_google_examples():
  lower = tokenization.BasicTokenizer(do_lower_case=True)
  assert lower.tokenize(" \tHeLLo!how  \n Are yoU?  ") == [
      "hello", "!", "how", "are", "you", "?"]
  assert lower.tokenize("H\u00e9llo") == ["hello"]
  assert lower.tokenize("ah\u535a\u63a8zz") == ["ah", "\u535a", "\u63a8", "zz"]
  cased = tokenization.BasicTokenizer(do_lower_case=False)
  assert cased.tokenize(" \tHeLLo!how  \n Are yoU?  ") == [
      "HeLLo", "!", "how", "Are", "yoU", "?"]
  # Cased keeps accents.
  assert cased.tokenize("H\u00e9llo") == ["H\u00e9llo"]


def test_wordpiece_google_examples():
  vocab = {t: i for i, t in enumerate(
      ["[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing"])}
  wordpiece = tokenization.WordpieceTokenizer(vocab=vocab)
  assert wordpiece.tokenize("") == []
  assert wordpiece.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
  # One uncovered piece makes the whole word unknown.
  assert wordpiece.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]


def test_character_classes():
  assert tokenization._is_whitespace(" ") and tokenization._is_whitespace("\t")
  assert tokenization._is_whitespace("\u00a0") and not tokenization._is_whitespace("A")
  assert tokenization._is_control("\x05") and not tokenization._is_control("\t")
  assert not tokenization._is_control("A")
  assert tokenization._is_punctuation("-") and tokenization._is_punctuation("$")
  assert tokenization._is_punctuation("`") and tokenization._is_punctuation("\u3002")
  assert not tokenization._is_punctuation("A") and not tokenization._is_punctuation(" ")


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_fast_tokenizer_equals_reference(char_tokenizer, text):
  reference = char_tokenizer.reference_tokenize(text)
  assert char_tokenizer.tokenize(text) == reference
  ids = char_tokenizer.convert_tokens_to_ids(reference)
  assert char_tokenizer.tokenize_to_ids([text])[0].tolist() == ids
  raw = char_tokenizer._fast.encode(text, add_special_tokens=False).tokens
  if all(unicodedata.category(c) != "Cn" for c in text):
    # These texts need no fallback: the Rust tokenizer itself gives Google's tokens.
    assert char_tokenizer.can_use_fast_path(text)
    assert raw == reference
  else:
    # Characters newer than this Python's Unicode tables (Python 3.7 has Unicode 11, so
    # the emoji 🥲 and 🫠 are unassigned): Google's rules drop them, the Rust tokenizer
    # keeps them, and the text goes to the reference code.
    assert not char_tokenizer.can_use_fast_path(text)
    assert raw != reference


def test_tricky_text_tokens(char_tokenizer):
  tokens = char_tokenizer.tokenize("Café\x00 我爱 a--b " + "c" * 201)
  if char_tokenizer.do_lower_case:
    assert tokens == ["c", "##a", "##f", "##e", "我", "爱", "a", "-", "-", "b", "[UNK]"]
  else:
    assert tokens == ["C", "##a", "##f", "##é", "我", "爱", "a", "-", "-", "b", "[UNK]"]


def test_known_disagreements_fall_back_to_reference(char_tokenizer):
  # Without lower-casing the sigma is no problem.
  texts = DISAGREEMENT_TEXTS if char_tokenizer.do_lower_case else DISAGREEMENT_TEXTS[1:]
  for text in texts:
    assert not char_tokenizer.can_use_fast_path(text)
    raw = char_tokenizer._fast.encode(text, add_special_tokens=False).tokens
    assert raw != char_tokenizer.reference_tokenize(text)
    assert char_tokenizer.tokenize(text) == char_tokenizer.reference_tokenize(text)
    ids = char_tokenizer.tokenize_to_ids([text])[0].tolist()
    assert ids == char_tokenizer.convert_tokens_to_ids(
        char_tokenizer.reference_tokenize(text))
  if char_tokenizer.do_lower_case:
    assert char_tokenizer.tokenize("ΟΔΟΣ") == ["ο", "##δ", "##ο", "##ς"]


def test_tokenize_to_ids_on_random_ascii(char_tokenizer):
  rng = random.Random(0)
  texts = ["".join(chr(rng.randrange(128)) for _ in range(rng.randrange(60)))
           for _ in range(1500)]
  texts += ["".join(rng.choice("ab ,.\t\x01\x7f\x1c\x0bZ_") for _ in range(20))
            for _ in range(500)]
  texts += TRICKY_TEXTS
  texts += open(SAMPLE_TEXT, encoding="utf-8").read().split("\n")
  results = char_tokenizer.tokenize_to_ids(texts)
  assert len(results) == len(texts)
  for text, ids in zip(texts, results):
    expected = char_tokenizer.convert_tokens_to_ids(char_tokenizer.reference_tokenize(text))
    assert ids.tolist() == expected, repr(text)


def test_simple_text_path_on_random_text(tmp_path):
  """Random strings of ASCII and every "simple" character: bulk ids equal the reference."""
  not_simple, _ = tokenization._simple_text_patterns()
  simple = [chr(cp) for start, end in tokenization._SIMPLE_CANDIDATE_RANGES
            for cp in range(start, end) if not not_simple.search(chr(cp))]
  assert len(simple) > 800
  for char in "“”‘’–—…«»éèüßçñøæœ€°×Жжωσς\u00a0\u2009":
    assert char in simple, repr(char)
  # Word-final sigma, combining marks, soft hyphen, bidi controls: not simple.
  for char in "Σ\u0301\u00ad\u200b\u202a":
    assert char not in simple, repr(char)
  rng = random.Random(1)
  pool = simple + [chr(i) for i in range(128)] * 3
  texts = ["".join(rng.choice(pool) for _ in range(rng.randrange(40))) for _ in range(1500)]
  path = _write_lines(tmp_path / "vocab.txt", _char_vocab(simple, None))
  for do_lower_case in (True, False):
    tokenizer = tokenization.FullTokenizer(path, do_lower_case=do_lower_case)
    assert all(not not_simple.search(text) for text in texts)
    for text, ids in zip(texts, tokenizer.tokenize_to_ids(texts)):
      expected = tokenizer.convert_tokens_to_ids(tokenizer.reference_tokenize(text))
      assert ids.tolist() == expected, repr(text)


def test_long_words(char_tokenizer):
  assert char_tokenizer.tokenize("a" * 201) == ["[UNK]"]
  tokens = char_tokenizer.tokenize("a" * 200)
  assert tokens == ["a"] + ["##a"] * 199


def test_unknown_word_is_one_unk(char_tokenizer):
  # "\u2603" (snowman) is not in the vocab, so the whole word is [UNK].
  assert char_tokenizer.tokenize("hello snow\u2603man hello") == [
      "hello", "[UNK]", "hello"]


def test_ids_round_trip_and_errors(char_tokenizer):
  tokens = char_tokenizer.tokenize("hello unaffable")
  ids = char_tokenizer.convert_tokens_to_ids(tokens)
  assert char_tokenizer.convert_ids_to_tokens(ids) == tokens
  with pytest.raises(ValueError, match="'not-a-token' is not in the vocab"):
    char_tokenizer.convert_tokens_to_ids(["not-a-token"])
  with pytest.raises(ValueError, match="is not in the vocab"):
    char_tokenizer.convert_ids_to_tokens([10 ** 6])


def test_reference_only_tokenizer_matches(tmp_path):
  path = _write_lines(tmp_path / "vocab.txt", _char_vocab(TRICKY_TEXTS, True))
  slow = tokenization.FullTokenizer(path, use_fast=False)
  fast = tokenization.FullTokenizer(path)
  assert not slow.has_fast_path and fast.has_fast_path
  for text in TRICKY_TEXTS:
    assert slow.tokenize(text) == fast.tokenize(text)
    assert slow.tokenize_to_ids([text])[0].tolist() == fast.tokenize_to_ids([text])[0].tolist()


def test_convert_to_unicode():
  assert tokenization.convert_to_unicode("abc") == "abc"
  assert tokenization.convert_to_unicode("caf\u00e9".encode("utf-8")) == "caf\u00e9"
  assert tokenization.convert_to_unicode(b"a\xffb") == "ab"
  with pytest.raises(ValueError, match="unsupported type int"):
    tokenization.convert_to_unicode(3)


def test_load_vocab(tmp_path):
  path = _write_lines(tmp_path / "vocab.txt", ["[PAD]", "a", "b", "a"])
  # A repeated token keeps the id of its last line; ids follow line numbers.
  assert tokenization.load_vocab(path) == {"[PAD]": 0, "a": 3, "b": 2}
  with pytest.raises(ValueError, match="does not exist; pass --vocab_file"):
    tokenization.load_vocab(str(tmp_path / "missing.txt"))
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  with pytest.raises(ValueError, match="is empty"):
    tokenization.load_vocab(str(empty))


def test_build_wordpiece_vocab(tmp_path):
  path = str(tmp_path / "vocab.txt")
  num_tokens = tokenization.build_wordpiece_vocab([SAMPLE_TEXT], 600, path)
  lines = open(path, encoding="utf-8").read().split("\n")
  assert lines[-1] == ""
  tokens = lines[:-1]
  assert len(tokens) == num_tokens and 100 < num_tokens <= 600
  assert tuple(tokens[:5]) == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
  assert len(set(tokens)) == len(tokens)
  assert any(t.startswith("##") for t in tokens)
  tokenizer = tokenization.FullTokenizer(path)
  assert tokenizer.vocab["[PAD]"] == 0
  text = open(SAMPLE_TEXT, encoding="utf-8").read()
  pieces = tokenizer.tokenize(text)
  assert pieces.count("[UNK]") == 0
  assert pieces == tokenizer.reference_tokenize(text)


def test_build_wordpiece_vocab_errors(tmp_path):
  with pytest.raises(ValueError, match="does not exist"):
    tokenization.build_wordpiece_vocab([str(tmp_path / "nope.txt")], 100,
                                       str(tmp_path / "v.txt"))
  with pytest.raises(ValueError, match="too small"):
    tokenization.build_wordpiece_vocab([SAMPLE_TEXT], 5, str(tmp_path / "v.txt"))
  with pytest.raises(ValueError, match="no text files"):
    tokenization.build_wordpiece_vocab([], 100, str(tmp_path / "v.txt"))


def test_learned_wordpieces_break_ties_by_text_and_merge_the_most_frequent_pair_first():
  # Characters first (sorted), then merges. (a, ##b) and (c, ##d) are seen 3 times each:
  # the merged text breaks the tie ("ab" < "cd"). Then (x, ##c) and (##c, ##d) twice
  # each: "##cd" < "xc"; then "xcd" = x + ##cd.
  counts = {"ab": 3, "cd": 3, "xcd": 2}
  pieces = tokenization._learn_wordpieces(counts, 10)  # pylint: disable=protected-access
  assert pieces == ["##b", "##c", "##d", "a", "c", "x", "ab", "cd", "##cd", "xcd"]
  assert tokenization._learn_wordpieces(counts, 8) == pieces[:8]  # pylint: disable=protected-access
