# coding=utf-8
"""Prepares the MLPerf BERT dataset from a Wikipedia dump, resumably and in parallel.

One command does what MLCommons' cleanup scripts do by hand (WikiExtractor, cleanup,
sentence segmentation, a held-out test set, 500 shards, create_pretraining_data on each
shard, pick_eval_samples):

  bash tools/prepare_wiki.sh --dump=enwiki-20200101-pages-articles-multistream.xml.bz2 \\
      --vocab=vocab.txt --output_dir=/data/bert_wiki --jobs=16

The steps, in order (--steps runs a subset; each step reads what the one before wrote):

  extract    MediaWiki XML (.xml or .xml.bz2; a -multistream .bz2 is decompressed on
             --jobs cores), streamed through an incremental XML parser -> plain-text
             pages, work/extracted/chunk-NNNNN.jsonl, --pages_per_chunk pages a chunk.
  clean      drops redirects, disambiguation pages, other namespaces, markup remnants and
             near-empty articles -> work/cleaned/chunk-NNNNN.jsonl.
  segment    one sentence a line (rule-based, no download) -> work/sentences/*.jsonl.
  shard      holds out the --num_eval_articles articles with the smallest sha256 of their
             title, and deals the others to --num_shards text shards balanced by bytes ->
             text/train/part-00000-of-00500 ..., text/eval/eval.txt.
  tfrecords  bert_pretrain.create_pretraining_data on every shard (one task per shard,
             --jobs at once) -> train_data/part-00000-of-00500 ..., and on the held-out
             text -> eval_intermediate/eval_all.
  eval       exactly --num_eval_samples records, record int(i * n / k) for i < k as
             MLCommons' pick_eval_samples.py -> eval_data/eval_<k>.
  manifest   manifest.json: settings, counts (pages, articles, sentences, tokens,
             instances, bytes) and the size and sha256 of every output file.

Every file is written under a temporary name and renamed when complete, and every
finished unit of work (a chunk, the shards, a TFRecord shard) leaves a done-marker in
work/done/ with its settings, inputs and outputs. A run started again after a kill
skips every unit whose marker matches and whose outputs are there, and redoes the rest.
Each long step prints a progress line with its rate and ETA to stderr every 15 s.
output_dir/settings.json records the settings; a folder made with other settings is
refused. The same dump, vocab and settings give byte-identical files, whatever --jobs.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import bz2
import collections
import contextlib
import errno
import fcntl
import hashlib
import heapq
import html
import itertools
import json
import multiprocessing
import os
import re
import sys
import time
import xml.etree.ElementTree as ElementTree

from absl import app
from absl import flags
from absl import logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bert_pretrain import tokenization  # pylint: disable=g-import-not-at-top

STEPS = ("extract", "clean", "segment", "shard", "tfrecords", "eval", "manifest")
# Bumped when a step's output for the same input changes, so old folders are refused.
FORMAT_VERSION = 1

# Every setting that changes an output, with its default. --jobs is not one: it only
# changes how fast the same files are made.
DEFAULTS = collections.OrderedDict([
    ("pages_per_chunk", 20000),
    ("min_article_chars", 200),
    ("num_shards", 500),
    ("num_eval_articles", 10000),
    ("num_eval_samples", 10000),
    ("do_lower_case", True),
    ("max_seq_length", 512),
    ("max_predictions_per_seq", 76),
    ("masked_lm_prob", 0.15),
    ("short_seq_prob", 0.1),
    ("dupe_factor", 10),
    ("random_seed", 12345),
    ("do_whole_word_mask", False),
])
# The settings each step's outputs depend on (besides its inputs), kept in its markers.
STEP_SETTINGS = {
    "extract": ("format_version", "dump_name", "dump_bytes", "pages_per_chunk"),
    "clean": ("format_version", "min_article_chars"),
    "segment": ("format_version",),
    "shard": ("format_version", "num_shards", "num_eval_articles"),
    "tfrecords": ("format_version", "vocab_sha256", "do_lower_case", "max_seq_length",
                  "max_predictions_per_seq", "masked_lm_prob", "short_seq_prob",
                  "dupe_factor", "random_seed", "do_whole_word_mask"),
    "eval": ("format_version", "num_eval_samples"),
}
_REQUIRED_TOKENS = ("[CLS]", "[SEP]", "[MASK]", "[UNK]")
_HASH_BLOCK = 4 << 20


class PrepareError(Exception):
  """A problem with the input or the output folder; the message says how to fix it."""


# ----------------------------------------------------------------------------------------
# Wikitext to plain text.
# ----------------------------------------------------------------------------------------

_COMMENT_RE = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_REF_RE = re.compile(r"<ref\b[^>]*?/>|<ref\b[^>]*>.*?</ref\s*>", re.I | re.S)
# Elements whose content is not prose: formulas, code, galleries, maps.
_DROPPED_ELEMENT_RE = re.compile(
    r"<(math|chem|ce|gallery|timeline|score|syntaxhighlight|source|pre|imagemap|"
    r"mapframe|maplink|graph|templatedata|hiero|inputbox|categorytree|references)\b"
    r"[^>]*?(?:/>|>.*?</\1\s*>)", re.I | re.S)
_TEMPLATE_TOKEN_RE = re.compile(r"\{\{|\}\}")
_LINK_TOKEN_RE = re.compile(r"\[\[|\]\]")
_EXTERNAL_LINK_RE = re.compile(r"\[(?:(?:https?|ftp):)?//[^\s\]]*(?:[ \t]+([^\]\n]*))?\]",
                               re.I)
_BOLD_ITALIC_RE = re.compile(r"'{2,}")
_BREAK_RE = re.compile(r"<br\s*/?>", re.I)
_TAG_RE = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
_MAGIC_WORD_RE = re.compile(r"__[A-Z]+__")
_HEADING_RE = re.compile(r"^(={1,6})\s*(.*?)\s*\1\s*$")
_TABLE_START_RE = re.compile(r"^[\s:]*\{\|")
_TABLE_END_RE = re.compile(r"^\s*\|\}")
_SPACES_RE = re.compile(r"[ \t\u00a0\u2009\u200b]+")
_NAMED_ARGUMENT_RE = re.compile(r"^\s*[\w \-]+\s*=", re.U)
_INTERLANGUAGE_RE = re.compile(r"^[a-z]{2,3}(?:-[a-z]+)*$")
_DISAMBIGUATION_RE = re.compile(
    r"\{\{\s*(?:disambig\w*|dab|disamb|hndis|geodis|numberdis|[^{}|\n]*disambiguation)"
    r"\s*(?:\||\}\})", re.I)
_REDIRECT_RE = re.compile(r"^\s*#redirect", re.I)

# Sections that hold lists of sources or links rather than prose.
_DROPPED_SECTIONS = frozenset([
    "references", "external links", "see also", "further reading", "notes",
    "bibliography", "sources", "footnotes", "citations", "notes and references",
    "works cited", "gallery", "explanatory notes", "general references"])
_LINK_NAMESPACES_DROPPED = frozenset(["file", "image", "media", "category"])
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")


def _split_template_arguments(body):
  """Splits a template body on the "|" that are not inside a [[link]]."""
  if "[[" not in body:
    return body.split("|")
  parts = []
  depth = 0
  start = 0
  i = 0
  while i < len(body):
    pair = body[i:i + 2]
    if pair == "[[":
      depth += 1
      i += 2
    elif pair == "]]" and depth:
      depth -= 1
      i += 2
    else:
      if body[i] == "|" and not depth:
        parts.append(body[start:i])
        start = i + 1
      i += 1
  parts.append(body[start:])
  return parts


def _render_date(positional):
  """'1879|3|14' -> '14 March 1879' (birth date and similar templates)."""
  numbers = [p.strip() for p in positional[:3]]
  try:
    year = int(numbers[0])
    if len(numbers) == 1:
      return str(year)
    month = _MONTHS[int(numbers[1]) - 1]
    if len(numbers) == 2:
      return "%s %d" % (month, year)
    return "%d %s %d" % (int(numbers[2]), month, year)
  except (ValueError, IndexError):
    return ""


def _render_template(body):
  """Returns the text a template shows in prose; most templates show nothing here.

  Infoboxes, navigation boxes, citations and maintenance tags are dropped, as
  WikiExtractor does by default. A few inline templates carry words of the sentence
  they stand in (a measurement, a foreign word, a date) and are rendered so that the
  sentence stays whole.

  Args:
    body: the text between "{{" and "}}".

  Returns:
    str, the rendered text (possibly empty).
  """
  name = body.split("|", 1)[0].strip().lower().replace("_", " ")
  if name.startswith("template:"):
    name = name[len("template:"):].strip()
  if name in ("!", "pipe"):
    return "|"
  if name in ("ndash", "snd", "spaced ndash"):
    return " \u2013 " if name != "ndash" else "\u2013"
  if name == "mdash":
    return "\u2014"
  renderable = (name in _TEXT_TEMPLATES or name.startswith("lang-") or
                name in _DATE_TEMPLATES or name in ("convert", "cvt", "as of", "circa",
                                                    "c.", "frac", "lang", "transl"))
  if not renderable:
    return ""
  if "{{" in body:
    body = _replace_templates(body)
  parts = _split_template_arguments(body)
  positional = [p.strip() for p in parts[1:] if not _NAMED_ARGUMENT_RE.match(p)]
  if not positional:
    return ""
  if name in ("lang", "transl"):
    return positional[-1] if len(positional) > 1 else ""
  if name in _TEXT_TEMPLATES or name.startswith("lang-"):
    return positional[0]
  if name in _DATE_TEMPLATES:
    return _render_date(positional)
  if name in ("convert", "cvt"):
    # {{convert|8849|m|ft}} -> "8849 m"; {{convert|5|to|10|km}} -> "5 to 10 km".
    if len(positional) >= 4 and positional[1] in ("to", "-", "and", "or", "by", "x"):
      return "%s %s %s %s" % (positional[0], positional[1], positional[2], positional[3])
    return " ".join(positional[:2])
  if name == "as of":
    return "As of " + _render_date(positional)
  if name in ("circa", "c."):
    return "c. " + positional[0]
  if name == "frac":
    return "/".join(positional[:2]) if len(positional) > 1 else "1/" + positional[0]
  return ""


_TEXT_TEMPLATES = frozenset([
    "nowrap", "nobr", "small", "smaller", "big", "nobold", "noitalic", "em", "strong",
    "mvar", "var", "math", "ill", "interlanguage link", "sic", "not a typo", "abbr",
    "keypress", "ruby"])
_DATE_TEMPLATES = frozenset([
    "birth date", "death date", "birth date and age", "death date and age", "start date",
    "end date", "dts", "date", "birth year and age"])


def _replace_outer(text, token_re, opener, render):
  """Replaces each outermost balanced opener...closer span by render(inner text).

  An opener that is never closed is kept as text (cleanup drops its line) and scanning
  goes on after it, so one stray "{{" does not swallow the rest of an article.

  Args:
    text: str.
    token_re: compiled regex matching the opener and the closer.
    opener: the opening token ("{{" or "[[").
    render: function from the inner text to its replacement.

  Returns:
    str.
  """
  if opener not in text:
    return text
  pieces = []
  while True:
    depth = 0
    start = 0
    position = 0
    for match in token_re.finditer(text):
      if match.group() == opener:
        if not depth:
          pieces.append(text[position:match.start()])
          start = match.end()
        depth += 1
      elif depth:
        depth -= 1
        if not depth:
          pieces.append(render(text[start:match.start()]))
          position = match.end()
    if not depth:
      pieces.append(text[position:])
      return "".join(pieces)
    # Unclosed opener at `start - 2`: keep it literally and rescan what follows it.
    pieces.append(opener)
    text = text[start:]


def _replace_templates(text):
  """Replaces every {{template}}, nested ones included, by its rendering."""
  return _replace_outer(text, _TEMPLATE_TOKEN_RE, "{{", _render_template)


def _render_link(body):
  """Returns the text a [[wiki link]] shows; files, categories and language links: ''."""
  target, has_label, label = body.partition("|")
  target = target.strip()
  if target.startswith(":"):
    target = target[1:]
  elif ":" in target:
    prefix = target.split(":", 1)[0].strip().lower()
    if prefix in _LINK_NAMESPACES_DROPPED:
      return ""
    if not has_label and _INTERLANGUAGE_RE.match(prefix):
      return ""
  if has_label:
    if "[[" in label:
      label = _replace_links(label)
    if label.strip():
      return label
    # The pipe trick: [[Paris (band)|]] shows "Paris".
    return re.sub(r"\s*\(.*\)\s*$", "", target.split(":", 1)[-1])
  return target


def _replace_links(text):
  """Replaces every [[link]] by the text it shows."""
  return _replace_outer(text, _LINK_TOKEN_RE, "[[", _render_link)


def _remove_tables(text):
  """Drops every {| table |}, nested tables included (line based, as wikitext)."""
  if "{|" not in text:
    return text
  kept = []
  depth = 0
  for line in text.split("\n"):
    if _TABLE_START_RE.match(line):
      depth += 1
    elif depth and _TABLE_END_RE.match(line):
      depth -= 1
    elif not depth:
      kept.append(line)
  return "\n".join(kept)


def wikitext_to_text(wikitext):
  """Turns an article's wikitext into plain text, one paragraph a line.

  Removes comments, <ref>s, non-prose elements (math, code, galleries), templates
  (nested; a few inline ones are rendered, see _render_template), tables, headings and
  the sections of references and links, bulleted and numbered lists, file and category
  links, bold and italic quotes and HTML tags; keeps the text of wiki links and of
  external links with a label; decodes HTML entities.

  Args:
    wikitext: str, the <text> of a revision.

  Returns:
    str: paragraphs separated by "\\n", no empty lines.
  """
  # The substring tests skip regexes that cannot match: most of the time goes here.
  text = wikitext
  if "<" in text:
    text = _COMMENT_RE.sub("", text)
    text = _REF_RE.sub("", text)
    text = _DROPPED_ELEMENT_RE.sub("", text)
  text = _replace_templates(text)
  text = _remove_tables(text)

  lines = []
  dropped_level = 0  # > 0 while inside a dropped section of that heading level
  for line in text.split("\n"):
    heading = _HEADING_RE.match(line)
    if heading:
      level = len(heading.group(1))
      if dropped_level and level > dropped_level:
        continue
      dropped_level = 0
      title = _BOLD_ITALIC_RE.sub("", _replace_links(heading.group(2))).strip().lower()
      if title in _DROPPED_SECTIONS:
        dropped_level = level
      # Headings are not sentences; they only end the paragraph before them.
      continue
    if dropped_level:
      continue
    stripped = line.lstrip()
    if stripped[:1] in ("*", "#", ";") or stripped.startswith("----"):
      continue
    lines.append(stripped.lstrip(":"))
  text = "\n".join(lines)

  text = _replace_links(text)
  if "//" in text:
    text = _EXTERNAL_LINK_RE.sub(lambda m: m.group(1) or "", text)
  if "''" in text:
    text = _BOLD_ITALIC_RE.sub("", text)
  if "<" in text:
    text = _BREAK_RE.sub(" ", text)
    text = _TAG_RE.sub("", text)
  if "__" in text:
    text = _MAGIC_WORD_RE.sub("", text)
  text = html.unescape(text)
  text = _SPACES_RE.sub(" ", text)
  paragraphs = []
  for line in text.split("\n"):
    line = line.strip()
    if line:
      paragraphs.append(line)
  return "\n".join(paragraphs)


# ----------------------------------------------------------------------------------------
# Cleanup.
# ----------------------------------------------------------------------------------------

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
      line = _SPACES_RE.sub(" ", line)
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


# ----------------------------------------------------------------------------------------
# Sentence segmentation.
# ----------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------
# Files, markers and progress.
# ----------------------------------------------------------------------------------------


def _remove_quietly(path):
  try:
    os.remove(path)
  except OSError:
    pass


@contextlib.contextmanager
def atomic_output(path, binary=False):
  """Opens `path` for writing under a temporary name, renamed into place on success.

  A reader (or a resumed run) never sees a half-written file under the final name; on
  any error the temporary file is removed.

  Args:
    path: the final path.
    binary: open in binary mode, else UTF-8 text with "\\n" newlines.

  Yields:
    the open file object.
  """
  temporary = "%s.tmp-%d" % (path, os.getpid())
  if binary:
    handle = open(temporary, "wb")
  else:
    handle = open(temporary, "w", encoding="utf-8", newline="\n")
  try:
    yield handle
    handle.close()
    os.replace(temporary, path)
  except BaseException:
    try:
      handle.close()
    except OSError:
      pass
    _remove_quietly(temporary)
    raise


def write_json(path, value):
  """Writes `value` as sorted, indented JSON, atomically."""
  with atomic_output(path) as writer:
    json.dump(value, writer, indent=1, sort_keys=True, ensure_ascii=False)
    writer.write("\n")


def read_json(path):
  """Returns the JSON value in `path`, or None if it is missing or unreadable."""
  try:
    with open(path, encoding="utf-8") as reader:
      return json.load(reader)
  except (OSError, ValueError):
    return None


def file_digest(path):
  """Returns {"bytes": size, "sha256": hex digest} of a file."""
  digest = hashlib.sha256()
  size = 0
  with open(path, "rb") as reader:
    while True:
      block = reader.read(_HASH_BLOCK)
      if not block:
        break
      size += len(block)
      digest.update(block)
  return {"bytes": size, "sha256": digest.hexdigest()}


def remove_stale_temporaries(folder):
  """Deletes the temporary files a killed run left in `folder` (one level)."""
  if not os.path.isdir(folder):
    return
  for name in os.listdir(folder):
    if ".tmp-" in name or name.endswith(".tmp"):
      _remove_quietly(os.path.join(folder, name))


class Layout(object):
  """The paths of one output folder."""

  def __init__(self, output_dir):
    self.root = output_dir
    self.settings = os.path.join(output_dir, "settings.json")
    self.manifest = os.path.join(output_dir, "manifest.json")
    self.lock = os.path.join(output_dir, ".lock")
    self.work = os.path.join(output_dir, "work")
    self.extracted = os.path.join(self.work, "extracted")
    self.cleaned = os.path.join(self.work, "cleaned")
    self.sentences = os.path.join(self.work, "sentences")
    self.done = os.path.join(self.work, "done")
    self.text_train = os.path.join(output_dir, "text", "train")
    self.text_eval = os.path.join(output_dir, "text", "eval")
    self.eval_text = os.path.join(self.text_eval, "eval.txt")
    self.train_data = os.path.join(output_dir, "train_data")
    self.eval_intermediate = os.path.join(output_dir, "eval_intermediate")
    self.eval_all = os.path.join(self.eval_intermediate, "eval_all")
    self.eval_data = os.path.join(output_dir, "eval_data")

  def chunk(self, folder, index):
    return os.path.join(folder, "chunk-%05d.jsonl" % index)

  def shard_name(self, index, num_shards):
    return "part-%05d-of-%05d" % (index, num_shards)

  def marker(self, step, name=None):
    if name is None:
      return os.path.join(self.done, step + ".json")
    return os.path.join(self.done, step, name + ".json")

  def relative(self, path):
    return os.path.relpath(path, self.root)

  def absolute(self, relative_path):
    return os.path.join(self.root, relative_path)


def step_settings(settings, step):
  """The subset of `settings` that the outputs of `step` depend on."""
  return {key: settings.get(key) for key in STEP_SETTINGS[step]}


def marker_is_valid(layout, marker, settings, step, inputs=None):
  """Whether a done-marker says its unit is complete for these settings and inputs.

  Args:
    layout: Layout.
    marker: dict read from the marker file, or None.
    settings: dict of the run's settings.
    step: the step name.
    inputs: (optional) dict path -> sha256 the unit was made from.

  Returns:
    bool: the marker matches the settings and inputs, and each output it lists exists
    with the recorded size (a truncated or replaced file is redone).
  """
  if not marker or marker.get("settings") != step_settings(settings, step):
    return False
  if inputs is not None and marker.get("inputs") != inputs:
    return False
  for relative_path, digest in marker.get("outputs", {}).items():
    path = layout.absolute(relative_path)
    if not os.path.isfile(path) or os.path.getsize(path) != digest["bytes"]:
      return False
  return True


class Progress(object):
  """Prints one progress line with rate and ETA to stderr every `interval` seconds."""

  def __init__(self, step, total, unit="MB", scale=1e6, interval=15.0):
    """Creates the progress line.

    Args:
      step: the step name shown first.
      total: the total amount of work, in the units of update().
      unit: the unit shown.
      scale: the amount per shown unit (1e6 for MB of bytes).
      interval: seconds between lines.
    """
    self.step = step
    self.total = max(total, 1)
    self.unit = unit
    self.scale = scale
    self.interval = interval
    self.start = time.time()
    self.last_print = self.start
    self.done = 0

  def update(self, done, force=False):
    """Sets the amount done; prints when `interval` has passed (or force)."""
    self.done = done
    now = time.time()
    if not force and now - self.last_print < self.interval:
      return
    self.last_print = now
    elapsed = now - self.start
    fraction = min(self.done / self.total, 1.0)
    rate = self.done / self.scale / elapsed if elapsed > 0 else 0.0
    if 0 < fraction < 1:
      eta = _format_seconds(elapsed / fraction - elapsed)
    else:
      eta = "-"
    sys.stderr.write("prepare_wiki: %-9s %5.1f%%  %.1f/%.1f %s  %.2f %s/s  elapsed %s  "
                     "ETA %s\n" % (self.step, 100 * fraction, self.done / self.scale,
                                   self.total / self.scale, self.unit, rate, self.unit,
                                   _format_seconds(elapsed), eta))
    sys.stderr.flush()


def _format_seconds(seconds):
  seconds = int(seconds)
  return "%d:%02d:%02d" % (seconds // 3600, seconds // 60 % 60, seconds % 60)


def _say(message):
  sys.stderr.write("prepare_wiki: %s\n" % message)
  sys.stderr.flush()


def run_tasks(function, tasks, jobs, on_result, context="fork"):
  """Runs function(task) for every task, `jobs` at once; on_result(result) in the caller.

  With one job the tasks run in this process (no pickling, plain tracebacks). A failing
  task stops the pool; the tasks already finished have left their markers.

  Args:
    function: a module-level function of one argument.
    tasks: list of arguments.
    jobs: processes to use.
    on_result: called in this process with each result, in completion order.
    context: multiprocessing start method for the pool.
  """
  if jobs <= 1 or len(tasks) <= 1:
    for task in tasks:
      on_result(function(task))
    return
  pool = multiprocessing.get_context(context).Pool(min(jobs, len(tasks)))
  try:
    for result in pool.imap_unordered(function, tasks, chunksize=1):
      on_result(result)
    pool.close()
  finally:
    pool.terminate()
    pool.join()


# ----------------------------------------------------------------------------------------
# Step 1: extract.
# ----------------------------------------------------------------------------------------


class _CountingReader(object):
  """A file wrapper that counts the bytes read through it (for the progress line)."""

  def __init__(self, raw):
    self.raw = raw
    self.bytes_read = 0

  def read(self, size=-1):
    data = self.raw.read(size)
    self.bytes_read += len(data)
    return data

  def readinto(self, buffer):
    count = self.raw.readinto(buffer)
    self.bytes_read += count or 0
    return count

  def readable(self):
    return True

  def close(self):
    self.raw.close()


Page = collections.namedtuple("Page", "id title namespace redirect text")

# A bz2 stream starts byte-aligned with "BZh", the block size digit and the block magic.
_BZ2_STREAM_RE = re.compile(b"BZh[1-9]1AY&SY")
# XML read per parser feed, and compressed bytes per parallel decompression task.
_XML_BLOCK = 1 << 20
_BZ2_SEGMENT = 4 << 20


def _is_multistream_bz2(raw):
  """Whether a bz2 file holds many streams early on (Wikimedia's -multistream dumps)."""
  head = raw.read(_BZ2_SEGMENT)
  raw.seek(0)
  return len(_BZ2_STREAM_RE.findall(head)) > 1


def _bz2_segments(reader):
  """Yields the compressed file in pieces of whole bz2 streams, about _BZ2_SEGMENT each."""
  buffer = b""
  while True:
    block = reader.read(_BZ2_SEGMENT)
    if not block:
      if buffer:
        yield buffer
      return
    buffer += block
    # Cut before the last stream start; what follows it waits for the next read.
    cut = None
    for match in _BZ2_STREAM_RE.finditer(buffer, max(len(buffer) - len(block) - 9, 1)):
      cut = match.start()
    if cut:
      yield buffer[:cut]
      buffer = buffer[cut:]


def _xml_blocks(reader, multistream_pool=None, jobs=1):
  """Yields the XML of a dump in blocks, decompressing it as needed.

  Args:
    reader: the dump file (a _CountingReader).
    multistream_pool: (optional) a multiprocessing pool: a multistream .bz2 is then
      decompressed there, `jobs` pieces at once, in order.
    jobs: pieces in flight.

  Yields:
    bytes.
  """
  magic = reader.raw.read(3)
  reader.raw.seek(0)
  if magic != b"BZh":
    stream = reader
  elif multistream_pool is not None and _is_multistream_bz2(reader.raw):
    # One process decompresses bz2 at ~15 MB/s of XML, slower than the converters
    # together; Wikimedia's multistream dumps can be cut between streams instead.
    pending = collections.deque()
    for segment in _bz2_segments(reader):
      pending.append(multistream_pool.apply_async(bz2.decompress, (segment,)))
      while len(pending) > jobs:
        yield pending.popleft().get()
    while pending:
      yield pending.popleft().get()
    return
  else:
    stream = bz2.BZ2File(reader)
  while True:
    block = stream.read(_XML_BLOCK)
    if not block:
      return
    yield block


def iter_pages(dump_path, counter=None, pool=None, jobs=1):
  """Streams the pages of a MediaWiki XML export (.xml or .xml.bz2).

  Args:
    dump_path: path of the dump.
    counter: (optional) list; counter[0] is set to the (compressed) bytes read so far.
    pool: (optional) multiprocessing pool to decompress a multistream .bz2 in.
    jobs: decompression tasks in flight in the pool.

  Yields:
    Page tuples, in dump order.

  Raises:
    PrepareError: the file is not a MediaWiki export, or is damaged or cut short.
  """
  raw = open(dump_path, "rb")
  reader = _CountingReader(raw)
  parser = ElementTree.XMLPullParser(events=("start", "end"))
  root = None
  prefix = ""
  pages = 0
  try:
    for block in itertools.chain(_xml_blocks(reader, pool, jobs), [None]):
      if block is None:
        parser.close()  # raises ParseError when the document is not complete
      else:
        parser.feed(block)
      for event, element in parser.read_events():
        if root is None:
          root = element
          tag = element.tag
          prefix = tag[:tag.index("}") + 1] if tag.startswith("{") else ""
          if tag[len(prefix):] != "mediawiki":
            raise PrepareError(
                "%s is not a MediaWiki XML export: its root element is <%s>, not "
                "<mediawiki>; pass a pages-articles .xml or .xml.bz2 dump from "
                "dumps.wikimedia.org" % (dump_path, tag[len(prefix):]))
          continue
        if event != "end" or element.tag != prefix + "page":
          continue
        revision = element.find(prefix + "revision")
        text = revision.findtext(prefix + "text") if revision is not None else None
        namespace = element.findtext(prefix + "ns")
        yield Page(element.findtext(prefix + "id") or "",
                   element.findtext(prefix + "title") or "",
                   int(namespace) if namespace and namespace.strip().lstrip("-").isdigit()
                   else 0,
                   element.find(prefix + "redirect") is not None or
                   bool(text and _REDIRECT_RE.match(text)),
                   text or "")
        pages += 1
        # Drop the parsed pages, so memory stays flat over a whole dump.
        root.clear()
      if counter is not None:
        counter[0] = reader.bytes_read
  except ElementTree.ParseError as e:
    if root is None:
      raise PrepareError("%s is not a MediaWiki XML export (not XML: %s); pass a "
                         "pages-articles .xml or .xml.bz2 dump" % (dump_path, e))
    raise PrepareError("%s is damaged or cut short (XML error %s after %d pages); download "
                       "the dump again, then rerun: finished chunks are kept"
                       % (dump_path, e, pages))
  except EOFError:
    raise PrepareError("%s ends inside its bz2 stream after %d pages (cut short); download "
                       "the dump again, then rerun: finished chunks are kept"
                       % (dump_path, pages))
  except ValueError as e:
    # bz2.decompress of a piece cut short (multistream path).
    if "end-of-stream" not in str(e):
      raise
    raise PrepareError("%s ends inside its bz2 stream after %d pages (cut short); download "
                       "the dump again, then rerun: finished chunks are kept"
                       % (dump_path, pages))
  except OSError as e:
    if e.errno is None:
      raise PrepareError("%s is not a valid bz2 file (%s) after %d pages; download the "
                         "dump again, then rerun: finished chunks are kept"
                         % (dump_path, e, pages))
    raise
  finally:
    raw.close()


def extract_chunk(task):
  """Converts one chunk of pages to plain text and writes it with its marker.

  Args:
    task: (layout root, settings, chunk index, list of Page).

  Returns:
    dict of the chunk's statistics.
  """
  root, settings, index, pages = task
  layout = Layout(root)
  path = layout.chunk(layout.extracted, index)
  stats = collections.Counter(pages=len(pages))
  with atomic_output(path) as writer:
    for page in pages:
      record = {"id": page.id, "title": page.title, "ns": page.namespace,
                "redirect": page.redirect}
      if page.namespace == 0 and not page.redirect:
        record["disambiguation"] = bool(
            _DISAMBIGUATION_RE.search(page.text) or
            page.title.endswith("(disambiguation)"))
        record["text"] = wikitext_to_text(page.text)
        stats["wikitext_bytes"] += len(page.text.encode("utf-8"))
        stats["text_pages"] += 1
      writer.write(json.dumps(record, ensure_ascii=False) + "\n")
  write_json(layout.marker("extract", "chunk-%05d" % index), {
      "settings": step_settings(settings, "extract"),
      "outputs": {layout.relative(path): file_digest(path)},
      "stats": dict(stats)})
  return dict(stats)


def run_extract(layout, settings, dump_path, jobs):
  """Step extract: dump -> work/extracted/chunk-NNNNN.jsonl (resumable per chunk)."""
  os.makedirs(layout.extracted, exist_ok=True)
  os.makedirs(os.path.join(layout.done, "extract"), exist_ok=True)
  remove_stale_temporaries(layout.extracted)
  step_marker = read_json(layout.marker("extract"))
  if (step_marker and step_marker.get("settings") == step_settings(settings, "extract") and
      all(marker_is_valid(layout, read_json(layout.marker("extract", "chunk-%05d" % i)),
                          settings, "extract")
          for i in range(step_marker["num_chunks"]))):
    # A resumed run does not read the dump again when every chunk is there.
    _say("extract: done before (%d chunks)" % step_marker["num_chunks"])
    return step_marker["num_chunks"]
  pages_per_chunk = settings["pages_per_chunk"]
  progress = Progress("extract", settings["dump_bytes"])
  counter = [0]
  num_chunks = [0]
  skipped = [0]

  def chunks(pool=None):
    """Yields the extract tasks of the chunks not done yet, counting the others."""
    batch = []
    index = 0
    chunk_done = None
    for page in iter_pages(dump_path, counter, pool, jobs):
      if chunk_done is None:
        chunk_done = marker_is_valid(
            layout, read_json(layout.marker("extract", "chunk-%05d" % index)), settings,
            "extract")
      # Pages of a finished chunk are only counted, not converted again.
      batch.append(None if chunk_done else page)
      if len(batch) == pages_per_chunk:
        yield index, chunk_done, batch
        batch = []
        index += 1
        chunk_done = None
      progress.update(counter[0])
    if batch:
      yield index, chunk_done, batch

  started = time.time()
  if jobs <= 1:
    for index, chunk_done, batch in chunks():
      num_chunks[0] = index + 1
      if chunk_done:
        skipped[0] += 1
        continue
      extract_chunk((layout.root, settings, index, batch))
  else:
    # Bounded in flight: the parser must not run ahead of the converters by more than a
    # few chunks, or the whole dump would queue up in memory.
    pool = multiprocessing.get_context("fork").Pool(jobs)
    pending = collections.deque()
    try:
      for index, chunk_done, batch in chunks(pool):
        num_chunks[0] = index + 1
        if chunk_done:
          skipped[0] += 1
          continue
        pending.append(pool.apply_async(extract_chunk, ((layout.root, settings, index,
                                                          batch),)))
        while len(pending) > jobs:
          pending.popleft().get()
      while pending:
        pending.popleft().get()
      pool.close()
    finally:
      pool.terminate()
      pool.join()
  if not num_chunks[0]:
    raise PrepareError("%s holds no <page> elements; pass a pages-articles dump"
                       % dump_path)
  # The step marker sums the chunk markers, so a resumed run reports whole-dump counts.
  summary = collections.Counter()
  for index in range(num_chunks[0]):
    summary.update(read_json(layout.marker("extract", "chunk-%05d" % index))["stats"])
  write_json(layout.marker("extract"), {
      "settings": step_settings(settings, "extract"), "num_chunks": num_chunks[0],
      "stats": dict(summary)})
  _say("extract: %d pages in %d chunks (%d done before) in %.1f s"
       % (summary["pages"], num_chunks[0], skipped[0], time.time() - started))
  return num_chunks[0]


# ----------------------------------------------------------------------------------------
# Steps 2 and 3: clean, segment (per chunk, in parallel).
# ----------------------------------------------------------------------------------------


def clean_chunk(task):
  """Filters and cleans one extracted chunk; writes work/cleaned/chunk-NNNNN.jsonl."""
  root, settings, index, input_digest = task
  layout = Layout(root)
  source = layout.chunk(layout.extracted, index)
  path = layout.chunk(layout.cleaned, index)
  stats = collections.Counter()
  with open(source, encoding="utf-8") as reader, atomic_output(path) as writer:
    for line in reader:
      page = json.loads(line)
      if page["ns"] != 0:
        stats["dropped_non_article"] += 1
      elif page["redirect"]:
        stats["dropped_redirect"] += 1
      elif page["disambiguation"]:
        stats["dropped_disambiguation"] += 1
      else:
        text = clean_text(page["text"])
        if len(text) < settings["min_article_chars"]:
          stats["dropped_near_empty"] += 1
          continue
        stats["articles"] += 1
        writer.write(json.dumps({"title": page["title"], "text": text},
                                ensure_ascii=False) + "\n")
  write_json(layout.marker("clean", "chunk-%05d" % index), {
      "settings": step_settings(settings, "clean"),
      "inputs": {layout.relative(source): input_digest},
      "outputs": {layout.relative(path): file_digest(path)},
      "stats": dict(stats)})
  return dict(stats)


def title_key(title):
  """The hash that decides held-out articles: first 16 hex digits of sha256(title)."""
  return hashlib.sha256(title.encode("utf-8")).hexdigest()[:16]


def segment_chunk(task):
  """Splits one cleaned chunk into sentences; writes work/sentences/chunk-NNNNN.jsonl."""
  root, settings, index, input_digest = task
  layout = Layout(root)
  source = layout.chunk(layout.cleaned, index)
  path = layout.chunk(layout.sentences, index)
  stats = collections.Counter()
  keys = []
  with open(source, encoding="utf-8") as reader, atomic_output(path) as writer:
    for line in reader:
      article = json.loads(line)
      sentences = []
      for paragraph in article["text"].split("\n"):
        sentences.extend(split_sentences(paragraph))
      if not sentences:
        stats["dropped_no_sentences"] += 1
        continue
      key = title_key(article["title"])
      keys.append(key)
      stats["articles"] += 1
      stats["sentences"] += len(sentences)
      writer.write(json.dumps({"title": article["title"], "key": key,
                               "sentences": sentences}, ensure_ascii=False) + "\n")
  write_json(layout.marker("segment", "chunk-%05d" % index), {
      "settings": step_settings(settings, "segment"),
      "inputs": {layout.relative(source): input_digest},
      "outputs": {layout.relative(path): file_digest(path)},
      "stats": dict(stats), "keys": keys})
  return dict(stats)


def _run_chunk_step(layout, settings, jobs, step, previous, function, source_folder,
                    output_folder):
  """Runs a per-chunk step over the chunks the previous step finished."""
  previous_marker = read_json(layout.marker(previous))
  if not previous_marker or previous_marker.get("settings") != step_settings(settings,
                                                                            previous):
    raise PrepareError("step %s needs the output of step %s, which is not complete in %s; "
                       "run --steps=%s first (or leave --steps out)"
                       % (step, previous, layout.root, previous))
  num_chunks = previous_marker["num_chunks"]
  os.makedirs(output_folder, exist_ok=True)
  os.makedirs(os.path.join(layout.done, step), exist_ok=True)
  remove_stale_temporaries(output_folder)
  tasks = []
  total_bytes = 0
  for index in range(num_chunks):
    name = "chunk-%05d" % index
    source = layout.chunk(source_folder, index)
    source_marker = read_json(layout.marker(previous, name))
    if not marker_is_valid(layout, source_marker, settings, previous):
      raise PrepareError("step %s needs %s, which is missing or incomplete; run "
                         "--steps=%s again to redo it" % (step, source, previous))
    digest = source_marker["outputs"][layout.relative(source)]
    inputs = {layout.relative(source): digest}
    if marker_is_valid(layout, read_json(layout.marker(step, name)), settings, step,
                       inputs):
      continue
    tasks.append((layout.root, settings, index, digest))
    total_bytes += digest["bytes"]
  progress = Progress(step, total_bytes)
  done_bytes = [0]
  sizes = {task[2]: task[3]["bytes"] for task in tasks}
  started = time.time()

  def on_result(stats):
    done_bytes[0] += sizes[stats.pop("_index")]
    progress.update(done_bytes[0])

  run_tasks(_indexed(function), tasks, jobs, on_result)
  summary = collections.Counter()
  keys = []
  for index in range(num_chunks):
    marker = read_json(layout.marker(step, "chunk-%05d" % index))
    summary.update(marker["stats"])
    keys.extend(marker.get("keys", ()))
  write_json(layout.marker(step), {"settings": step_settings(settings, step),
                                   "num_chunks": num_chunks, "stats": dict(summary)})
  _say("%s: %d chunks (%d done before) in %.1f s: %s"
       % (step, num_chunks, num_chunks - len(tasks), time.time() - started,
          ", ".join("%s %d" % item for item in sorted(summary.items()))))


class _indexed(object):  # pylint: disable=invalid-name
  """Wraps a chunk function so its result also says which chunk it was (picklable)."""

  def __init__(self, function):
    self.function = function

  def __call__(self, task):
    stats = self.function(task)
    stats["_index"] = task[2]
    return stats


def run_clean(layout, settings, jobs):
  """Step clean: work/extracted -> work/cleaned."""
  _run_chunk_step(layout, settings, jobs, "clean", "extract", clean_chunk,
                  layout.extracted, layout.cleaned)


def run_segment(layout, settings, jobs):
  """Step segment: work/cleaned -> work/sentences."""
  _run_chunk_step(layout, settings, jobs, "segment", "clean", segment_chunk,
                  layout.cleaned, layout.sentences)


# ----------------------------------------------------------------------------------------
# Step 4: shard.
# ----------------------------------------------------------------------------------------


def run_shard(layout, settings):
  """Step shard: holds out eval articles, deals the rest to balanced text shards.

  Held out are the num_eval_articles articles with the smallest title_key: the choice
  depends only on the titles, not on the order or the number of chunks. The others go,
  in dump order, each to the shard with the fewest bytes so far (the lowest index on a
  tie), so shards differ by at most one article's size.
  """
  segment_marker = read_json(layout.marker("segment"))
  if not segment_marker or segment_marker.get("settings") != step_settings(settings,
                                                                          "segment"):
    raise PrepareError("step shard needs the output of step segment, which is not "
                       "complete in %s; run --steps=segment first" % layout.root)
  num_chunks = segment_marker["num_chunks"]
  num_shards = settings["num_shards"]
  num_eval = settings["num_eval_articles"]
  inputs = {}
  keys = []
  for index in range(num_chunks):
    path = layout.chunk(layout.sentences, index)
    marker = read_json(layout.marker("segment", "chunk-%05d" % index))
    if not marker_is_valid(layout, marker, settings, "segment"):
      raise PrepareError("step shard needs %s, which is missing or incomplete; run "
                         "--steps=segment again to redo it" % path)
    inputs[layout.relative(path)] = marker["outputs"][layout.relative(path)]
    keys.extend(marker["keys"])
  if valid_shard_marker(layout, settings, inputs):
    _say("shard: done before")
    return
  num_articles = len(keys)
  if num_articles < num_eval + num_shards:
    raise PrepareError(
        "the dump gives %d articles, too few for %d held-out articles and %d shards of at "
        "least one article; lower --num_eval_articles or --num_shards"
        % (num_articles, num_eval, num_shards))
  eval_keys = set(heapq.nsmallest(num_eval, keys))
  if len(eval_keys) != num_eval:
    raise PrepareError("two articles have the same title; the dump is inconsistent")

  for folder in (layout.text_train, layout.text_eval):
    os.makedirs(folder, exist_ok=True)
    remove_stale_temporaries(folder)
  names = [layout.shard_name(i, num_shards) for i in range(num_shards)]
  paths = [os.path.join(layout.text_train, name) for name in names]
  progress = Progress("shard", sum(d["bytes"] for d in inputs.values()))
  started = time.time()
  shard_bytes = [0] * num_shards
  shard_articles = [0] * num_shards
  shard_sentences = [0] * num_shards
  eval_articles = eval_sentences = 0
  smallest = [(0, i) for i in range(num_shards)]  # heap of (bytes, shard index)
  read_bytes = 0
  with contextlib.ExitStack() as stack:
    writers = [stack.enter_context(atomic_output(path, binary=True)) for path in paths]
    eval_writer = stack.enter_context(atomic_output(layout.eval_text, binary=True))
    for index in range(num_chunks):
      path = layout.chunk(layout.sentences, index)
      with open(path, "rb") as reader:
        for line in reader:
          read_bytes += len(line)
          article = json.loads(line)
          document = ("\n".join(article["sentences"]) + "\n\n").encode("utf-8")
          if article["key"] in eval_keys:
            eval_writer.write(document)
            eval_articles += 1
            eval_sentences += len(article["sentences"])
            continue
          size, shard = heapq.heappop(smallest)
          writers[shard].write(document)
          shard_bytes[shard] += len(document)
          shard_articles[shard] += 1
          shard_sentences[shard] += len(article["sentences"])
          heapq.heappush(smallest, (size + len(document), shard))
      progress.update(read_bytes)
  outputs = {layout.relative(p): file_digest(p) for p in paths + [layout.eval_text]}
  write_json(layout.marker("shard"), {
      "settings": step_settings(settings, "shard"), "inputs": inputs, "outputs": outputs,
      "shards": [{"name": n, "articles": a, "sentences": s, "bytes": b}
                 for n, a, s, b in zip(names, shard_articles, shard_sentences, shard_bytes)],
      "eval": {"articles": eval_articles, "sentences": eval_sentences},
      "stats": {"train_articles": sum(shard_articles),
                "train_sentences": sum(shard_sentences), "train_bytes": sum(shard_bytes),
                "eval_articles": eval_articles, "eval_sentences": eval_sentences}})
  _say("shard: %d training articles in %d shards (%d to %d bytes), %d held out, in %.1f s"
       % (sum(shard_articles), num_shards, min(shard_bytes), max(shard_bytes),
          eval_articles, time.time() - started))


def valid_shard_marker(layout, settings, inputs=None):
  """Returns the shard step's marker if it is complete, else None."""
  marker = read_json(layout.marker("shard"))
  if marker_is_valid(layout, marker, settings, "shard", inputs):
    return marker
  return None


# ----------------------------------------------------------------------------------------
# Step 5: tfrecords; step 6: eval.
# ----------------------------------------------------------------------------------------


def tfrecord_task(task):
  """Runs create_pretraining_data on one text file; writes the output and its marker.

  Args:
    task: (layout root, settings, vocab path, marker name, input path, input digest,
      output path).

  Returns:
    dict with the marker name, the input bytes and create_pretraining_data's stats.
  """
  root, settings, vocab, name, source, source_digest, output = task
  if multiprocessing.current_process().name != "MainProcess":
    # One task a core: the Rust tokenizer must not start a thread per core in each.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
  # Imported here: TensorFlow is loaded only by the processes that need it.
  from bert_pretrain import create_pretraining_data  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  layout = Layout(root)
  try:
    stats = create_pretraining_data.create_pretraining_data(
        [source], [output], vocab, do_lower_case=settings["do_lower_case"],
        max_seq_length=settings["max_seq_length"],
        max_predictions_per_seq=settings["max_predictions_per_seq"],
        masked_lm_prob=settings["masked_lm_prob"],
        short_seq_prob=settings["short_seq_prob"], dupe_factor=settings["dupe_factor"],
        random_seed=settings["random_seed"],
        do_whole_word_mask=settings["do_whole_word_mask"])
  except tf.errors.OpError as e:
    raise os_error_from_tf(e, output)
  stats.pop("seconds", None)
  write_json(layout.marker("tfrecords", name), {
      "settings": step_settings(settings, "tfrecords"),
      "inputs": {layout.relative(source): source_digest},
      "outputs": {layout.relative(output): file_digest(output)},
      "stats": stats})
  return {"name": name, "input_bytes": source_digest["bytes"]}


def run_tfrecords(layout, settings, vocab, jobs):
  """Step tfrecords: every text shard and the held-out text -> TFRecords."""
  shard_marker = valid_shard_marker(layout, settings)
  if not shard_marker:
    raise PrepareError("step tfrecords needs the text shards of step shard, which are not "
                       "complete in %s; run --steps=shard first (or leave --steps out)"
                       % layout.root)
  for folder in (layout.train_data, layout.eval_intermediate,
                 os.path.join(layout.done, "tfrecords")):
    os.makedirs(folder, exist_ok=True)
    remove_stale_temporaries(folder)
  units = [("eval_all", layout.eval_text, layout.eval_all)]
  for shard in shard_marker["shards"]:
    units.append((shard["name"], os.path.join(layout.text_train, shard["name"]),
                  os.path.join(layout.train_data, shard["name"])))
  tasks = []
  for name, source, output in units:
    digest = shard_marker["outputs"][layout.relative(source)]
    inputs = {layout.relative(source): digest}
    if not marker_is_valid(layout, read_json(layout.marker("tfrecords", name)), settings,
                           "tfrecords", inputs):
      tasks.append((layout.root, settings, vocab, name, source, digest, output))
  # Largest first, so no big shard is left alone at the end.
  tasks.sort(key=lambda task: -task[5]["bytes"])
  total = sum(task[5]["bytes"] for task in tasks)
  progress = Progress("tfrecords", total)
  done = [0, 0]
  started = time.time()

  def on_result(result):
    done[0] += result["input_bytes"]
    done[1] += 1
    progress.update(done[0])

  # spawn: each worker starts TensorFlow itself rather than inheriting a forked one.
  run_tasks(tfrecord_task, tasks, jobs, on_result, context="spawn")
  elapsed = time.time() - started
  _say("tfrecords: %d files made (%d done before) in %.1f s, %.2f MB/s of text"
       % (len(tasks), len(units) - len(tasks), elapsed,
          total / 1e6 / elapsed if elapsed > 0 and total else 0.0))


def os_error_from_tf(error, path):
  """TensorFlow's file errors as OSError, so a full disk reads the same everywhere.

  Only builtin exceptions cross the process pool intact, hence OSError here.
  """
  message = error.message.splitlines()[0] if error.message else str(error)
  if "No space left on device" in message:
    return OSError(errno.ENOSPC, "No space left on device", path)
  return OSError(errno.EIO, "TensorFlow could not write it: %s" % message, path)


def iter_record_offsets(path):
  """Yields (offset, length) of each TFRecord in a file, from its framing alone.

  Raises:
    PrepareError: the file ends inside a record.
  """
  size = os.path.getsize(path)
  with open(path, "rb") as reader:
    offset = 0
    while offset < size:
      header = reader.read(12)
      if len(header) < 12:
        raise PrepareError("%s ends inside the record at byte %d; delete it and rerun"
                           % (path, offset))
      length = int.from_bytes(header[:8], "little")
      end = offset + 16 + length
      if end > size:
        raise PrepareError("%s: the record at byte %d runs past the end of the file; "
                           "delete it and rerun" % (path, offset))
      yield offset, length
      reader.seek(end)
      offset = end


def run_eval(layout, settings):
  """Step eval: picks exactly num_eval_samples records as MLCommons' pick_eval_samples."""
  marker = read_json(layout.marker("tfrecords", "eval_all"))
  if not marker_is_valid(layout, marker, settings, "tfrecords"):
    raise PrepareError("step eval needs %s from step tfrecords, which is not complete; run "
                       "--steps=tfrecords first" % layout.eval_all)
  inputs = {layout.relative(layout.eval_all):
            marker["outputs"][layout.relative(layout.eval_all)]}
  wanted = settings["num_eval_samples"]
  output = os.path.join(layout.eval_data, "eval_%d" % wanted)
  if marker_is_valid(layout, read_json(layout.marker("eval")), settings, "eval", inputs):
    _say("eval: done before")
    return
  os.makedirs(layout.eval_data, exist_ok=True)
  remove_stale_temporaries(layout.eval_data)
  available = marker["stats"]["num_instances"]
  if available < wanted:
    raise PrepareError(
        "the %d held-out articles gave %d eval instances, fewer than --num_eval_samples=%d; "
        "raise --num_eval_articles or lower --num_eval_samples (use a new --output_dir)"
        % (settings["num_eval_articles"], available, wanted))
  # MLCommons picks records[int(i * ratio)], spread evenly over the shuffled instances.
  ratio = available / wanted
  picked = set(int(i * ratio) for i in range(wanted))
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  temporary = "%s.tmp-%d" % (output, os.getpid())
  count = 0
  try:
    writer = tf.io.TFRecordWriter(temporary)
    with open(layout.eval_all, "rb") as reader:
      for index, (offset, length) in enumerate(iter_record_offsets(layout.eval_all)):
        if index in picked:
          # The payload follows the 8-byte length and its 4-byte CRC; the writer frames
          # it anew.
          reader.seek(offset + 12)
          writer.write(reader.read(length))
          count += 1
    writer.close()
    if count != wanted:
      raise PrepareError("%s holds fewer records than its marker says; delete it and rerun"
                         % layout.eval_all)
    os.replace(temporary, output)
  except tf.errors.OpError as e:
    _remove_quietly(temporary)
    raise os_error_from_tf(e, output)
  except BaseException:
    _remove_quietly(temporary)
    raise
  write_json(layout.marker("eval"), {
      "settings": step_settings(settings, "eval"), "inputs": inputs,
      "outputs": {layout.relative(output): file_digest(output)},
      "stats": {"num_instances": count, "picked_from": available}})
  _say("eval: picked %d of %d held-out instances -> %s" % (count, available, output))


# ----------------------------------------------------------------------------------------
# Step 7: manifest.
# ----------------------------------------------------------------------------------------


def run_manifest(layout, settings, verify=False):
  """Step manifest: gathers the markers into manifest.json (no timings: deterministic).

  Args:
    layout: Layout.
    settings: dict of the run's settings.
    verify: re-hash every output file instead of trusting the markers' sha256.

  Returns:
    the manifest dict.
  """
  markers = {}
  for step in ("extract", "clean", "segment", "shard", "eval"):
    markers[step] = read_json(layout.marker(step))
    if not markers[step] or markers[step].get("settings") != step_settings(settings, step):
      raise PrepareError("manifest needs every step done; step %s is not complete in %s; "
                         "run the whole pipeline (leave --steps out)" % (step, layout.root))
  shard_marker = markers["shard"]
  record_markers = {}
  for name in ["eval_all"] + [shard["name"] for shard in shard_marker["shards"]]:
    marker = read_json(layout.marker("tfrecords", name))
    if not marker_is_valid(layout, marker, settings, "tfrecords"):
      raise PrepareError("manifest needs every TFRecord file; %s is not complete; rerun "
                         "the pipeline to make it" % name)
    record_markers[name] = marker
  files = {}
  for marker in [shard_marker, markers["eval"]] + list(record_markers.values()):
    for relative_path, digest in marker["outputs"].items():
      if verify:
        actual = file_digest(layout.absolute(relative_path))
        if actual != digest:
          raise PrepareError("%s changed after it was made (sha256 %s, recorded %s); "
                             "delete it and rerun" % (relative_path, actual["sha256"],
                                                      digest["sha256"]))
      files[relative_path] = digest
  train = collections.Counter()
  for name, marker in record_markers.items():
    if name != "eval_all":
      train.update(marker["stats"])
  eval_stats = record_markers["eval_all"]["stats"]
  extract_stats = markers["extract"]["stats"]
  clean_stats = markers["clean"]["stats"]
  segment_stats = markers["segment"]["stats"]
  shard_stats = shard_marker["stats"]
  shard_sizes = [shard["bytes"] for shard in shard_marker["shards"]]
  manifest = {
      "tool": "tools/prepare_wiki.py",
      "settings": settings,
      "counts": {
          "pages": extract_stats.get("pages", 0),
          "dropped": {
              "non_article": clean_stats.get("dropped_non_article", 0),
              "redirect": clean_stats.get("dropped_redirect", 0),
              "disambiguation": clean_stats.get("dropped_disambiguation", 0),
              "near_empty": clean_stats.get("dropped_near_empty", 0),
              "no_sentences": segment_stats.get("dropped_no_sentences", 0)},
          "articles": segment_stats.get("articles", 0),
          "train": {
              "articles": shard_stats["train_articles"],
              "sentences": shard_stats["train_sentences"],
              "text_bytes": shard_stats["train_bytes"],
              "tokens": train["num_input_tokens"],
              "instances": train["num_instances"],
              "masked_tokens": train["num_masked_tokens"],
              "random_next": train["num_random_next"],
              "tfrecord_bytes": sum(m["outputs"][k]["bytes"]
                                    for n, m in record_markers.items() if n != "eval_all"
                                    for k in m["outputs"])},
          "eval": {
              "articles": shard_stats["eval_articles"],
              "sentences": shard_stats["eval_sentences"],
              "tokens": eval_stats["num_input_tokens"],
              "instances_made": eval_stats["num_instances"],
              "instances": markers["eval"]["stats"]["num_instances"]},
      },
      "shards": {"count": len(shard_sizes), "bytes_min": min(shard_sizes),
                 "bytes_max": max(shard_sizes)},
      "files": files,
  }
  write_json(layout.manifest, manifest)
  _say("manifest: %d files -> %s" % (len(files), layout.manifest))
  return manifest


# ----------------------------------------------------------------------------------------
# The run: settings, checks, lock.
# ----------------------------------------------------------------------------------------


def check_vocab(vocab):
  """Returns the vocab's sha256; raises PrepareError when it is missing or unusable."""
  if not os.path.isfile(vocab):
    raise PrepareError("vocab file %s does not exist; pass --vocab=<the model's vocab.txt, "
                       "for MLPerf the one in the checkpoint folder>" % vocab)
  try:
    tokens = tokenization.load_vocab(vocab)
  except (ValueError, UnicodeDecodeError) as e:
    raise PrepareError("vocab file %s cannot be read (%s); pass a BERT vocab.txt, one token "
                       "a line" % (vocab, e))
  missing = [t for t in _REQUIRED_TOKENS if t not in tokens]
  if missing:
    raise PrepareError("vocab file %s lacks %s; pass a BERT vocab.txt (with [CLS] [SEP] "
                       "[MASK] [UNK])" % (vocab, " ".join(missing)))
  return file_digest(vocab)["sha256"]


def reconcile_settings(layout, settings, step_list):
  """Checks the run's settings against output_dir/settings.json and records them.

  The file holds the settings of the steps run so far in the folder (and the dump's
  and vocab's identity); every one of them must match. Settings this run does not
  know (no --dump, no --vocab) are taken from the file.

  Args:
    layout: Layout.
    settings: dict; None values mean "not given in this run".
    step_list: the steps this run will run.

  Returns:
    the settings to run with.

  Raises:
    PrepareError: the folder was made with other settings, or holds other files.
  """
  stored = read_json(layout.settings)
  if stored is None:
    # work/ with its done/ markers is what a refused first run leaves (its settings.json
    # is taken back); its markers name their settings, so it does not block a rerun.
    own = [".lock"] + (["work"] if os.path.isdir(layout.done) else [])
    leftovers = [n for n in os.listdir(layout.root) if n not in own]
    if leftovers:
      raise PrepareError("output folder %s is not empty and holds no settings.json of "
                         "prepare_wiki (it has %s); pass an empty or new --output_dir"
                         % (layout.root, ", ".join(sorted(leftovers)[:3])))
    stored = {}
  else:
    stored = stored.get("settings", {})
  differences = []
  for key, value in settings.items():
    if value is not None and stored.get(key) is not None and stored[key] != value:
      differences.append("%s=%s there, %s now" % (key, json.dumps(stored[key]),
                                                   json.dumps(value)))
  if differences:
    raise PrepareError("output folder %s holds a run made with other settings (%s); pass "
                       "the same settings to resume it, or a new --output_dir"
                       % (layout.root, "; ".join(differences)))
  # Only the settings of steps that ran bind the folder: an extract-only first run
  # leaves the TFRecord settings free.
  relevant = set(["format_version", "dump_name", "dump_bytes", "vocab_sha256"])
  for step in step_list:
    relevant.update(STEP_SETTINGS.get(step, ()))
  recorded = dict(stored)
  recorded.update({k: v for k, v in settings.items() if k in relevant and v is not None})
  if recorded != stored:
    write_json(layout.settings, {"tool": "tools/prepare_wiki.py", "settings": recorded})
  effective = dict(settings)
  for key, value in stored.items():
    if effective.get(key) is None:
      effective[key] = value
  return effective


@contextlib.contextmanager
def locked(layout):
  """Holds an exclusive lock on output_dir, so two runs never write the same files."""
  handle = open(layout.lock, "a+")
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    handle.close()
    raise PrepareError("another prepare_wiki run is using %s; wait for it to finish or "
                       "pass another --output_dir" % layout.root)
  try:
    yield
  finally:
    handle.close()


def parse_steps(steps):
  """'extract,clean' or 'all' -> list of step names in pipeline order."""
  if steps in (None, "", "all"):
    return list(STEPS)
  names = [s.strip() for s in steps.split(",") if s.strip()]
  unknown = [s for s in names if s not in STEPS]
  if unknown:
    raise PrepareError("unknown step %s in --steps; use a comma-separated subset of %s"
                       % (unknown[0], ",".join(STEPS)))
  return [s for s in STEPS if s in names]


def run_pipeline(output_dir, dump=None, vocab=None, steps="all", jobs=1, verify=False,
                 **overrides):
  """Runs the requested steps; what is already complete is skipped.

  Args:
    output_dir: the output folder (created if missing).
    dump: path of the MediaWiki dump; needed by step extract.
    vocab: path of vocab.txt; needed by step tfrecords.
    steps: "all" or a comma-separated list of STEPS.
    jobs: processes for the parallel steps.
    verify: manifest re-hashes every output.
    **overrides: settings from DEFAULTS.

  Returns:
    the manifest dict when step manifest ran, else None.

  Raises:
    PrepareError: on bad input, with the problem and the fix.
  """
  unknown = set(overrides) - set(DEFAULTS)
  if unknown:
    raise TypeError("unknown settings %s" % sorted(unknown))
  step_list = parse_steps(steps)
  settings = dict(DEFAULTS)
  settings.update(overrides)
  _check_settings(settings, jobs)
  settings["format_version"] = FORMAT_VERSION
  settings["dump_name"] = settings["dump_bytes"] = settings["vocab_sha256"] = None
  if "extract" in step_list:
    if not dump:
      raise PrepareError("step extract needs --dump=<enwiki-...-pages-articles.xml[.bz2]>")
  if dump:
    if not os.path.isfile(dump):
      raise PrepareError("dump %s does not exist; pass --dump=<enwiki-...-pages-articles"
                         ".xml[.bz2]>" % dump)
    settings["dump_name"] = os.path.basename(dump)
    settings["dump_bytes"] = os.path.getsize(dump)
  if "tfrecords" in step_list:
    if not vocab:
      raise PrepareError("step tfrecords needs --vocab=<the model's vocab.txt>")
  if vocab:
    settings["vocab_sha256"] = check_vocab(vocab)
  if not output_dir:
    raise PrepareError("pass --output_dir=<folder for the dataset>")
  os.makedirs(output_dir, exist_ok=True)
  layout = Layout(output_dir)
  manifest = None
  with locked(layout):
    settings_before = _read_bytes(layout.settings)
    settings = reconcile_settings(layout, settings, step_list)
    finished = []
    try:
      for step in step_list:
        if step == "extract":
          run_extract(layout, settings, dump, jobs)
        elif step == "clean":
          run_clean(layout, settings, jobs)
        elif step == "segment":
          run_segment(layout, settings, jobs)
        elif step == "shard":
          run_shard(layout, settings)
        elif step == "tfrecords":
          run_tfrecords(layout, settings, vocab, jobs)
        elif step == "eval":
          run_eval(layout, settings)
        elif step == "manifest":
          manifest = run_manifest(layout, settings, verify)
        finished.append(step)
    except PrepareError:
      # A refused input (an HTML page, a cut dump) must not bind the folder to it:
      # settings.json goes back to what it was, so the corrected command is accepted.
      # The unfinished step's markers hold their own settings and are redone.
      if not finished:
        _restore_file(layout.settings, settings_before)
      raise
  return manifest


def _read_bytes(path):
  """The bytes of the file at path, or None when there is none."""
  try:
    with open(path, "rb") as f:
      return f.read()
  except FileNotFoundError:
    return None


def _restore_file(path, content):
  """Puts back the bytes _read_bytes returned (None: no file)."""
  if content is None:
    _remove_quietly(path)
  elif _read_bytes(path) != content:
    with atomic_output(path, binary=True) as writer:
      writer.write(content)


def _check_settings(settings, jobs):
  """Raises PrepareError naming the first setting out of range."""
  if jobs < 1:
    raise PrepareError("--jobs=%d must be >= 1" % jobs)
  for key in ("pages_per_chunk", "num_shards", "num_eval_articles", "num_eval_samples",
              "dupe_factor"):
    if settings[key] < 1:
      raise PrepareError("--%s=%d must be >= 1" % (key, settings[key]))
  if settings["num_shards"] > 99999:
    raise PrepareError("--num_shards=%d is too many; use at most 99999"
                       % settings["num_shards"])
  if settings["max_seq_length"] < 5:
    raise PrepareError("--max_seq_length=%d must be >= 5" % settings["max_seq_length"])
  if not 1 <= settings["max_predictions_per_seq"] <= settings["max_seq_length"]:
    raise PrepareError("--max_predictions_per_seq=%d must be between 1 and "
                       "--max_seq_length" % settings["max_predictions_per_seq"])
  if not 0 < settings["masked_lm_prob"] <= 1:
    raise PrepareError("--masked_lm_prob=%g must be in (0, 1]" % settings["masked_lm_prob"])
  if not 0 <= settings["short_seq_prob"] <= 1:
    raise PrepareError("--short_seq_prob=%g must be in [0, 1]" % settings["short_seq_prob"])


def describe_os_error(error):
  """One line for an OSError: a full disk says what to do."""
  where = " writing %s" % error.filename if error.filename else ""
  if error.errno == errno.ENOSPC:
    return ("the disk is full%s (No space left on device); free space there (the full "
            "MLPerf set needs about 450 GB, 365 GB of it TFRecords; work/ can go once "
            "step shard is done) and run the same command again: finished work is kept"
            % where)
  if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
    return ("cannot write%s (%s); pass an --output_dir you can write to"
            % (where, error.strerror))
  return "%s%s" % (error.strerror or error, where)


# ----------------------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------------------


def define_flags():
  """Defines the command-line flags; only when run as a script."""
  flags.DEFINE_string("dump", None,
                      "MediaWiki export: enwiki-YYYYMMDD-pages-articles.xml or .xml.bz2.")
  flags.DEFINE_string("vocab", None, "The model's WordPiece vocab.txt.")
  flags.DEFINE_string("output_dir", None, "Folder for the dataset (created if missing).")
  flags.DEFINE_string("steps", "all", "Steps to run: 'all' or a comma-separated subset of "
                      + ",".join(STEPS) + ".")
  flags.DEFINE_integer("jobs", os.cpu_count() or 1,
                       "Processes for the parallel steps (extract, clean, segment, "
                       "tfrecords); about 2 GB of memory each at the MLPerf settings.")
  flags.DEFINE_bool("verify", False, "Manifest: re-hash every output file.")
  flags.DEFINE_integer("pages_per_chunk", DEFAULTS["pages_per_chunk"],
                       "Pages per extraction chunk (the unit of resuming extract).")
  flags.DEFINE_integer("min_article_chars", DEFAULTS["min_article_chars"],
                       "Articles with less cleaned text than this are dropped.")
  flags.DEFINE_integer("num_shards", DEFAULTS["num_shards"], "Training text shards.")
  flags.DEFINE_integer("num_eval_articles", DEFAULTS["num_eval_articles"],
                       "Articles held out for the eval set (MLCommons: 10000).")
  flags.DEFINE_integer("num_eval_samples", DEFAULTS["num_eval_samples"],
                       "Records in the eval set (MLPerf: 10000).")
  flags.DEFINE_bool("do_lower_case", DEFAULTS["do_lower_case"],
                    "Lower-case and strip accents (True for uncased models).")
  flags.DEFINE_integer("max_seq_length", DEFAULTS["max_seq_length"],
                       "Maximum sequence length.")
  flags.DEFINE_integer("max_predictions_per_seq", DEFAULTS["max_predictions_per_seq"],
                       "Maximum masked LM predictions per sequence.")
  flags.DEFINE_float("masked_lm_prob", DEFAULTS["masked_lm_prob"], "Masked LM probability.")
  flags.DEFINE_float("short_seq_prob", DEFAULTS["short_seq_prob"],
                     "Probability of a shorter target length for a document.")
  flags.DEFINE_integer("dupe_factor", DEFAULTS["dupe_factor"],
                       "Passes over the data, each with other cuts and masks.")
  flags.DEFINE_integer("random_seed", DEFAULTS["random_seed"],
                       "Seed of create_pretraining_data (the same for every shard, as "
                       "MLCommons).")
  flags.DEFINE_bool("do_whole_word_mask", DEFAULTS["do_whole_word_mask"],
                    "Mask whole words (MLPerf: False).")


def main(argv):
  """Runs the pipeline from the flags; exits 1 with one line on bad input."""
  if len(argv) > 1:
    sys.exit("prepare_wiki: error: unexpected arguments %s; pass everything as --flags"
             % " ".join(argv[1:]))
  flag_values = flags.FLAGS
  if not flag_values["verbosity"].present:
    # create_pretraining_data logs two INFO lines per shard; the progress line suffices.
    logging.set_verbosity(logging.WARNING)
  try:
    run_pipeline(flag_values.output_dir, dump=flag_values.dump, vocab=flag_values.vocab,
                 steps=flag_values.steps, jobs=flag_values.jobs, verify=flag_values.verify,
                 **{key: flag_values[key].value for key in DEFAULTS})
  except PrepareError as e:
    sys.exit("prepare_wiki: error: %s" % e)
  except KeyboardInterrupt:
    sys.exit("prepare_wiki: interrupted; run the same command again to go on where it "
             "stopped")
  except ValueError as e:
    # create_pretraining_data's own one-line errors (an unusable vocab, say).
    sys.exit("prepare_wiki: error: %s" % e)
  except OSError as e:
    sys.exit("prepare_wiki: error: %s" % describe_os_error(e))
  layout = Layout(flag_values.output_dir)
  if os.path.exists(layout.manifest) and "manifest" in parse_steps(flag_values.steps):
    print("prepare_wiki: done. Train with --input_files_dir=%s --eval_files_dir=%s"
          % (layout.train_data, layout.eval_data))


if __name__ == "__main__":
  define_flags()
  app.run(main)
