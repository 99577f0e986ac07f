"""Step tfrecords: bert_pretrain.create_pretraining_data on every text shard.

One task per shard, --jobs at once -> train_data/part-00000-of-00500 ..., and one on the
held-out text -> eval_intermediate/eval_all. TensorFlow is loaded only by the tasks.
"""

import multiprocessing
import os
import time

from bert_pretrain.data import tokenization
from bert_pretrain.processes import run_tasks
from bert_pretrain.wiki.evalset import check_eval_samples
from bert_pretrain.wiki.shard import valid_shard_marker
from bert_pretrain.wiki.workdir import (Layout, PrepareError, Progress, file_digest,
                                        marker_is_valid, read_json,
                                        remove_quietly, remove_stale_temporaries, say,
                                        step_settings, write_json)

# Above this share of [UNK] in the held-out text the vocab is not the text's (the wrong
# file, or another language): the training shards, hours on a whole dump, are not made.
UNKNOWN_ERROR_SHARE = 0.5


class UnknownTokens(PrepareError):
  """The vocab leaves more than UNKNOWN_ERROR_SHARE of the held-out text unknown."""


def _check_unknown_tokens(stats, vocab, settings, stop=True):
  """Warns when the held-out text's tokens (step tfrecords' stats of eval_all) are more
  than a few [UNK]; with stop, raises UnknownTokens above UNKNOWN_ERROR_SHARE."""
  warning = tokenization.unknown_tokens_warning(
      stats["num_unknown_tokens"], stats["num_input_tokens"],
      tokenization.casing_fix(vocab, settings["do_lower_case"], "--vocab"))
  if stop and stats["num_unknown_tokens"] > UNKNOWN_ERROR_SHARE * stats["num_input_tokens"]:
    raise UnknownTokens("%s; the records this run made with it are deleted, the text "
                        "steps' work is kept" % warning)
  if warning:
    say("warning: " + warning)


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
  from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
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
    raise records.os_error_from_tf(e, output)
  stats.pop("seconds", None)
  write_json(layout.marker("tfrecords", name), {
      "settings": step_settings(settings, "tfrecords"),
      "inputs": {layout.relative(source): source_digest},
      "outputs": {layout.relative(output): file_digest(output)},
      "stats": stats})
  return {"name": name, "input_bytes": source_digest["bytes"]}


def run_tfrecords(layout, settings, vocab, jobs, check_eval=False):
  """Step tfrecords: every text shard and the held-out text -> TFRecords.

  With check_eval (step eval follows), eval_all is made first and a --num_eval_samples
  above its instances is refused then, not after every training shard.
  """
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
    marker = read_json(layout.marker("tfrecords", name))
    if not marker_is_valid(layout, marker, settings, "tfrecords", inputs):
      tasks.append((layout.root, settings, vocab, name, source, digest, output))
    elif name == "eval_all":
      # Made before (by a version that only warned): said again, its work kept.
      _check_unknown_tokens(marker["stats"], vocab, settings, stop=False)
      if check_eval:
        check_eval_samples(settings, marker["stats"]["num_instances"])
  # eval_all first (it decides whether --num_eval_samples can be met), then the largest
  # first, so no big shard is left alone at the end.
  tasks.sort(key=lambda task: (task[3] != "eval_all", -task[5]["bytes"]))
  total = sum(task[5]["bytes"] for task in tasks)
  progress = Progress("tfrecords", total)
  done = [0, 0]
  started = time.time()

  def on_result(result):
    done[0] += result["input_bytes"]
    done[1] += 1
    progress.update(done[0])
    if result["name"] == "eval_all":
      # The held-out text goes first: a vocab that does not fit it is told before the rest.
      stats = read_json(layout.marker("tfrecords", "eval_all"))["stats"]
      _check_unknown_tokens(stats, vocab, settings)
      if check_eval:
        check_eval_samples(settings, stats["num_instances"])

  # spawn: each worker starts TensorFlow itself rather than inheriting a forked one.
  try:
    run_tasks(tfrecord_task, tasks, jobs, on_result, context="spawn")
  except UnknownTokens:
    # The records this run made with a vocab that does not fit go; earlier runs' stay.
    for _, _, _, name, _, _, output in tasks:
      remove_quietly(layout.marker("tfrecords", name))
      remove_quietly(output)
    raise
  elapsed = time.time() - started
  say("tfrecords: %d files made (%d done before) in %.1f s, %.2f MB/s of text"
       % (len(tasks), len(units) - len(tasks), elapsed,
          total / 1e6 / elapsed if elapsed > 0 and total else 0.0))
