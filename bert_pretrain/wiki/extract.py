"""Step extract: MediaWiki XML -> plain-text pages, work/extracted/chunk-NNNNN.jsonl.

The dump (.xml or .xml.bz2; a -multistream .bz2 is decompressed in --jobs threads) is
streamed through an incremental XML parser, --pages_per_chunk pages a chunk; each chunk
is converted (markup.wikitext_to_text) and written with its done-marker, --jobs chunks
at once.
"""

import bz2
import collections
import concurrent.futures
import itertools
import json
import os
import re
import time
import xml.etree.ElementTree as ElementTree

from bert_pretrain import processes
from bert_pretrain.wiki.markup import wikitext_to_text
from bert_pretrain.wiki.workdir import (Layout, PrepareError, Progress, atomic_output,
                                        file_digest, marker_is_valid, read_json,
                                        remove_stale_temporaries, say, step_settings,
                                        write_json)

_DISAMBIGUATION_RE = re.compile(
    r"\{\{\s*(?:disambig\w*|dab|disamb|hndis|geodis|numberdis|[^{}|\n]*disambiguation)"
    r"\s*(?:\||\}\})", re.I)
_REDIRECT_RE = re.compile(r"^\s*#redirect", re.I)


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


def _xml_blocks(reader, jobs=1):
  """Yields the XML of a dump in blocks, decompressing it as needed.

  Args:
    reader: the dump file (a _CountingReader).
    jobs: a multistream .bz2 is decompressed in this many threads, in order.

  Yields:
    bytes.
  """
  magic = reader.raw.read(3)
  reader.raw.seek(0)
  if magic != b"BZh":
    stream = reader
  elif jobs > 1 and _is_multistream_bz2(reader.raw):
    # One thread decompresses bz2 at ~15 MB/s of XML, slower than the converters
    # together; Wikimedia's multistream dumps can be cut between streams instead. bz2
    # lets go of the GIL while it works, so threads use the cores, and the blocks (tens
    # of MB) cross no pipe, where a worker killed mid-send would leave a reader waiting.
    pending = collections.deque()
    with concurrent.futures.ThreadPoolExecutor(jobs) as threads:
      try:
        for segment in _bz2_segments(reader):
          pending.append(threads.submit(bz2.decompress, segment))
          while len(pending) > jobs:
            yield processes.result(pending.popleft())
        while pending:
          yield processes.result(pending.popleft())
      finally:
        for future in pending:
          future.cancel()
    return
  else:
    stream = bz2.BZ2File(reader)
  while True:
    block = stream.read(_XML_BLOCK)
    if not block:
      return
    yield block


def check_dump(dump_path):
  """Raises PrepareError unless dump_path starts as a MediaWiki XML export (.xml or
  .xml.bz2); reads it only up to its root element, so a wrong file is refused at once."""
  for _ in iter_pages(dump_path, root_only=True):
    pass


def iter_pages(dump_path, counter=None, jobs=1, root_only=False):
  """Streams the pages of a MediaWiki XML export (.xml or .xml.bz2).

  Args:
    dump_path: path of the dump.
    counter: (optional) list; counter[0] is set to the (compressed) bytes read so far.
    jobs: threads that decompress a multistream .bz2.
    root_only: stop after checking the root element (check_dump).

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
    for block in itertools.chain(_xml_blocks(reader, jobs), [None]):
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
          if root_only:
            return
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
                       "the dump again, then rerun" % (dump_path, e, pages))
  except EOFError:
    raise PrepareError("%s ends inside its bz2 stream after %d pages (cut short); download "
                       "the dump again, then rerun" % (dump_path, pages))
  except ValueError as e:
    # bz2.decompress of a piece cut short (multistream path).
    if "end-of-stream" not in str(e):
      raise
    raise PrepareError("%s ends inside its bz2 stream after %d pages (cut short); download "
                       "the dump again, then rerun" % (dump_path, pages))
  except OSError as e:
    if e.errno is None:
      raise PrepareError("%s is not a valid bz2 file (%s) after %d pages; download the "
                         "dump again, then rerun" % (dump_path, e, pages))
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
    say("extract: done before (%d chunks)" % step_marker["num_chunks"])
    return step_marker["num_chunks"]
  pages_per_chunk = settings["pages_per_chunk"]
  progress = Progress("extract", settings["dump_bytes"])
  counter = [0]
  num_chunks = [0]
  skipped = [0]

  def chunks():
    """Yields the extract tasks of the chunks not done yet, counting the others."""
    batch = []
    index = 0
    chunk_done = None
    for page in iter_pages(dump_path, counter, jobs):
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
    with processes.WorkerPool(jobs) as pool:
      pending = collections.deque()
      for index, chunk_done, batch in chunks():
        num_chunks[0] = index + 1
        if chunk_done:
          skipped[0] += 1
          continue
        pending.append(pool.submit(extract_chunk, (layout.root, settings, index, batch)))
        while len(pending) > jobs:
          processes.result(pending.popleft())
      while pending:
        processes.result(pending.popleft())
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
  say("extract: %d pages in %d chunks (%d done before) in %.1f s"
       % (summary["pages"], num_chunks[0], skipped[0], time.time() - started))
  return num_chunks[0]
