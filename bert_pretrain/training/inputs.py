"""What a pretraining run reads, checked before any graph is built: the settings' numbers,
the BERT config, the training and evaluation records, the checkpoints to resume from or
start with, the output folder. Every problem is a ValueError whose message is the one line
the user sees, with the fix.
"""

import collections
import copy
import functools
import math
import operator
import os

import tensorflow.compat.v1 as tf

from bert_pretrain import config
from bert_pretrain import errors
from bert_pretrain import pack_records
from bert_pretrain.data import input_pipeline
from bert_pretrain.distributed import device as device_lib
from bert_pretrain.distributed import ranks as ranks_lib
from bert_pretrain.model import heads
from bert_pretrain.model import modeling
from bert_pretrain.training import checkpoints
from bert_pretrain.training import logs
from bert_pretrain.training import mlperf

# What check_inputs found: the BertConfig, the training and eval record files, the
# training records to leave out (input_pipeline.SkippedRecords), and the checkpoint
# prefixes to resume from (this recipe's newest in --output_dir) and of --init_checkpoint
# (each None when there is none); when resuming, the record of the run in --output_dir
# (its bert_pretrain_run.json, None without), the checkpoint's step and its place in
# the data order (None when an older version wrote it). And the training records' kind:
# `packing` (Packing).
Inputs = collections.namedtuple("Inputs", [
    "bert_config", "train_files", "eval_files", "skipped_records", "resume_checkpoint",
    "init_checkpoint", "earlier_run", "resume_step", "resume_position", "packing"])

# The training records' kind: max_predictions, their masked-LM length; max_sequences,
# None for unpacked records, else a pack's sequence slots; sequences_per_record, the
# mean sequences a record holds (1.0 unpacked), which turns records into samples.
Packing = collections.namedtuple("Packing", ["max_predictions", "max_sequences",
                                             "sequences_per_record"])


# --stall_timeout_s below this names healthy ranks as stalled (their start takes longer).
MIN_STALL_TIMEOUT_S = 10


