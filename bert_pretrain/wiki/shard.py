"""Step shard: the held-out articles and the balanced training text shards.

Holds out the --num_eval_articles articles with the smallest sha256 of their title, and
deals the others to --num_shards text shards balanced by bytes ->
text/train/part-00000-of-00500 ..., text/eval/eval.txt.
"""

import contextlib
import heapq
import json
import os
import time

from bert_pretrain.wiki.workdir import (PrepareError, Progress, atomic_output, file_digest,
                                        marker_is_valid, read_json,
                                        remove_stale_temporaries, say, step_settings,
                                        write_json)


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
    say("shard: done before")
    return
  num_articles = len(keys)
  if num_articles < num_eval + num_shards:
    raise PrepareError(
        "the dump gives %d articles, too few for %d held-out articles and %d shards of at "
        "least one article; lower --num_eval_articles or --num_shards and run again: "
        "the finished work of the steps before is kept"
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
  say("shard: %d training articles in %d shards (%d to %d bytes), %d held out, in %.1f s"
       % (sum(shard_articles), num_shards, min(shard_bytes), max(shard_bytes),
          eval_articles, time.time() - started))


def valid_shard_marker(layout, settings, inputs=None):
  """Returns the shard step's marker if it is complete, else None."""
  marker = read_json(layout.marker("shard"))
  if marker_is_valid(layout, marker, settings, "shard", inputs):
    return marker
  return None
