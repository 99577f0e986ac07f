"""Where a resumed pretraining run continues, and what every process of a job must share.

The run records its layout, seed and training files in output_dir/bert_pretrain_run.json
(run_record); each checkpoint holds the records of the data order consumed. resume_plan
decides where the data order continues, or refuses a change the run cannot honour;
choose_seed agrees on the seed and checks, as the job's first collective, that every
process runs with the same settings.
"""

import collections
import hashlib
import os

import tensorflow.compat.v1 as tf

from bert_pretrain import config
from bert_pretrain.training import checkpoints
from bert_pretrain.training import inputs as inputs_lib

# The settings every process of a job must share (checked by ranks.agree before the first
# collective): those that decide which collectives run when (a process that differs
# waits in one the others never start) and those that would train replicas apart.
JOB_SETTINGS = ("num_train_steps", "train_batch_size", "num_accumulation_steps",
             "allreduce_post_accumulation", "do_train", "do_eval", "eval_at_start",
             "eval_batch_size", "max_eval_steps", "samples_between_eval",
             "samples_start_eval", "stop_threshold", "display_loss_steps",
             "max_seq_length", "max_predictions_per_seq", "optimizer", "learning_rate",
             "num_warmup_steps", "start_warmup_step", "poly_power", "scale_lr_by_ranks",
             "weight_decay_rate", "beta_1", "beta_2", "epsilon", "init_loss_scale",
             "shuffle_buffer", "seed", "lamb_adapt_layernorm_and_bias", "gradient_clipping",
             "reference_hyperparameters", "cross_replica_gradients", "lr_schedule_step")


# The flags of the learning-rate schedule, a function of the step: a resumed run that
# changes one follows the new schedule from its first update (resume_plan says so).
SCHEDULE = ("learning_rate", "num_warmup_steps", "start_warmup_step", "poly_power",
            "num_train_steps", "scale_lr_by_ranks")

# How an update combines its gradients and reads the schedule, with what a run marker of
# an older version (without them) did.
UPDATE_RULE = {"cross_replica_gradients": "mean", "lr_schedule_step": "update"}


def run_record(cfg, bert_config, ranks, seed, global_batch_size, train_files,
               learning_rate, compute):
  """What bert_pretrain_run.json records: the settings a resumed run must share
  (inputs.resume_settings), the layout, the seed, the training files, what else decides
  their order (data_order), the learning-rate schedule: its flags and its peak
  (learning_rate: --learning_rate, times the replicas with --scale_lr_by_ranks), and the
  compute type (compute: its name, e.g. "bfloat16")."""
  record = inputs_lib.resume_settings(cfg, bert_config)
  values = config.as_flags(cfg)
  record.update(layout=layout(cfg, ranks.distribution, ranks.size, ranks.replicas,
                              global_batch_size),
                seed=seed, train_files=data_files(train_files),
                data_order=data_order(cfg),
                schedule=dict({k: values[k] for k in SCHEDULE}, peak=learning_rate),
                update_rule={k: values[k] for k in UPDATE_RULE}, compute=compute)
  return record


def layout(cfg, distribution, processes, replicas, global_batch_size):
  """How a run spreads its global batch: its engine, processes and replicas, the batch
  of each replica and the micro-batches of an update."""
  return {"distribution": distribution, "processes": processes, "replicas": replicas,
          "train_batch_size": cfg.run.train_batch_size,
          "num_accumulation_steps": cfg.optimizer.num_accumulation_steps,
          "global_batch_size": global_batch_size}


def check_launch(cfg, inputs, processes):
  """What resume_plan would refuse of a Horovod job of `processes` ranks (None: not
  known, nothing to check) before any starts: another global batch than the run's in
  --output_dir (run_multi_card_FPS.sh's DRY_RUN=1 and its check before the ranks)."""
  if processes is None or cfg.runtime.engine() != "horovod":
    return
  check_global_batch(cfg, inputs, layout(
      cfg, "horovod", processes, processes,
      inputs_lib.global_batch_size(cfg, processes, inputs.packing)))


