"""Step manifest: manifest.json, with the settings, the counts and every output's sha256.

Counts of pages, dropped pages, articles, sentences, tokens, instances and bytes (and,
after step pack, the packs), from the done-markers; no timings, so the same inputs give
the same file.
"""

import collections

from bert_pretrain.wiki.workdir import (PrepareError, file_digest, marker_is_valid,
                                        read_json, say, step_settings, write_json)


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
  # Step pack ran (--pack): its packed records are outputs too.
  pack_marker = read_json(layout.marker("pack"))
  if not marker_is_valid(layout, pack_marker, settings, "pack"):
    pack_marker = None
  files = {}
  for marker in ([shard_marker, markers["eval"]] + list(record_markers.values()) +
                 [pack_marker] * bool(pack_marker)):
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
      "tool": "python3 -m bert_pretrain.wiki",
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
  if pack_marker:
    manifest["packed"] = pack_marker["stats"]
  write_json(layout.manifest, manifest)
  say("manifest: %d files -> %s" % (len(files), layout.manifest))
  return manifest
