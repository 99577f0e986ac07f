"""Wikitext to plain text (wikitext_to_text), what step extract keeps of an article.

Templates (nested ones too; a few inline ones are rendered), tables, references,
comments, files and categories, lists, the sections of references and links and HTML
tags are removed; links keep their text. Close to WikiExtractor's default output.
"""

import html
import re

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
SPACES_RE = re.compile(r"[ \t\u00a0\u2009\u200b]+")
_NAMED_ARGUMENT_RE = re.compile(r"^\s*[\w \-]+\s*=", re.U)
_INTERLANGUAGE_RE = re.compile(r"^[a-z]{2,3}(?:-[a-z]+)*$")

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
  text = SPACES_RE.sub(" ", text)
  paragraphs = []
  for line in text.split("\n"):
    line = line.strip()
    if line:
      paragraphs.append(line)
  return "\n".join(paragraphs)