def check_global_batch(cfg, inputs, now):
  """Raises ValueError when the run resumed from --output_dir had another global batch
  than layout `now` and --allow_resume_change does not name global_batch: the schedules
  and --num_train_steps count updates."""
  was = (inputs.earlier_run or {}).get("layout")
  if (not inputs.resume_checkpoint or not cfg.run.do_train or not was or
      was["global_batch_size"] == now["global_batch_size"] or
      "global_batch" in cfg.run.allow_resume_change):
    return
  where = "%s %d of the data order" % _position(inputs, was)
  raise ValueError("--output_dir=%s was trained with a global batch of %d (%s) and this "
                   "run's is %d (%s), while --num_train_steps and the learning-rate and "
                   "evaluation schedules count updates; keep the global batch (batch x "
                   "accumulation x replicas = %d) or pass --allow_resume_change=global_batch "
                   "to continue at %s with updates of %d"
                   % (cfg.run.output_dir, was["global_batch_size"], describe_layout(was),
                      now["global_batch_size"], describe_layout(now),
                      was["global_batch_size"], where, now["global_batch_size"]))


def _position(inputs, counted):
  """(unit, position): where in the data order the resumed run continues; its records
  are packs in a packed set. counted: the layout whose global batches an older
  checkpoint, which records no position, is counted in."""
  position = inputs.resume_position
  if position is None:  # An older version's checkpoint: it consumed step global batches.
    position = inputs.resume_step * counted["global_batch_size"]
  return ("pack" if inputs.packing.max_sequences is not None else "sample"), position


def data_order(cfg):
  """What, beside the seed and the files, decides the order of the training records:
  the shuffle buffer, and TensorFlow's version (tf.data's shuffles draw otherwise in
  1.15 and 2.x)."""
  return {"shuffle_buffer": cfg.data.shuffle_buffer,
          "tensorflow": ".".join(tf.__version__.split(".")[:2])}


def code_digest(package=None):
  """A number from the digest of bert_pretrain's own files (its .py and .cc; package:
  its folder, default this one): the processes of one job run one checkout (a host with
  an older copy computes otherwise)."""
  package = package or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  paths = []
  for folder, folders, names in os.walk(package):
    folders[:] = [f for f in folders if f != "__pycache__"]
    # Not an editor's lock or backup (.#modeling.py, a dangling link).
    paths.extend(os.path.join(folder, n) for n in names if n.endswith((".py", ".cc")) and
                 not n.startswith(".") and os.path.isfile(os.path.join(folder, n)))
  digest = hashlib.sha256()
  for path in sorted(paths):
    digest.update(os.path.relpath(path, package).encode() + b"\0")
    with open(path, "rb") as f:
      digest.update(f.read())
  return int(digest.hexdigest()[:12], 16)  # below 2^53: exact in the gathered floats


def data_files(files):
  """[name, bytes] of each training file: the data the order is made of (the folder
  may move)."""
  return [[os.path.basename(f), tf.gfile.Stat(f).length] for f in files]


def describe_layout(layout):
  """'horovod, 2 processes, 2 replicas x batch 4 x 1 accumulation = global batch 8'; a
  run without distribution has no engine to name: '1 process, 1 replica x ...'."""
  engine = "" if layout["distribution"] == "none" else layout["distribution"] + ", "
  return ("%s%d process%s, %d replica%s x batch %d x %d accumulation = global batch %d"
          % (engine, layout["processes"],
             "es" if layout["processes"] > 1 else "", layout["replicas"],
             "s" if layout["replicas"] > 1 else "", layout["train_batch_size"],
             layout["num_accumulation_steps"], layout["global_batch_size"]))


def _files_change(earlier, now):
  """How two data_files lists differ, in a few words (None: they do not)."""
  if earlier == now:
    return None
  before, after = dict(map(tuple, earlier)), dict(map(tuple, now))
  for name in sorted(set(before) | set(after)):
    if name not in after:
      return "%s is not among this run's training files" % name
    if name not in before:
      return "%s is a new training file" % name
    if before[name] != after[name]:
      return "%s was %d bytes, now %d" % (name, before[name], after[name])
  return "the files are the same but listed in another order"