def check_settings(cfg, here=True):
  """Checks the settings (config.Settings) that need no file; with here=False not those
  that depend on the host (--clear_cache's right to drop the page cache, the RCPs of
  --reference_hyperparameters, TF_CONFIG): a launcher checks for other hosts.

  Raises:
    ValueError: with the one-line message the user sees.
  """
  values = config.as_flags(cfg)
  for name in ("train_batch_size", "eval_batch_size", "num_accumulation_steps",
               "max_seq_length", "max_predictions_per_seq", "display_loss_steps",
               "save_checkpoints_steps", "shuffle_buffer"):
    if values[name] < 1:
      raise ValueError("--%s=%d must be at least 1" % (name, values[name]))
  # start_warmup_step may be negative: MLPerf's reference points set -700 and others.
  for name in ("num_warmup_steps", "fps_warmup_steps",
               "keep_checkpoint_max", "max_eval_steps", "samples_start_eval",
               "intra_op_threads", "inter_op_threads", "stall_timeout_s",
               "full_record_check_mb"):
    if values[name] < 0:
      raise ValueError("--%s=%d must not be negative%s" % (
          name, values[name], " (0: chosen for this host)" if "threads" in name else ""))
  if cfg.run.seed is not None and not 0 <= cfg.run.seed < config.SEED_LIMIT:
    raise ValueError("--seed=%d must be from 0 to %d (or leave it out: the run draws one)"
                     % (cfg.run.seed, config.SEED_LIMIT - 1))
  if cfg.runtime.horovod and cfg.runtime.distribution not in ("none", "horovod"):
    raise ValueError("--horovod and --distribution=%s disagree; pass one (with "
                     "run_multi_card_FPS.sh, set DISTRIBUTION=%s instead)"
                     % (cfg.runtime.distribution, cfg.runtime.distribution))
  if 0 < cfg.runtime.stall_timeout_s < MIN_STALL_TIMEOUT_S:
    # Shorter than a rank's start and than its heartbeats' gaps: healthy ranks are named.
    raise ValueError("--stall_timeout_s=%d is shorter than a rank's start-up; pass %d or "
                     "more (0 turns the check off)"
                     % (cfg.runtime.stall_timeout_s, MIN_STALL_TIMEOUT_S))
  device_lib.check_cpu_devices(cfg.runtime.cpu_devices, cfg.runtime.engine(),
                               os.cpu_count() if here else None)
  # TensorFlow's reshape of the attention mask of a micro-batch, batch x seq x seq
  # elements, fails at 2^31 (an int32 count).
  for name, batch in (("train_batch_size", cfg.run.train_batch_size),
                      ("eval_batch_size", cfg.evaluation.eval_batch_size)):
    if batch * cfg.data.max_seq_length ** 2 >= 2 ** 31:
      raise ValueError("--%s=%d at --max_seq_length=%d: the attention of a micro-batch "
                       "would hold %d x %d x %d elements, more than TensorFlow indexes; lower "
                       "--%s%s" % (name, batch, cfg.data.max_seq_length, batch,
                                   cfg.data.max_seq_length, cfg.data.max_seq_length, name,
                                   " and raise --num_accumulation_steps"
                                   if name == "train_batch_size" else ""))
  checkpoints.check_no_pattern(cfg.run.output_dir, "--output_dir")  # before the records
  if cfg.run.dllog_path or cfg.run.mllog_path:
    # Where the run would put them (runlog.start_logs): the defaults in output_dir.
    dllog = os.path.realpath(cfg.run.dllog_path or
                             os.path.join(cfg.run.output_dir, "dllog.json"))
    mllog = os.path.realpath(cfg.run.mllog_path or
                             logs.new_log_path(cfg.run.output_dir, "mlperf", ".log"))
    if dllog == mllog:
      raise ValueError("the JSON-lines log and the MLPerf log would both go to %s "
                       "(--dllog_path, --mllog_path, or their defaults in --output_dir); "
                       "pass another path for one of them" % dllog)
  check_optimizer(cfg.optimizer)
  if cfg.run.clear_cache and here:
    mlperf.check_clear_cache()
  if cfg.optimizer.reference_hyperparameters and here:
    mlperf.rcp_file()  # raises when mlperf-logging has no RCPs
  between = cfg.evaluation.samples_between_eval
  if between is not None and between < 1:
    raise ValueError("--samples_between_eval=%d must be at least 1 (or leave it out: "
                     "MLPerf's interval for the global batch)" % between)
  # Written as not (in range) so that NaN is refused too.
  if not 0 <= cfg.evaluation.initial_accuracy_tolerance < math.inf:
    raise ValueError("--initial_accuracy_tolerance=%g must be 0 or more and finite"
                     % cfg.evaluation.initial_accuracy_tolerance)
  if not 0 <= cfg.evaluation.stop_threshold <= 1:
    raise ValueError("--stop_threshold=%g must be a masked-LM accuracy from 0 to 1 (0: never "
                     "stop)" % cfg.evaluation.stop_threshold)
  if not 0 <= cfg.run.peak_tflops < math.inf:
    raise ValueError("--peak_tflops=%g must be 0 or more and finite (a card's matmul peak "
                     "in TFLOPS; 0: none)" % cfg.run.peak_tflops)
  unknown = sorted(set(cfg.run.allow_resume_change) - set(config.RESUME_CHANGES))
  if unknown:
    raise ValueError("--allow_resume_change=%s: %s is not one of %s; pass those to allow"
                     % (",".join(cfg.run.allow_resume_change), ", ".join(unknown),
                        ", ".join(config.RESUME_CHANGES)))
  if cfg.run.do_train and cfg.optimizer.num_train_steps < 1:
    raise ValueError("--num_train_steps=%d must be at least 1 (or pass --nodo_train)"
                     % cfg.optimizer.num_train_steps)
  if cfg.runtime.engine() == "multi_worker_mirrored" and here:
    ranks_lib.multi_worker_config()  # TF_CONFIG, also in a dry run's --check_only


def check_optimizer(opt):
  """Checks the optimizer's numbers (config.Optimizer): each in its range and finite.

  Raises:
    ValueError: with the one-line message the user sees.
  """
  top = config.FLOAT32_MAX  # "finite": finite in float32, the graph's type
  ranges = (  # name, whether its value is in range, the range in words
      ("learning_rate", lambda v: 0 < v <= top, "positive (the peak of the schedule)"),
      ("beta_1", lambda v: 0 <= v < 1, "from 0 to below 1 (the first moment's decay)"),
      ("beta_2", lambda v: 0 <= v < 1, "from 0 to below 1 (the second moment's decay)"),
      ("epsilon", lambda v: 0 < v <= top, "positive"),
      ("weight_decay_rate", lambda v: 0 <= v <= top, "0 or more"),
      ("poly_power", lambda v: 0 <= v <= top,
       "0 or more (the schedule's decay: 1 linear, 0 none)"),
      ("init_loss_scale", lambda v: 1 <= v <= top, "at least 1"))
  for name, in_range, words in ranges:
    value = getattr(opt, name)
    if not in_range(value):
      raise ValueError("--%s=%g must be %s and finite; pass e.g. --%s=%g"
                       % (name, value, words, name, config.default(config.Optimizer, name)))


