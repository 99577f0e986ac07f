"""Sentence splitting by rules that need no trained model (split_sentences).

Step segment (chunk_steps.py) splits every paragraph with it; the text shards hold one
sentence a line, as create_pretraining_data reads them.
"""

import re

# Never end a sentence: titles before names, and Latin abbreviations.
_ABBREVIATIONS = frozenset([
    "mr", "mrs", "ms", "dr", "prof", "rev", "hon", "st", "mt", "ft", "gen", "col", "lt",
    "sgt", "capt", "cmdr", "adm", "maj", "gov", "sen", "rep", "pres", "messrs", "mme",
    "mlle", "cf", "vs", "viz", "approx", "esp", "e.g", "i.e", "etc.,", "fr", "sr.,",
    "dept", "univ", "assn", "ave", "blvd", "rd"])
# Before a number only: "No. 5", "pp. 12", "c. 1500".
_NUMBER_ABBREVIATIONS = frozenset([
    "no", "nos", "p", "pp", "vol", "vols", "fig", "figs", "ch", "chap", "sec", "art",
    "op", "c", "ca", "est", "b", "d", "fl", "r"])
# May end a sentence: "... in the U.S. The ...", "... Apple Inc. It ...". They end one
# only when the next word is a usual first word of a sentence.
_AMBIGUOUS_ABBREVIATIONS = frozenset([
    "etc", "inc", "ltd", "co", "corp", "jr", "sr", "al", "plc", "llc", "bros", "jan",
    "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec"])
_SENTENCE_STARTERS = frozenset([
    "a", "an", "the", "he", "she", "it", "they", "we", "i", "you", "this", "that",
    "these", "those", "there", "his", "her", "its", "their", "our", "in", "on", "at",
    "by", "for", "from", "with", "after", "before", "during", "since", "when", "while",
    "as", "but", "and", "or", "so", "yet", "however", "although", "though", "because",
    "if", "many", "most", "some", "other", "one", "two", "both", "each", "all", "no",
    "today", "later", "then", "also", "such", "what", "which", "who", "where",
    "following", "despite", "unlike", "like", "according", "between", "among"])
_ACRONYM_RE = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$")
_BOUNDARY_RE = re.compile(
    "[.!?]+[\"'\u201d\u2019\u00bb)\\]]*(?=\\s)|"
    "[\u3002\uff01\uff1f]+[\u201d\u2019\u300d\u300f\uff09)]*")
_NEXT_WORD_RE = re.compile("\\s*[\"'\u201c\u2018\u00ab(\\[]*(\\S+)")
_LEADING_PUNCTUATION = "\"'\u201c\u2018\u00ab(["


def _is_sentence_end(paragraph, sentence_start, match):
  """Whether the punctuation `match` ends a sentence (see split_sentences)."""
  punctuation = match.group()
  if punctuation[0] in "\u3002\uff01\uff1f":
    return True
  following = _NEXT_WORD_RE.match(paragraph, match.end())
  if not following:
    return True
  next_word = following.group(1)
  if next_word[0].islower():
    return False
  if punctuation[0] != "." or punctuation.startswith(".."):
    return True
  space = paragraph.rfind(" ", sentence_start, match.start())
  word = paragraph[space + 1:match.start()].lstrip(_LEADING_PUNCTUATION)
  lowered = word.lower()
  if lowered in _ABBREVIATIONS:
    return False
  if lowered in _NUMBER_ABBREVIATIONS and next_word[0].isdigit():
    return False
  if (lowered in _AMBIGUOUS_ABBREVIATIONS or _ACRONYM_RE.match(word) or
      (len(word) == 1 and word.isupper())):
    return next_word.strip(".,;:!?\"'\u201d\u2019)").lower() in _SENTENCE_STARTERS
  return True


def split_sentences(paragraph):
  """Splits a paragraph into sentences with rules that need no trained model.

  A sentence ends at ".", "!" or "?" (with closing quotes and brackets) followed by a
  space and a word that does not start with a lower-case letter, and at the CJK full
  stops "。！？". A period does not end a sentence after a title or Latin abbreviation
  (Mr., Dr., St., e.g., cf.), after No./pp./c. before a number, or inside a number
  (3.14). After an initial (John F. Kennedy), an acronym (U.S., Ph.D.) or an abbreviation
  that can close a sentence (Inc., etc., Jr.) it ends one only when the next word
  usually starts sentences (The, He, In, ...).

  Args:
    paragraph: str, one paragraph.

  Returns:
    list of str, the sentences, stripped, none empty.
  """
  sentences = []
  start = 0
  for match in _BOUNDARY_RE.finditer(paragraph):
    if not _is_sentence_end(paragraph, start, match):
      continue
    sentence = paragraph[start:match.end()].strip()
    if sentence:
      sentences.append(sentence)
    start = match.end()
  rest = paragraph[start:].strip()
  if rest:
    sentences.append(rest)
  return sentences