# What resume_plan decided: the place in the data order to continue at, the lines to
# log, and whether bert_pretrain_run.json may be written now (False: at the first save,
# so that it describes the newest checkpoint until then).
Resume = collections.namedtuple("Resume", ["position", "lines", "record_now"])


def resume_plan(cfg, inputs, record):
  """Where the data order continues and what a resumed run says about it.

  The run records its layout, seed and training files (run_record); the checkpoint
  holds the records of the data order consumed (checkpoints.DATA_POSITION), whatever
  the layouts of the runs that made it. The order itself does not depend on the layout
  (input_pipeline.make_dataset), so:
  - the same layout continues exactly, as an uninterrupted run would;
  - another layout of the same global batch (ranks, engine, per-card batch,
    accumulation) continues at the same sample, re-sharded: each update still takes
    the next global batch of the order, and the step count, learning-rate and
    evaluation schedules, which count updates, keep their meaning (where an update
    reads the schedule may follow the accumulation, and summed gradients the ranks:
    said, as another --cross_replica_gradients or --lr_schedule_step is);
  - another global batch is refused unless --allow_resume_change=global_batch: those
    schedules and --num_train_steps count updates, which would then hold another
    number of samples than the run was planned with;
  - another --seed, other training files, another --shuffle_buffer or TensorFlow
    version are refused unless allowed: the place in the order would then name other
    records (some repeated, others never trained on);
  - another learning-rate schedule (SCHEDULE) is followed from the next update on, and
    said.

  Args:
    cfg: config.Settings (cfg.run.seed: --seed, None when not given).
    inputs: inputs.Inputs.
    record: run_record of this run.

  Returns:
    Resume.

  Raises:
    ValueError: a change that is not allowed; the message names it and the flag.
  """
  if not inputs.resume_checkpoint or not cfg.run.do_train:
    return Resume(0, [], True)
  earlier = inputs.earlier_run or {}
  was, now = earlier.get("layout"), record["layout"]
  step, checkpoint = inputs.resume_step, os.path.basename(inputs.resume_checkpoint)
  unit, position = _position(inputs, was or now)
  allowed = set(cfg.run.allow_resume_change)
  where = "%s %d of the data order" % (unit, position)
  change = _check_data_order(cfg, earlier, record, allowed, where)
  order_was, order_now = earlier.get("data_order", {}), record["data_order"]
  check_global_batch(cfg, inputs, now)
  lines = [_layout_line(was, now, where, step, checkpoint)]
  if change:
    lines.append("Data: the training files changed (%s; --allow_resume_change=data): "
                 "continuing at %s %d of their data order" % (change, unit, position))
  changed_order = sorted(k for k in order_was if order_was[k] != order_now.get(k))
  if changed_order:
    lines.append("Data: %s changed (--allow_resume_change): continuing at %s %d of the new "
                 "data order" % (", ".join("%s %s -> %s" % (k, order_was[k], order_now[k])
                                           for k in changed_order), unit, position))
  schedule = _schedule_change(earlier.get("schedule", record["schedule"]),
                              record["schedule"])
  if schedule and step < cfg.optimizer.num_train_steps:
    lines.append("Learning rate: %s since %s: the schedule is the new one from step %d on, "
                 "so the learning rate there differs from the run's"
                 % (schedule, checkpoint, step + 1))
  rule = _update_rule_change(earlier, record, checkpoint)
  lines.extend(rule)
  compute_was = earlier.get("compute", record["compute"])
  if compute_was != record["compute"]:
    lines.append("Compute: %s since %s, was %s (the weights stay float32)"
                 % (record["compute"], checkpoint, compute_was))
  return Resume(position, lines, was == now and not change and
                earlier.get("seed") == record["seed"] and not changed_order and
                not schedule and not rule and compute_was == record["compute"])