def check_inputs(cfg):
  """Checks the settings (check_settings) and what the run reads, cheaply, before any
  graph is built.

  Args:
    cfg: config.Settings.

  Returns:
    Inputs.

  Raises:
    ValueError: with the one-line message the user sees.
  """
  check_settings(cfg)
  if not cfg.model.bert_config_file:
    raise ValueError("--bert_config_file is required; pass "
                     "--bert_config_file=PATH/bert_config.json")
  bert_config = modeling.BertConfig.from_json_file(cfg.model.bert_config_file)
  check_model_fits(bert_config, cfg.model.bert_config_file)
  if cfg.data.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError("--max_seq_length=%d is above max_position_embeddings=%d of %s; lower "
                     "--max_seq_length or use a config with more positions"
                     % (cfg.data.max_seq_length, bert_config.max_position_embeddings,
                        cfg.model.bert_config_file))
  if bert_config.type_vocab_size < 2:
    # Every pretraining record is a pair of segments (segment_ids 0 and 1, for NSP).
    raise ValueError("type_vocab_size=%d in %s, but pretraining records hold two segments; "
                     "set type_vocab_size to 2" % (bert_config.type_vocab_size,
                                                   cfg.model.bert_config_file))
  if cfg.data.max_predictions_per_seq > cfg.data.max_seq_length:
    raise ValueError("--max_predictions_per_seq=%d is above --max_seq_length=%d; lower it"
                     % (cfg.data.max_predictions_per_seq, cfg.data.max_seq_length))
  if cfg.model.vocab_file:
    if not tf.gfile.Exists(cfg.model.vocab_file) or tf.gfile.IsDirectory(cfg.model.vocab_file):
      raise ValueError("--vocab_file=%s does not exist; pass the vocab.txt of the data"
                       % cfg.model.vocab_file)
    with tf.gfile.GFile(cfg.model.vocab_file, "r") as f:
      vocab_size = sum(1 for line in f if line.strip())
    if vocab_size > bert_config.vocab_size:
      raise ValueError("--vocab_file=%s has %d tokens but vocab_size in %s is %d; use the "
                       "config that matches the vocab" % (cfg.model.vocab_file, vocab_size,
                                                          cfg.model.bert_config_file,
                                                          bert_config.vocab_size))
  init_checkpoint = None
  if cfg.model.init_checkpoint:
    init_checkpoint = checkpoints.resolve_checkpoint(cfg.model.init_checkpoint)
    checkpoints.check_config(init_checkpoint, bert_config,
                             "--bert_config_file=%s" % cfg.model.bert_config_file)
  if not cfg.run.do_train and not cfg.evaluation.do_eval:
    raise ValueError("nothing to do: pass --do_train and/or --do_eval")

  train_files = eval_files = []
  if cfg.run.do_train:
    train_files = input_pipeline.list_record_files(cfg.data.input_files_dir,
                                                   "--input_files_dir")
  if cfg.evaluation.do_eval:
    if not cfg.data.eval_files_dir:
      raise ValueError("--eval_files_dir is not set; pass --eval_files_dir=/path/to/eval "
                       "records, or --nodo_eval to train without evaluation")
    eval_files = input_pipeline.list_record_files(cfg.data.eval_files_dir, "--eval_files_dir")
  _check_folders_apart(cfg, train_files, eval_files)
  if not 0 <= cfg.data.max_corrupt_share < 1:
    raise ValueError("--max_corrupt_share=%g must be in [0, 1)" % cfg.data.max_corrupt_share)
  skipped_records = input_pipeline.SkippedRecords(None, [])
  packing = Packing(cfg.data.max_predictions_per_seq, None, 1.0)
  # Each file's first record only: the layout the graph is built for. MLPerf's clock
  # starts before the data is read, so the records are read through in read_records_through.
  if train_files:
    packing = check_packing(cfg, train_files)
    skipped_records = input_pipeline.SkippedRecords(*input_pipeline.check_training_files(
        train_files, cfg.data.max_seq_length, packing.max_predictions,
        bert_config.vocab_size, cfg.data.skip_corrupt_records, cfg.data.max_corrupt_share,
        packing.max_sequences))
  if eval_files:
    _check_eval_files(cfg, eval_files, bert_config, packing, bool(train_files), False)
  resume_checkpoint = checkpoints.find_resume_checkpoint(cfg.run.output_dir,
                                                         resume_settings(cfg, bert_config))
  if not cfg.run.do_train:
    check_evaluated(cfg, resume_checkpoint or init_checkpoint, bert_config)
  check_output_folder(cfg.run.output_dir, cfg.run.check_only, cfg.runtime.engine())
  earlier_run = resume_step = resume_position = None
  if resume_checkpoint:
    earlier_run = checkpoints.read_run_marker(cfg.run.output_dir)
    resume_step = int(checkpoints.checkpoint_value(resume_checkpoint, "global_step"))
    resume_position = checkpoints.checkpoint_value(resume_checkpoint,
                                                   checkpoints.DATA_POSITION)
    if resume_position is not None:
      resume_position = int(resume_position)
  return Inputs(bert_config, train_files, eval_files, skipped_records, resume_checkpoint,
                init_checkpoint, earlier_run, resume_step, resume_position, packing)


