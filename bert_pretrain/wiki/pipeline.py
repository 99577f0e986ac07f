"""The run: checks the inputs and settings against the output folder, then runs the steps.

output_dir/settings.json records the settings of the steps run so far. A folder made
from another dump is refused; another value of a step's setting (the vocab and
lower-casing are step tfrecords') redoes that step and the steps after it, keeping the
others' finished work. The same
dump, vocab and settings give byte-identical files, whatever --jobs and however many
runs it took.
"""

import collections
import json
import os
import shutil

from bert_pretrain import config
from bert_pretrain import errors
from bert_pretrain import pack_records
from bert_pretrain.data import tokenization
from bert_pretrain.processes import WorkerDied
from bert_pretrain.wiki.chunk_steps import run_clean, run_segment
from bert_pretrain.wiki.evalset import check_eval_samples, run_eval
from bert_pretrain.wiki.extract import check_dump, run_extract
from bert_pretrain.wiki.manifest import run_manifest
from bert_pretrain.wiki.pack import run_pack
from bert_pretrain.wiki.shard import run_shard
from bert_pretrain.wiki.tfrecords import run_tfrecords
from bert_pretrain.wiki.workdir import (FORMAT_VERSION, STEP_SETTINGS, Layout,
                                        PrepareError, atomic_output, file_digest,
                                        locked, marker_is_valid, read_json,
                                        remove_quietly, say, write_json)

STEPS = ("extract", "clean", "segment", "shard", "tfrecords", "pack", "eval", "manifest")

# Every setting that changes an output, with its default. --jobs is not one: it only
# changes how fast the same files are made.
DEFAULTS = collections.OrderedDict([
    ("pages_per_chunk", 20000),
    ("min_article_chars", 200),
    ("num_shards", 500),
    ("num_eval_articles", 10000),
    ("num_eval_samples", 10000),
    ("do_lower_case", True),
    ("max_seq_length", config.MAX_SEQ_LENGTH),
    ("max_predictions_per_seq", config.MAX_PREDICTIONS_PER_SEQ),
    ("masked_lm_prob", config.MASKED_LM_PROB),
    ("short_seq_prob", config.SHORT_SEQ_PROB),
    ("dupe_factor", config.DUPE_FACTOR),
    ("random_seed", config.DATA_SEED),
    ("do_whole_word_mask", False),
    ("max_sequences_per_pack", pack_records.MAX_SEQUENCES_PER_PACK),
])
# Which dump the folder is for: another value is refused, not redone, as it changes what
# every step makes. The vocab and lower-casing are step tfrecords' settings: a wrong
# vocab costs no text step.
FOLDER_SETTINGS = ("format_version", "dump_name", "dump_bytes")
# The steps each step reads: when a step is redone, the steps that read it are too.
_READS = {"clean": ("extract",), "segment": ("clean",), "shard": ("segment",),
          "tfrecords": ("shard",), "pack": ("tfrecords",), "eval": ("tfrecords",),
          "manifest": ("extract", "clean", "segment", "shard", "tfrecords", "pack",
                       "eval")}


def check_vocab(vocab):
  """Returns the vocab's sha256; raises PrepareError when it is missing or unusable."""
  if not os.path.isfile(vocab):
    raise PrepareError("vocab file %s %s; pass --vocab=<the model's vocab.txt, for MLPerf "
                       "the one in the checkpoint folder>"
                       % (vocab, "is a folder" if os.path.isdir(vocab) else "does not exist"))
  try:
    tokens = tokenization.load_vocab(vocab)
  except (ValueError, UnicodeDecodeError) as e:
    raise PrepareError("vocab file %s cannot be read (%s); pass a BERT vocab.txt, one token "
                       "a line" % (vocab, e))
  missing = tokenization.missing_special_tokens(tokens)
  if missing:
    raise PrepareError("vocab file %s lacks %s; pass a BERT vocab.txt (with [CLS] [SEP] "
                       "[MASK] [UNK])" % (vocab, " ".join(missing)))
  return file_digest(vocab)["sha256"]