def reached_target_before(cfg, inputs, at_point):
  """The line saying the run in --output_dir reached --stop_threshold at the checkpoint
  it resumes from (the run that reached it recorded where, as "reached_target" in
  RUN_MARKER: loop.finish), or None: its weights are the result, there is nothing to
  train. A higher --stop_threshold than the accuracy recorded trains on, as does a
  schedule without an evaluation at that step (at_point: meters.reached_point; without
  one, or with --nodo_eval, no evaluation there checks the target)."""
  reached = (inputs.earlier_run or {}).get("reached_target")
  threshold = cfg.evaluation.stop_threshold
  if (not inputs.resume_checkpoint or not cfg.run.do_train or not cfg.evaluation.do_eval or
      not at_point or threshold <= 0 or
      not isinstance(reached, dict) or reached.get("step") != inputs.resume_step or
      not reached.get("masked_lm_accuracy", -1) >= threshold):
    return None
  return ("The run in --output_dir=%s reached --stop_threshold=%g at step %d "
          "(masked_lm_accuracy %.4f): nothing to train and no MLPerf log; its checkpoint is "
          "evaluated again (a higher --stop_threshold trains on)"
          % (cfg.run.output_dir, threshold, inputs.resume_step,
             reached["masked_lm_accuracy"]))


def _layout_line(was, now, where, step, checkpoint):
  """The line saying on which layout the run continues at `where` from `checkpoint` (a
  name; was: the earlier run's layout, None when its record has none)."""
  if was is None:
    return ("Data: %s holds no layout of the run that wrote %s (an older version, or a "
            "deleted bert_pretrain_run.json): continuing at %s"
            % (checkpoints.RUN_MARKER, checkpoint, where))
  if was == now:
    return ("Data: continuing at %s, the records the run consumed up to step %d (read, not "
            "parsed)" % (where, step))
  if was["global_batch_size"] == now["global_batch_size"]:
    return ("Resuming on another layout: %s (was %s); the global batch stays %d, so the run "
            "continues at %s, re-sharded over %d replica%s (the losses are not "
            "bit-identical to an uninterrupted run's)"
            % (describe_layout(now), describe_layout(was), now["global_batch_size"], where,
               now["replicas"], "s" if now["replicas"] > 1 else ""))
  return ("Resuming with another global batch (--allow_resume_change=global_batch): %s "
          "(was %s); the run continues at %s in updates of %d, and the schedules go on "
          "counting updates from step %d"
          % (describe_layout(now), describe_layout(was), where, now["global_batch_size"], step))


def _check_data_order(cfg, earlier, record, allowed, where):
  """Raises ValueError for other training files, --seed, --shuffle_buffer or TensorFlow
  than the earlier run's, unless allowed: `where` would name other records. Returns how
  the files changed (None: they did not)."""
  change = _files_change(earlier.get("train_files", record["train_files"]),
                         record["train_files"])
  if change and "data" not in allowed:
    raise ValueError("--output_dir=%s was trained on other data (%s): %s would name other "
                     "records in these files; pass the run's --input_files_dir, or "
                     "--allow_resume_change=data to continue at %s of these files"
                     % (cfg.run.output_dir, change, where, where))
  if cfg.run.seed is not None and earlier.get("seed") not in (None, cfg.run.seed) and \
      "seed" not in allowed:
    raise ValueError("--output_dir=%s was trained with seed %d and this run passes "
                     "--seed=%d: the data order and dropout masks would be another's, and %s "
                     "would repeat some records and skip others; pass --seed=%d (or no --seed) "
                     "to continue the run, or --allow_resume_change=seed"
                     % (cfg.run.output_dir, earlier["seed"], cfg.run.seed, where, earlier["seed"]))
  order_was, order_now = earlier.get("data_order", {}), record["data_order"]
  if order_was.get("shuffle_buffer", order_now["shuffle_buffer"]) != \
      order_now["shuffle_buffer"] and "shuffle_buffer" not in allowed:
    raise ValueError("--output_dir=%s was trained with --shuffle_buffer=%d and this run "
                     "passes %d: the data order would be another's, and %s would repeat some "
                     "records and skip others; pass --shuffle_buffer=%d to continue the run, "
                     "or --allow_resume_change=shuffle_buffer"
                     % (cfg.run.output_dir, order_was["shuffle_buffer"],
                        order_now["shuffle_buffer"], where, order_was["shuffle_buffer"]))
  if order_was.get("tensorflow", order_now["tensorflow"]) != order_now["tensorflow"] and \
      "tensorflow" not in allowed:
    raise ValueError("--output_dir=%s was trained with TensorFlow %s and this run has %s, "
                     "whose shuffles give another data order: %s would repeat some records "
                     "and skip others; resume with TensorFlow %s, or pass "
                     "--allow_resume_change=tensorflow"
                     % (cfg.run.output_dir, order_was["tensorflow"], order_now["tensorflow"],
                        where, order_was["tensorflow"]))
  return change