def check_model_fits(bert_config, config_file, memory=None):
  """Refuses a model whose weights with the optimizer's state (4 float32 numbers a
  weight: the weight, its gradient, two moments) take more than this host's memory:
  a size mistyped in the config, which TensorFlow would meet only as it builds.

  memory: bytes (default: this host's physical memory; None where it cannot tell).
  """
  if memory is None:
    try:
      memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
      return
  # One layer's table, times the layers: a mistyped num_hidden_layers is not built out.
  one_layer = copy.copy(bert_config)
  one_layer.num_hidden_layers = 1
  sizes = {name: functools.reduce(operator.mul, shape, 1)
           for name, shape in heads.pretraining_variable_shapes(one_layer).items()}
  layer = sum(size for name, size in sizes.items() if name.startswith("bert/encoder/"))
  weights = sum(sizes.values()) + (bert_config.num_hidden_layers - 1) * layer
  if 16 * weights > memory:
    raise ValueError("%s describes a model of %.3g weights, whose training state alone "
                     "takes %.0f GiB, more than this host's %.0f GiB of memory; check its "
                     "sizes (hidden_size, intermediate_size, vocab_size, "
                     "max_position_embeddings, num_hidden_layers)"
                     % (config_file, weights, 16 * weights / 2 ** 30, memory / 2 ** 30))


def read_records_through(cfg, inputs):
  """Reads record sets under --full_record_check_mb whole (every record's framing and CRC):
  the eval set, and the training set unless --skip_corrupt_records read it in
  check_inputs. Called once MLPerf's clock runs (the rules start it before any part of
  the system reads the data), before the first evaluation and update.

  Returns:
    the training records that are read, when they were counted (here or by
    --skip_corrupt_records), else None.

  Raises:
    ValueError: as input_pipeline.check_record_files, naming the file and record.
  """
  limit = cfg.data.full_record_check_mb * 1024 * 1024
  def small(files):
    return files and sum(tf.gfile.Stat(f).length for f in files) < limit
  skipped = inputs.skipped_records
  counted = None if skipped.records is None else skipped.records - len(skipped.bad)
  if small(inputs.train_files) and not cfg.data.skip_corrupt_records:
    counted = input_pipeline.check_record_files(
        inputs.train_files, cfg.data.max_seq_length, inputs.packing.max_predictions,
        inputs.bert_config.vocab_size, full_check=True,
        max_sequences=inputs.packing.max_sequences)
  if small(inputs.eval_files):
    _check_eval_files(cfg, inputs.eval_files, inputs.bert_config, inputs.packing,
                      bool(inputs.train_files), True)
  return counted


