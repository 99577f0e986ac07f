"""Steps clean and segment, each per chunk, in parallel, from the chunks of the step before.

  clean    drops redirects, disambiguation pages, other namespaces, markup remnants
           (clean.clean_text) and near-empty articles -> work/cleaned/chunk-NNNNN.jsonl.
  segment  one sentence a line (sentences.split_sentences) -> work/sentences/*.jsonl,
           with each article's title_key, which step shard uses to pick held-out articles.
"""

import collections
import hashlib
import json
import os
import time

from bert_pretrain.processes import run_tasks
from bert_pretrain.wiki.clean import clean_text
from bert_pretrain.wiki.sentences import split_sentences
from bert_pretrain.wiki.workdir import (Layout, PrepareError, Progress, atomic_output,
                                        file_digest, marker_is_valid, read_json,
                                        remove_stale_temporaries, say, step_settings,
                                        write_json)


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
  say("%s: %d chunks (%d done before) in %.1f s: %s"
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