def _update_rule(record):
  """(how the ranks' gradients combine, where update u reads the schedule) of a run
  record, in words."""
  (layout, rule) = (record["layout"], dict(UPDATE_RULE, **record.get("update_rule", {})))
  (replicas, k) = (layout["replicas"], layout["num_accumulation_steps"])
  gradients = "one rank's"
  if replicas > 1:
    gradients = ("summed over %d ranks" % replicas
                 if rule["cross_replica_gradients"] == "sum" else "averaged over the ranks")
  at = "u"
  if k > 1 and rule["lr_schedule_step"] == "micro_batch":
    at = "u + %d/%d (stepped per micro-batch)" % (k - 1, k)
  return gradients, at


def _update_rule_change(earlier, record, checkpoint):
  """Lines saying how the update's rule changed since `checkpoint` ([]: it did not)."""
  if "layout" not in earlier:
    return []
  ((gradients_was, at_was), (gradients, at)) = (_update_rule(earlier), _update_rule(record))
  lines = []
  if gradients != gradients_was:
    lines.append("Gradients: %s since %s, were %s (--cross_replica_gradients, the ranks)"
                 % (gradients, checkpoint, gradients_was))
  if at != at_was:
    lines.append("Learning rate: update u takes the schedule's at %s since %s, was at %s "
                 "(--lr_schedule_step, --num_accumulation_steps)" % (at, checkpoint, at_was))
  return lines


def _schedule_change(was, now):
  """How the learning-rate schedule changed, in a few words ("": it did not); was: the
  earlier run's record, whose keys an older version may lack."""
  changed = [k for k in SCHEDULE + ("peak",) if k in was and was[k] != now[k]]
  if {"learning_rate", "scale_lr_by_ranks"} & set(changed):
    changed = [k for k in changed if k != "peak"]  # said by the flag
  return ", ".join(("the peak (--learning_rate, x replicas with --scale_lr_by_ranks) was "
                    "%g, now %g" if k == "peak" else "--" + k + " was %s, now %s")
                   % (was[k], now[k]) for k in changed)


def choose_seed(cfg, inputs, ranks, device, session_config):
  """The run's seed, the same in every process: --seed, else the one the run in
  --output_dir recorded (a resumed run continues its data order and dropout masks),
  else one the first process draws. Checks first that every process runs with the same
  settings (ranks.agree: the first collective).

  Returns:
    (seed, line): line says where the seed came from (None with --seed).
  """
  recorded = (inputs.earlier_run or {}).get("seed") if inputs.resume_checkpoint else None
  candidate = cfg.run.seed
  if candidate is None:
    candidate = (recorded if recorded is not None
                 else int.from_bytes(os.urandom(4), "big") % config.SEED_LIMIT)
  values = config.as_flags(cfg)
  settings = {"--%s" % name: values[name] for name in JOB_SETTINGS}
  settings.update({"the model config": inputs.bert_config.to_dict(),
                   "the training files": data_files(inputs.train_files),
                   "the compute type": device.dtype.name,
                   "bert_pretrain's files (a digest: one checkout on every host)":
                       code_digest(),
                   "seed": candidate})
  seed = ranks.agree(settings, session_config, shared=("seed",))["seed"]
  if cfg.run.seed is not None:
    return seed, None
  if recorded is not None and seed == recorded:
    return seed, ("Seed: no --seed; the run's seed %d from %s (its data order and dropout "
                  "masks continue)" % (seed, checkpoints.RUN_MARKER))
  return seed, ("Seed: no --seed; drew %d for the data order, dropout masks and "
                "initialization (recorded in %s, which a resumed run reuses; --seed=%d "
                "repeats the run)" % (seed, checkpoints.RUN_MARKER, seed))


