"""Cleanup of extracted text (clean_text): lines with markup remnants or no prose go.

Step clean (chunk_steps.py) runs it on every article it keeps.
"""

import re

from bert_pretrain.wiki.markup import SPACES_RE

_REMNANT_RE = re.compile(r"\{\{|\}\}|\[\[|\]\]|\{\||\|\}|^[|!]|<[A-Za-z/!]|\|\s*[\w ]+=|"
                         r"\b(?:thumb|upright|px)\|")
_URL_RE = re.compile(r"(?:https?|ftp)://\S+|www\.\S+\.\w+\S*")
# "(French pronunciation: )" once the pronunciation template is gone.
_DANGLING_LABEL_RE = re.compile(r"\(\s*[,;]?\s*[^():;]{0,40}:\s*\)")
_EMPTY_PARENTHESES_RE = re.compile(r"\(\s*(?:[,;:\u2013\u2014-]\s*)*\)")
_OPEN_PARENTHESIS_JUNK_RE = re.compile(r"\(\s*[,;:]\s*")
_CLOSE_PARENTHESIS_JUNK_RE = re.compile(r"\s*[,;:]\s*\)")
_SPACE_BEFORE_PUNCTUATION_RE = re.compile(r" +([,.;:!?])(?=\s|$)")
_LETTER_RE = re.compile(r"[^\W\d_]", re.U)


def clean_text(text):
  """Drops markup remnants and non-prose lines from extracted text.

  A line (paragraph) is dropped when it still holds markup ({{, [[, table syntax, a
  tag, a template parameter, an image option) or has fewer than three words or no
  letter; in kept lines URLs and the empty parentheses that removed templates leave
  behind are deleted and spaces before punctuation closed up.

  Args:
    text: str from wikitext_to_text, one paragraph a line.

  Returns:
    str, the kept paragraphs, one a line.
  """
  kept = []
  for line in text.split("\n"):
    # Plain substring tests first: they are many times faster than the regexes.
    if ("{{" in line or "}}" in line or "[[" in line or "]]" in line or "{|" in line or
        "|}" in line or line[:1] in ("|", "!")):
      continue
    if ("<" in line or "|" in line) and _REMNANT_RE.search(line):
      continue
    if "//" in line or "www." in line:
      line = _URL_RE.sub("", line)
    if "(" in line:
      line = _DANGLING_LABEL_RE.sub("", line)
      line = _EMPTY_PARENTHESES_RE.sub("", line)
      line = _OPEN_PARENTHESIS_JUNK_RE.sub("(", line)
      line = _CLOSE_PARENTHESIS_JUNK_RE.sub(")", line)
    if "  " in line:
      line = SPACES_RE.sub(" ", line)
    if " " in line and any(" " + mark in line for mark in ",.;:!?"):
      line = _SPACE_BEFORE_PUNCTUATION_RE.sub(r"\1", line)
    line = line.strip()
    if line.count(" ") < 2 and len(line.split()) < 3 and not _has_cjk(line):
      continue
    if not _LETTER_RE.search(line):
      continue
    kept.append(line)
  return "\n".join(kept)


def _has_cjk(text):
  """Whether text holds CJK ideographs or kana (written without spaces between words)."""
  return any("\u3040" <= c <= "\u30ff" or "\u4e00" <= c <= "\u9fff" for c in text)
