"""Step eval: the eval set, exactly --num_eval_samples records -> eval_data/eval_<k>.

Record int(i * n / k) for i < k of the n held-out instances, as MLCommons'
pick_eval_samples.py.
"""

import os

from bert_pretrain.wiki.workdir import (PrepareError, atomic_records, file_digest,
                                        marker_is_valid, read_json,
                                        remove_stale_temporaries, say, step_settings,
                                        write_json)


def check_eval_samples(settings, available):
  """Raises PrepareError when the held-out articles gave fewer than --num_eval_samples
  instances (`available`); step tfrecords calls it as soon as eval_all is made."""
  if available < settings["num_eval_samples"]:
    raise PrepareError(
        "the %d held-out articles gave %d eval instances, fewer than "
        "--num_eval_samples=%d; lower --num_eval_samples (to %d at most) and run again, "
        "or raise --num_eval_articles and run again with --redo_changed_steps (it redoes "
        "the shards and records)"
        % (settings["num_eval_articles"], available, settings["num_eval_samples"],
           available))


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
    say("eval: done before")
    return
  os.makedirs(layout.eval_data, exist_ok=True)
  remove_stale_temporaries(layout.eval_data)
  available = marker["stats"]["num_instances"]
  check_eval_samples(settings, available)
  # MLCommons picks records[int(i * ratio)], spread evenly over the shuffled instances.
  ratio = available / wanted
  picked = set(int(i * ratio) for i in range(wanted))
  from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
  offsets, framing_error = records.record_offsets(layout.eval_all)
  if framing_error:
    raise PrepareError("%s is %s; delete it and rerun" % (layout.eval_all, framing_error))
  count = 0
  with atomic_records(output) as writer:
    # The writer frames each picked example anew.
    for _, _, serialized in records.read_records(layout.eval_all, offsets, picked):
      writer.write(serialized)
      count += 1
    if count != wanted:
      raise PrepareError("%s holds fewer records than its marker says; delete it and rerun"
                         % layout.eval_all)
  write_json(layout.marker("eval"), {
      "settings": step_settings(settings, "eval"), "inputs": inputs,
      "outputs": {layout.relative(output): file_digest(output)},
      "stats": {"num_instances": count, "picked_from": available}})
  say("eval: picked %d of %d held-out instances -> %s" % (count, available, output))