def reconcile_settings(layout, settings, step_list, redo=False):
  """Checks the run's settings against output_dir/settings.json and records them.

  The file holds the settings of the steps run so far in the folder (and the dump's
  and vocab's identity). The dump must match; the vocab and lower-casing are settings
  of step tfrecords (a wrong vocab costs no text step). Another value
  of a step's setting is taken when this run runs that step: the steps that use it and
  those that read their output are forgotten (markers and outputs) and redone; the
  others' finished work is kept. Settings this run does not know (no --dump, no
  --vocab) are taken from the file.

  Args:
    layout: Layout.
    settings: dict; None values mean "not given in this run".
    step_list: the steps this run will run.
    redo: whether finished work of the steps to redo may be deleted (--redo_changed_steps);
      without it only steps that never finished are redone, so a flag left out by mistake
      costs no work.

  Returns:
    the settings to run with.

  Raises:
    PrepareError: the folder was made for another dump, or with other
      settings of a step this run leaves out, or of a step with finished work and not
      redo, or holds other files.
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
  differences = collections.OrderedDict()
  for key, value in settings.items():
    if value is not None and stored.get(key) is not None and stored[key] != value:
      differences[key] = "%s=%s there, %s now" % (key, json.dumps(stored[key]),
                                                 json.dumps(value))
  refused = [text for key, text in differences.items() if key in FOLDER_SETTINGS]
  if refused:
    raise PrepareError("output folder %s holds a run made with other settings (%s); pass "
                       "the same settings to resume it, or a new --output_dir"
                       % (layout.root, "; ".join(refused)))
  for key, text in differences.items():
    first = _steps_using(key)[0]
    if first not in step_list:
      # Redoing it would leave this run's steps without their input (or, with flags
      # left at their defaults, throw away work nobody asked to redo).
      raise PrepareError("output folder %s holds a run made with other settings (%s) of "
                         "step %s, which this run leaves out; pass the same settings to "
                         "resume it, or run step %s (and the steps after it) to redo it"
                         % (layout.root, text, first, first))
  if differences:
    redone = _redone_steps(set(s for key in differences for s in _steps_using(key)))
    done = [s for s in redone if _has_work(layout, s)]
    if done and not redo:
      raise PrepareError("output folder %s holds a run made with other settings (%s): that "
                         "redoes step%s %s, whose finished work would be deleted; pass "
                         "--redo_changed_steps to do so, or the same settings to resume"
                         % (layout.root, "; ".join(differences.values()),
                            "s" * (len(done) > 1), ", ".join(done)))
    if "eval" in redone and "tfrecords" not in redone:
      _check_kept_eval_records(layout, dict(stored, **{k: v for k, v in settings.items()
                                                       if v is not None}))
    now = [s for s in redone if s in step_list]
    later = [s for s in done if s not in step_list]
    say("settings changed (%s): redoing step%s %s%s; the finished work of the other "
        "steps is kept" % ("; ".join(differences.values()), "s" * (len(now) > 1),
                           ", ".join(now),
                           " (and %s when run)" % ", ".join(later) if later else ""))
    for step in redone:
      _forget_step(layout, step)
  # Only the settings of steps that ran bind the folder: an extract-only first run
  # leaves the TFRecord settings free.
  relevant = set(["format_version", "dump_name", "dump_bytes"])
  for step in step_list:
    relevant.update(STEP_SETTINGS.get(step, ()))
  recorded = dict(stored)
  recorded.update({k: v for k, v in settings.items() if k in relevant and v is not None})
  if recorded != stored:
    write_json(layout.settings, {"tool": "python3 -m bert_pretrain.wiki", "settings": recorded})
  effective = dict(settings)
  for key, value in stored.items():
    if effective.get(key) is None:
      effective[key] = value
  return effective


def _steps_using(key):
  """The steps whose outputs depend on setting `key`, in pipeline order."""
  return [step for step in STEPS if key in STEP_SETTINGS.get(step, ())]


def _redone_steps(changed):
  """The steps in `changed` and every step that reads their output, in pipeline order."""
  redone = set(changed)
  for step in STEPS:  # each step's inputs come before it in STEPS
    if redone.intersection(_READS.get(step, ())):
      redone.add(step)
  return [step for step in STEPS if step in redone]


def _output_paths(layout, step):
  """The folders (and files) that hold the outputs of `step`."""
  return {"extract": [layout.extracted], "clean": [layout.cleaned],
          "segment": [layout.sentences], "shard": [layout.text_train, layout.text_eval],
          "tfrecords": [layout.train_data, layout.eval_intermediate],
          "pack": [layout.packed_train_data], "eval": [layout.eval_data],
          "manifest": [layout.manifest]}[step]


def _has_work(layout, step):
  """Whether the folder holds any marker or output of `step`."""
  paths = [layout.marker(step), os.path.join(layout.done, step)] + _output_paths(layout,
                                                                                step)
  return any(os.path.isfile(p) or (os.path.isdir(p) and os.listdir(p)) for p in paths)


def _forget_step(layout, step):
  """Deletes the markers, then the outputs, of `step`: made with other settings, they
  must not be reused, nor lie beside the new ones (eval_data/eval_20 next to eval_5)."""
  remove_quietly(layout.marker(step))
  paths = [os.path.join(layout.done, step)] + _output_paths(layout, step)
  for path in paths:
    if os.path.isdir(path):
      # The folder stays (it may be a link to another disk); what is in it goes.
      for name in os.listdir(path):
        inner = os.path.join(path, name)
        if os.path.isdir(inner) and not os.path.islink(inner):
          shutil.rmtree(inner)
        else:
          os.remove(inner)
    elif os.path.isfile(path):
      os.remove(path)


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
                 pack=False, redo_changed_steps=False, **overrides):
  """Runs the requested steps; what is already complete is skipped.

  Args:
    output_dir: the output folder (created if missing).
    dump: path of the MediaWiki dump; needed by step extract.
    vocab: path of vocab.txt; needed by step tfrecords.
    steps: "all" or a comma-separated list of STEPS.
    jobs: processes for the parallel steps.
    verify: manifest re-hashes every output.
    pack: run step pack (packed training records); without it, step pack is left
      out.
    redo_changed_steps: a changed setting may delete the finished work of the steps it
      redoes (reconcile_settings' redo).
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
  if not pack:
    if "pack" in step_list and steps not in (None, "", "all"):
      raise PrepareError("step pack packs the training records only with --pack; pass "
                         "--pack")
    step_list = [step for step in step_list if step != "pack"]
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
      raise PrepareError("dump %s %s; pass --dump=<enwiki-...-pages-articles.xml[.bz2]>"
                         % (dump, "is a folder" if os.path.isdir(dump) else "does not exist"))
    settings["dump_name"] = os.path.basename(dump)
    settings["dump_bytes"] = os.path.getsize(dump)
    if "extract" in step_list:
      check_dump(dump)
  if "tfrecords" in step_list:
    if not vocab:
      raise PrepareError("step tfrecords needs --vocab=<the model's vocab.txt>")
  if vocab:
    settings["vocab_sha256"] = check_vocab(vocab)
  if not output_dir:
    raise PrepareError("pass --output_dir=<folder for the dataset>")
  layout = Layout(output_dir)
  manifest = None
  with locked(layout):
    settings_before = _read_bytes(layout.settings)
    settings = reconcile_settings(layout, settings, step_list, redo_changed_steps)
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
          run_tfrecords(layout, settings, vocab, jobs, check_eval="eval" in step_list)
        elif step == "pack":
          run_pack(layout, settings, jobs)
        elif step == "eval":
          run_eval(layout, settings)
        elif step == "manifest":
          manifest = run_manifest(layout, settings, verify)
        finished.append(step)
    except (PrepareError, WorkerDied):
      # A refused input (an HTML page, a cut dump) must not bind the folder to it, nor a
      # first step whose worker died (run again maybe with other settings): settings.json
      # goes back to what it was, so the corrected command is accepted.
      # The unfinished step's markers hold their own settings and are redone.
      if not finished:
        _restore_file(layout.settings, settings_before)
      raise
  return manifest


def _check_kept_eval_records(layout, settings):
  """Raises PrepareError, before step eval's finished work is deleted, when the held-out
  records step tfrecords made and keeps hold fewer than the new --num_eval_samples."""
  marker = read_json(layout.marker("tfrecords", "eval_all"))
  if marker_is_valid(layout, marker, settings, "tfrecords"):
    check_eval_samples(settings, marker["stats"]["num_instances"])


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
    remove_quietly(path)
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
  if settings["max_sequences_per_pack"] < 1:
    raise PrepareError("--max_sequences_per_pack=%d must be >= 1 (MLPerf's submitters: 3)"
                       % settings["max_sequences_per_pack"])
  if not 0 <= settings["random_seed"] < 2 ** 32:  # numpy's seeds, for step pack
    raise PrepareError("--random_seed=%d must be from 0 to %d"
                       % (settings["random_seed"], 2 ** 32 - 1))
  if settings["max_seq_length"] < 5:
    raise PrepareError("--max_seq_length=%d must be >= 5" % settings["max_seq_length"])
  if not 1 <= settings["max_predictions_per_seq"] <= settings["max_seq_length"]:
    raise PrepareError("--max_predictions_per_seq=%d must be between 1 and "
                       "--max_seq_length" % settings["max_predictions_per_seq"])
  if not 0 < settings["masked_lm_prob"] <= 1:
    raise PrepareError("--masked_lm_prob=%g must be in (0, 1]" % settings["masked_lm_prob"])
  if not 0 <= settings["short_seq_prob"] <= 1:
    raise PrepareError("--short_seq_prob=%g must be in [0, 1]" % settings["short_seq_prob"])


def describe_os_error(error, output_dir=None):
  """One line for an OSError (errors.os_error_message); a full disk also says what the
  dataset needs, and where: the file, else (an error that names none) output_dir."""
  named = getattr(error, "filename", None) or not output_dir
  return errors.os_error_message(error, disk_full=lambda what: (
      "the disk is full writing %s (No space left on device); free space there (the full "
      "MLPerf set needs about 450 GB, 365 GB of it TFRecords; work/ can go once step "
      "shard is done) and run the same command again: finished work is kept"
      % (what if named else "files in %s" % output_dir)))