def _check_eval_files(cfg, eval_files, bert_config, packing, with_training, full_check):
  """check_record_files on the eval set: the flags' lengths, or the training records'
  (packing: theirs) when the run trains; never skippable."""
  input_pipeline.check_record_files(
      eval_files, cfg.data.max_seq_length, cfg.data.max_predictions_per_seq,
      vocab_size=bert_config.vocab_size, full_check=full_check,
      lengths_of=(None if not with_training else "the training records" if
                  packing.max_sequences is None else "the packed training records' "
                  "sequences"), skippable=False)


def records_per_update(cfg, replicas):
  """The records an update reads: train_batch_size x accumulation x replicas."""
  return cfg.run.train_batch_size * cfg.optimizer.num_accumulation_steps * replicas


def sentences_per_update(cfg, replicas, packing):
  """Sentences per update, what the throughput counts: records_per_update, packed ones
  counted at the data's mean sequences a pack (packing: Packing), a fraction then."""
  return records_per_update(cfg, replicas) * packing.sequences_per_record


def global_batch_size(cfg, replicas, packing):
  """sentences_per_update as the whole number MLPerf's log, its RCPs and its evaluation
  interval take."""
  return int(round(sentences_per_update(cfg, replicas, packing)))


def _check_folders_apart(cfg, train_files, eval_files):
  """Raises ValueError if a file is both trained and evaluated on, or --output_dir is a
  records folder (its checkpoints would be read as records)."""
  shared = sorted(set(map(os.path.realpath, train_files)) &
                  set(map(os.path.realpath, eval_files)))
  if shared:
    raise ValueError("%s is both a training and an evaluation file: the accuracy would be "
                     "measured on trained records; pass held-out records as "
                     "--eval_files_dir (MLPerf's eval_10k)" % shared[0])
  if os.path.realpath(cfg.run.output_dir) in {
      os.path.realpath(folder) for folder in (cfg.data.input_files_dir, cfg.data.eval_files_dir)
      if folder and tf.gfile.IsDirectory(folder)}:
    raise ValueError("--output_dir=%s holds the run's records, and its checkpoints would be "
                     "read as records; pass another --output_dir" % cfg.run.output_dir)


def check_packing(cfg, train_files):
  """Whether the training records are packed (recognised from the first one's features)
  and how many sequences a pack holds on average: the packer's figure in
  pack_records.json beside them, or --avg_seq_per_pack; the anchors' two flags must
  agree with the records.

  Returns:
    Packing.

  Raises:
    ValueError: the one-line error.
  """
  max_predictions, max_sequences = input_pipeline.training_layout(
      train_files, cfg.data.max_seq_length, cfg.data.max_predictions_per_seq)
  flag = cfg.data.avg_seq_per_pack
  if flag < 0:
    raise ValueError("--avg_seq_per_pack=%g must not be negative (0: the packer's figure)"
                     % flag)
  if max_sequences is None:
    if cfg.data.enable_packed_data_mode:
      raise ValueError("--enable_packed_data_mode expects packed records, but %s holds "
                       "unpacked ones; pack them (python3 -m bert_pretrain.pack_records "
                       "--input=... --output_dir=DIR) and pass --input_files_dir=DIR, or "
                       "drop the flag" % train_files[0])
    if flag not in (0, 1):
      raise ValueError("--avg_seq_per_pack=%g is for packed records, but %s holds unpacked "
                       "ones (a sequence each); drop the flag" % (flag, train_files[0]))
    return Packing(max_predictions, None, 1.0)
  if flag and not 1 <= flag <= max_sequences:
    raise ValueError("--avg_seq_per_pack=%g is outside 1..%d, the sequences a pack of %s "
                     "holds; pass the mean of the packing (e.g. 1.999 for MLPerf's)"
                     % (flag, max_sequences, train_files[0]))
  folder = os.path.dirname(train_files[0])
  settings_path = os.path.join(folder, pack_records.SETTINGS_FILE)
  summary = pack_records.read_summary(folder)
  if summary is None and os.path.isfile(settings_path):
    raise ValueError("%s holds the packs of a pack_records run that did not finish (%s has "
                     "no summary): some files are missing; run the same pack_records "
                     "command again to finish it" % (folder, settings_path))
  measured = summary and summary.get("sequences_per_pack")
  if not measured and not flag:
    raise ValueError("%s holds packed records, but no finished %s beside them says how "
                     "many sequences a pack holds; pass --avg_seq_per_pack=N (the mean, "
                     "e.g. 1.999 for MLPerf's packing of up to 3)"
                     % (train_files[0], pack_records.SETTINGS_FILE))
  # The anchors' scripts pass a round figure (2 for MLPerf's 1.999): near is agreement.
  if measured and flag and abs(measured - flag) > 0.05:
    raise ValueError("--avg_seq_per_pack=%g disagrees with the %.3f sequences a pack of the "
                     "records (%s); drop the flag or pass --avg_seq_per_pack=%.3f"
                     % (flag, measured, os.path.join(folder, pack_records.SETTINGS_FILE),
                        measured))
  return Packing(max_predictions, max_sequences, float(measured or flag))


