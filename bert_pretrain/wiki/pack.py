"""Step pack (with --pack): the training TFRecords packed -> packed_train_data/.

python3 -m bert_pretrain.pack_records on train_data/, in its own resumable folder,
--max_sequences_per_pack sequences a record at most, shuffled with --random_seed. The
eval set stays unpacked (MLPerf evaluates eval_10k as it is).
"""

import os

from bert_pretrain import pack_records
from bert_pretrain.wiki.shard import valid_shard_marker
from bert_pretrain.wiki.workdir import (PrepareError, marker_is_valid, read_json, say,
                                        step_settings, write_json)


def run_pack(layout, settings, jobs):
  """Step pack: packs every training TFRecord file of step tfrecords."""
  shard_marker = valid_shard_marker(layout, settings)
  inputs = {}
  if shard_marker:
    for shard in shard_marker["shards"]:
      marker = read_json(layout.marker("tfrecords", shard["name"]))
      if not marker_is_valid(layout, marker, settings, "tfrecords"):
        break
      path = os.path.join(layout.train_data, shard["name"])
      inputs[path] = marker["outputs"][layout.relative(path)]
  if not shard_marker or len(inputs) != len(shard_marker["shards"]):
    raise PrepareError("step pack needs the TFRecords of step tfrecords, which are not "
                       "complete in %s; run --steps=tfrecords first (or leave --steps out)"
                       % layout.root)
  relative_inputs = {layout.relative(path): digest for path, digest in inputs.items()}
  if marker_is_valid(layout, read_json(layout.marker("pack")), settings, "pack",
                     relative_inputs):
    say("pack: done before")
    return
  summary = pack_records.pack(
      sorted(inputs), layout.packed_train_data,
      max_sequences_per_pack=settings["max_sequences_per_pack"],
      seed=settings["random_seed"], jobs=jobs,
      identities=inputs)
  outputs = {}
  for name in pack_records.output_names(summary["files"]):
    marker = read_json(os.path.join(layout.packed_train_data, "work", "done", "write",
                                    name + ".json"))
    outputs[layout.relative(os.path.join(layout.packed_train_data, name))] = (
        marker["outputs"][name])
  stats = {key: summary[key] for key in ("sequences_in", "sequences_out", "packs",
                                         "sequences_per_pack", "padding_before",
                                         "padding_after")}
  write_json(layout.marker("pack"), {"settings": step_settings(settings, "pack"),
                                     "inputs": relative_inputs, "outputs": outputs,
                                     "stats": stats})
  say("pack: %s" % pack_records.summary_line(summary, layout.packed_train_data).split(
      ": ", 1)[1])