def check_evaluated(cfg, prefix, bert_config):
  """With --nodo_train: the checkpoint evaluated must hold the whole model, the
  masked-LM and next-sentence heads included, unless --allow_random_heads.

  Args:
    cfg: config.Settings.
    prefix: the checkpoint to evaluate (resumed or --init_checkpoint), None for none.
    bert_config: modeling.BertConfig.

  Raises:
    ValueError: the one-line error.
  """
  if prefix is None:
    if not cfg.evaluation.allow_random_heads:
      raise ValueError("--nodo_train evaluates a checkpoint but none is given, so every "
                       "weight would be random; pass --init_checkpoint (or "
                       "--eval_checkpoint_path), or --allow_random_heads to evaluate random "
                       "weights on purpose")
    return
  checkpoints.check_config(prefix, bert_config,
                           "--bert_config_file=%s" % cfg.model.bert_config_file)
  names = [name for name, _ in tf.train.list_variables(prefix)]
  missing = ["%s head (%s)" % (head, scope) for head, scope in (
      ("masked-LM", "cls/predictions/"), ("next-sentence", "cls/seq_relationship/"))
             if not any(name.startswith(scope) for name in names)]
  if missing and not cfg.evaluation.allow_random_heads:
    raise ValueError("--nodo_train evaluates %s, which has no %s: those weights would be "
                     "random, and so would the accuracy (a fine-tuned classifier?); pass a "
                     "pretraining checkpoint, or --allow_random_heads to evaluate it anyway"
                     % (prefix, " and no ".join(missing)))


def resume_settings(cfg, bert_config):
  """What a run resuming from output_dir must share with the run that wrote it."""
  return {"bert_config": bert_config.to_dict(), "max_seq_length": cfg.data.max_seq_length,
          "max_predictions_per_seq": cfg.data.max_predictions_per_seq,
          "optimizer": cfg.optimizer.optimizer}


def check_output_folder(output_dir, check_only, engine):
  """Raises ValueError when output_dir cannot be written or another run holds it; makes
  it unless check_only."""
  check_no_other_run(output_dir, engine, check_only)  # first: the probe below is a write
  _check_output_dir(output_dir, create=not check_only)


def check_no_other_run(output_dir, engine, check_only=False):
  """Raises ValueError when another run holds output_dir's lock. Every process looks
  before its job's chief takes the lock (run_pretraining's and run_classifier's), so a
  second job's ranks leave the first's folder alone; but multi_worker_mirrored's: a worker
  would see its own chief's lock, and a chief refused before the strategy's set-up would
  leave its workers waiting there for ever (it takes the lock after)."""
  if "://" not in output_dir and (check_only or engine != "multi_worker_mirrored"):
    checkpoints.OutputDirLock(output_dir).check_free()


def _check_output_dir(output_dir, create=True):
  """Creates output_dir if needed and checks that it can be written; with create=False
  (--check_only, which leaves no trace) checks the folder, or the nearest above it that
  exists, instead."""
  if not create:
    reason = None if "://" in output_dir else errors.unwritable_folder(output_dir)
    if reason:
      raise ValueError("--output_dir=%s cannot be written: %s" % (output_dir, reason))
    return
  try:
    tf.gfile.MakeDirs(output_dir)
    # Named per process: all ranks probe the same folder at once.
    probe = os.path.join(output_dir, ".write_test.%d" % os.getpid())
    with tf.gfile.GFile(probe, "w") as f:
      f.write("ok")
    tf.gfile.Remove(probe)
  except (tf.errors.OpError, OSError) as e:
    raise ValueError("--output_dir=%s cannot be written (%s); pass a folder you can write to"
                     % (output_dir, getattr(e, "message", e)))


