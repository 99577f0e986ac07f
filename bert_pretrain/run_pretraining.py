"""BERT pretraining (masked LM + next sentence): the training and evaluation loop.

Runs on one card, or on many with --horovod (one process per card, launched by
run_multi_card_FPS.sh). Plain tf.compat.v1 Session code, so the same file runs on
TensorFlow 1.15 and 2.x:

  get batch -> forward -> backward -> (accumulate) -> all-reduce -> LAMB step -> log
  -> checkpoint -> evaluate, until --num_train_steps or masked-LM accuracy reaches
  --stop_threshold.

python3 -m bert_pretrain.run_pretraining --input_files_dir=... --eval_files_dir=... \
    --bert_config_file=bert_config.json --init_checkpoint=model.ckpt-28252 \
    --output_dir=./results --train_batch_size=6
"""

import math
import os
import re
import sys
import threading
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain import checkpoints
from bert_pretrain import health
from bert_pretrain import input_pipeline
from bert_pretrain import logs
from bert_pretrain import modeling
from bert_pretrain import optimization
from bert_pretrain import report
from bert_pretrain import signals

flags.DEFINE_string("input_files_dir", None, "Folder (or glob) of the training TFRecords.")
flags.DEFINE_string("eval_files_dir", None, "Folder (or glob) of the evaluation TFRecords.")
flags.DEFINE_string("bert_config_file", None, "bert_config.json of the model to train.")
flags.DEFINE_string("init_checkpoint", None,
                    "Checkpoint whose model weights start the run: a prefix "
                    "(model.ckpt-28252), one of its files, or a folder. Ignored when "
                    "--output_dir already holds a checkpoint of this recipe (resume).")
flags.DEFINE_string("output_dir", "./results", "Checkpoints, TensorBoard events, eval results.")
flags.DEFINE_string("vocab_file", None, "(optional) vocab.txt; checked against vocab_size.")
flags.DEFINE_string("dllog_path", None, "JSON-lines log (default: output_dir/dllog.json).")
flags.DEFINE_string("mllog_path", None, "MLPerf log (default: output_dir/mlperf.log).")

flags.DEFINE_bool("do_train", True, "Train.")
flags.DEFINE_bool("do_eval", True, "Evaluate on --eval_files_dir (periodically and at the end).")
flags.DEFINE_bool("eval_at_start", False, "Also evaluate before the first training step.")
flags.DEFINE_integer("max_seq_length", 512, "Tokens per sequence; must match the records.")
flags.DEFINE_integer("max_predictions_per_seq", 76, "Masked positions per sequence; must "
                     "match the records.")
flags.DEFINE_integer("train_batch_size", 24, "Sequences per micro-batch on each card.")
flags.DEFINE_integer("eval_batch_size", 24, "Sequences per evaluation batch on each card.")
flags.DEFINE_integer("max_eval_steps", 0, "Evaluation batches per card (0: the whole set).")
flags.DEFINE_integer("num_train_steps", 13206, "Optimizer updates to train for.")
flags.DEFINE_integer("num_warmup_steps", 0, "Updates of linear learning-rate warm-up.")
flags.DEFINE_integer("start_warmup_step", 0, "Update at which the warm-up starts.")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate.")
flags.DEFINE_float("poly_power", 1.0, "Power of the polynomial learning-rate decay.")
flags.DEFINE_enum("optimizer", "lamb", ["lamb", "adam"], "LAMB or Adam with weight decay.")
flags.DEFINE_float("weight_decay_rate", 0.01, "Decoupled weight decay (not on LayerNorm, bias).")
flags.DEFINE_float("beta_1", 0.9, "First-moment decay.")
flags.DEFINE_float("beta_2", 0.999, "Second-moment decay.")
flags.DEFINE_float("epsilon", 1e-6, "Optimizer epsilon.")
flags.DEFINE_integer("num_accumulation_steps", 1, "Micro-batches summed into one update.")
flags.DEFINE_bool("allreduce_post_accumulation", True, "All-reduce once per update, after "
                  "accumulation (otherwise after every micro-batch).")
flags.DEFINE_bool("scale_lr_by_ranks", False, "Multiply --learning_rate by the number of ranks.")
flags.DEFINE_integer("save_checkpoints_steps", 1000, "Save a checkpoint every this many updates "
                     "(and always at the end).")
flags.DEFINE_integer("keep_checkpoint_max", 5, "Checkpoints kept in output_dir.")
flags.DEFINE_integer("display_loss_steps", 10, "Log losses and throughput every this many "
                     "updates.")
flags.DEFINE_integer("fps_warmup_steps", 10, "Updates left out of the steady-state FPS.")
flags.DEFINE_integer("samples_between_eval", 150000, "Evaluate every this many training samples.")
flags.DEFINE_integer("samples_start_eval", 3000000, "No periodic evaluation before this many "
                     "training samples.")
flags.DEFINE_float("stop_threshold", 0.72, "Stop when masked-LM accuracy reaches this (0: never).")
flags.DEFINE_bool("horovod", False, "One process per card, gradients all-reduced by Horovod.")
flags.DEFINE_bool("amp", False, "Mixed precision: float16 compute with loss scaling on GPUs, "
                  "bfloat16 on CPUs (see --amp_dtype); master weights stay float32.")
flags.DEFINE_bool("use_fp16", False, "Alias of --amp.")
flags.DEFINE_enum("amp_dtype", "auto", ["auto", "float16", "bfloat16"],
                  "Compute type of --amp (auto: float16 on GPUs, bfloat16 on CPUs). float16 "
                  "always uses dynamic loss scaling, also on a CPU. Setting it implies --amp.")
flags.DEFINE_float("init_loss_scale", 2.0 ** 15, "Initial dynamic loss scale of float16 "
                   "compute (x2 after 1000 good steps, halved by an overflowing one).")
flags.DEFINE_enum("device", "auto", ["auto", "gpu", "cpu"],
                  "auto: a GPU if TensorFlow sees one, else the CPU, but an error when "
                  "CUDA_VISIBLE_DEVICES lists cards TensorFlow cannot see; gpu: a GPU or an "
                  "error; cpu: the CPU on purpose, even where GPUs are visible.")
flags.DEFINE_bool("use_xla", False, "XLA JIT: auto-clustering of the graph (on a CPU too), and "
                  "the optimizer update compiled as one XLA cluster.")
flags.DEFINE_integer("intra_op_threads", 0, "Threads per op (0: cores / ranks on this host).")
flags.DEFINE_integer("inter_op_threads", 0, "Ops run at once (0: 2).")
flags.DEFINE_integer("shuffle_buffer", 10000, "Training records held for shuffling.")
flags.DEFINE_bool("skip_corrupt_records", False, "Read every training record before "
                  "training and leave out the corrupt ones (bad CRC, cut short, other "
                  "lengths, token ids outside the vocab), counted in the log, instead of "
                  "stopping at the first.")
flags.DEFINE_float("max_corrupt_share", 0.001, "With --skip_corrupt_records: stop when more "
                   "than this fraction of the training records is corrupt.")
flags.DEFINE_integer("full_record_check_mb", 256, "Data sets smaller than this (MB) are read "
                     "whole before training (CRCs, framing); larger ones check each file's "
                     "first record up front and locate a bad record when training meets it.")
flags.DEFINE_integer("stall_timeout_s", 300, "With --horovod: a rank that does not take part "
                     "for this long (stuck in I/O, stopped, frozen) is named and the job "
                     "ends with an error; sets Horovod's HOROVOD_STALL_CHECK_TIME_SECONDS "
                     "and HOROVOD_STALL_SHUTDOWN_TIME_SECONDS unless they are set (0: never).")
flags.DEFINE_integer("seed", None, "Graph-level random seed (dropout, shuffling).")
flags.DEFINE_string("submission_org", "unknown", "MLPerf log: submitting organization.")
flags.DEFINE_string("submission_platform", "unknown", "MLPerf log: system name.")

FLAGS = flags.FLAGS


class Ranks(object):
  """Who this process is: its rank among `size` ranks, and its local rank on the host.

  With Horovod and stall_timeout_s, a rank that stops taking part is named and the job
  ends instead of hanging. Two checks share the timeout:
  - Horovod's stall check (HOROVOD_STALL_CHECK_TIME_SECONDS, then
    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS; set here unless the user set them) lists the
    ranks that did not submit an all-reduce ("Missing ranks"), e.g. a rank stuck in I/O,
    and shuts Horovod down; the training loop then fails with a Horovod error. It runs
    under MPI; Horovod 0.28.1's Gloo controller did not run it in our tests.
  - A whole process stopped or frozen cannot answer Horovod's negotiation, so the stall
    check never runs (MPI waits forever, Gloo times out without a rank). Each rank
    therefore rewrites a small file output_dir/.ranks/rank-N every few seconds from a
    thread; a rank that sees another's file unchanged for stall_timeout_s prints a
    one-line error naming it and exits with status 3. On several hosts this needs an
    output_dir all hosts see; otherwise only ranks of the same host are named.

  Args:
    use_horovod: initialize Horovod.
    stall_timeout_s: seconds a rank may stay away (0: no stall checks).
    output_dir: the run's folder (for the .ranks files).
  """

  def __init__(self, use_horovod, stall_timeout_s=0, output_dir=None):
    self.hvd = None
    self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
    self.stall_timeout_s = stall_timeout_s
    self._folder = None
    self._interval = 1.0
    self._thread = None
    self._stop = threading.Event()
    self._seen = {}  # rank -> (file content, time it last changed)
    if use_horovod:
      try:
        import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
      except ImportError as e:
        raise ValueError("--horovod needs Horovod with TensorFlow support (%s); run "
                         "bash init_tf.sh" % e)
      if stall_timeout_s > 0:
        # Horovod reads these in init(); a user's own setting wins.
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS",
                              str(max(1, min(60, stall_timeout_s // 2))))
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(stall_timeout_s))
        # Gloo's own timeout ends a job with a frozen rank without naming it; the
        # watchdog below names it first.
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(stall_timeout_s + 30))
      hvd.init()
      self.hvd = hvd
      self.rank, self.size = hvd.rank(), hvd.size()
      self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
    if self.size > 1 and stall_timeout_s > 0 and output_dir:
      self._folder = os.path.join(output_dir, ".ranks")
      self._interval = max(1.0, min(10.0, stall_timeout_s / 10.0))
      self._thread = threading.Thread(target=self._watch, name="stall_watchdog", daemon=True)
      self._thread.start()

  @property
  def is_chief(self):
    return self.rank == 0

  def _watch(self):
    """Heartbeat and watchdog thread: see the class docstring."""
    beats = 0
    while not self._stop.wait(0 if beats == 0 else self._interval):
      beats += 1
      try:
        if not os.path.isdir(self._folder):
          os.makedirs(self._folder, exist_ok=True)
        path = os.path.join(self._folder, "rank-%d" % self.rank)
        with open(path + ".tmp", "w") as f:
          f.write("%d %d\n" % (os.getpid(), beats))
        os.replace(path + ".tmp", path)
      except OSError:
        continue  # The heartbeat is best effort; training goes on.
      stalled = self.stalled_ranks(self.stall_timeout_s)
      if stalled:
        print("run_pretraining: error: rank %s stalled: no sign of life for %d s (stuck "
              "in I/O, stopped, or its host frozen; --stall_timeout_s=%d); the job stops, "
              "checkpoints in %s are kept: check that host and rerun the same command to "
              "resume" % (", ".join(str(r) for r in stalled), self.stall_timeout_s,
                          self.stall_timeout_s, os.path.dirname(self._folder)),
              file=sys.stderr)
        sys.stderr.flush()
        os._exit(3)  # pylint: disable=protected-access

  def stalled_ranks(self, min_age_s=None):
    """Other ranks whose heartbeat changed since this rank started watching, then not
    for min_age_s seconds (default: three heartbeats; a file left by an earlier run never
    counts)."""
    if min_age_s is None:
      min_age_s = 3 * self._interval
    if self._folder is None:
      return []
    now = time.time()
    stalled = []
    for rank in range(self.size):
      if rank == self.rank:
        continue
      try:
        with open(os.path.join(self._folder, "rank-%d" % rank)) as f:
          content = f.read()
      except OSError:
        continue
      if content.startswith("done"):
        continue
      previous = self._seen.get(rank)
      if previous is None:
        self._seen[rank] = (content, None)
      elif previous[0] != content:
        self._seen[rank] = (content, now)
      elif previous[1] is not None and now - previous[1] >= min_age_s:
        stalled.append(rank)
    return stalled

  def stop(self):
    """Ends the heartbeat thread; the others no longer wait for this rank."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=10)
    if self._folder is not None:
      try:
        with open(os.path.join(self._folder, "rank-%d" % self.rank), "w") as f:
          f.write("done\n")
      except OSError:
        pass


def check_flags():
  """Checks the flags and inputs that fail cheaply, before any graph is built.

  Returns:
    (bert_config, train_files, eval_files, skipped_records): skipped_records is an
    input_pipeline.SkippedRecords (the training records to leave out).

  Raises:
    ValueError: with the one-line message the user sees.
  """
  if not FLAGS.bert_config_file:
    raise ValueError("--bert_config_file is required; pass --bert_config_file=PATH/bert_config.json")
  bert_config = modeling.BertConfig.from_json_file(FLAGS.bert_config_file)
  for name in ("train_batch_size", "eval_batch_size", "num_accumulation_steps",
               "max_seq_length", "max_predictions_per_seq", "display_loss_steps",
               "save_checkpoints_steps", "samples_between_eval", "shuffle_buffer"):
    if getattr(FLAGS, name) < 1:
      raise ValueError("--%s=%d must be at least 1" % (name, getattr(FLAGS, name)))
  for name in ("num_warmup_steps", "start_warmup_step", "fps_warmup_steps",
               "keep_checkpoint_max", "max_eval_steps", "samples_start_eval"):
    if getattr(FLAGS, name) < 0:
      raise ValueError("--%s=%d must not be negative" % (name, getattr(FLAGS, name)))
  if FLAGS.init_loss_scale < 1:
    raise ValueError("--init_loss_scale=%g must be at least 1" % FLAGS.init_loss_scale)
  if FLAGS.do_train and FLAGS.num_train_steps < 1:
    raise ValueError("--num_train_steps=%d must be at least 1 (or pass --nodo_train)"
                     % FLAGS.num_train_steps)
  if FLAGS.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError("--max_seq_length=%d is above max_position_embeddings=%d of %s; lower "
                     "--max_seq_length or use a config with more positions"
                     % (FLAGS.max_seq_length, bert_config.max_position_embeddings,
                        FLAGS.bert_config_file))
  if FLAGS.max_predictions_per_seq > FLAGS.max_seq_length:
    raise ValueError("--max_predictions_per_seq=%d is above --max_seq_length=%d; lower it"
                     % (FLAGS.max_predictions_per_seq, FLAGS.max_seq_length))
  if FLAGS.vocab_file:
    if not tf.gfile.Exists(FLAGS.vocab_file) or tf.gfile.IsDirectory(FLAGS.vocab_file):
      raise ValueError("--vocab_file=%s does not exist; pass the vocab.txt of the data"
                       % FLAGS.vocab_file)
    with tf.gfile.GFile(FLAGS.vocab_file, "r") as f:
      vocab_size = sum(1 for line in f if line.strip())
    if vocab_size > bert_config.vocab_size:
      raise ValueError("--vocab_file=%s has %d tokens but vocab_size in %s is %d; use the "
                       "config that matches the vocab" % (FLAGS.vocab_file, vocab_size,
                                                          FLAGS.bert_config_file,
                                                          bert_config.vocab_size))
  if FLAGS.init_checkpoint:
    checkpoints.resolve_checkpoint(FLAGS.init_checkpoint)
  if not FLAGS.do_train and not FLAGS.do_eval:
    raise ValueError("nothing to do: pass --do_train and/or --do_eval")

  train_files = eval_files = []
  if FLAGS.do_train:
    train_files = input_pipeline.list_record_files(FLAGS.input_files_dir, "--input_files_dir")
  if FLAGS.do_eval:
    if not FLAGS.eval_files_dir:
      raise ValueError("--eval_files_dir is not set; pass --eval_files_dir=/path/to/eval "
                       "records, or --nodo_eval to train without evaluation")
    eval_files = input_pipeline.list_record_files(FLAGS.eval_files_dir, "--eval_files_dir")
  if not 0 <= FLAGS.max_corrupt_share < 1:
    raise ValueError("--max_corrupt_share=%g must be in [0, 1)" % FLAGS.max_corrupt_share)
  full_check_bytes = FLAGS.full_record_check_mb * 1024 * 1024
  skipped_records = input_pipeline.SkippedRecords(None, [])
  if train_files:
    skipped_records = input_pipeline.SkippedRecords(*input_pipeline.check_training_files(
        train_files, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
        bert_config.vocab_size, FLAGS.skip_corrupt_records, FLAGS.max_corrupt_share,
        full_check_bytes))
  if eval_files:
    input_pipeline.check_record_files(eval_files, FLAGS.max_seq_length,
                                      FLAGS.max_predictions_per_seq,
                                      vocab_size=bert_config.vocab_size,
                                      full_check_max_bytes=full_check_bytes)
  _check_output_dir(FLAGS.output_dir)
  checkpoints.find_resume_checkpoint(FLAGS.output_dir, resume_settings(bert_config))
  return bert_config, train_files, eval_files, skipped_records


def resume_settings(bert_config):
  """What a run resuming from output_dir must share with the run that wrote it."""
  return {"bert_config": bert_config.to_dict(), "max_seq_length": FLAGS.max_seq_length,
          "max_predictions_per_seq": FLAGS.max_predictions_per_seq,
          "optimizer": FLAGS.optimizer}


def _check_output_dir(output_dir):
  """Creates output_dir if needed and checks that it can be written."""
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


class Device(object):
  """Where this process computes: kind "GPU" or "CPU", the GPUs TensorFlow lists
  (tf.config PhysicalDevice objects; empty for "CPU") and the compute type."""

  def __init__(self, kind, gpus, dtype):
    self.kind = kind
    self.gpus = gpus
    self.dtype = dtype


def cards_listed(cuda_visible_devices):
  """Whether a CUDA_VISIBLE_DEVICES value asks for cards: set, not empty, and not a list
  that CUDA reads as none (it stops at the first negative entry, e.g. -1)."""
  entries = [e.strip() for e in (cuda_visible_devices or "").split(",") if e.strip()]
  return bool(entries) and not entries[0].startswith("-")


def choose_device(device_flag, gpus, cuda_visible_devices, built_with_cuda, amp, amp_dtype):
  """Decides the device and the compute type, before any graph is built.

  Args:
    device_flag: --device: "auto", "gpu" or "cpu".
    gpus: the GPUs TensorFlow lists (tf.config.experimental.list_physical_devices).
    cuda_visible_devices: the CUDA_VISIBLE_DEVICES value (None: unset).
    built_with_cuda: whether this TensorFlow is a GPU build.
    amp: --amp.
    amp_dtype: --amp_dtype: "auto", "float16" or "bfloat16".

  Returns:
    Device.

  Raises:
    ValueError: a GPU is asked for (--device=gpu, or cards in CUDA_VISIBLE_DEVICES) but
      TensorFlow sees none.
  """
  if gpus or device_flag == "cpu":
    kind = "CPU" if device_flag == "cpu" else "GPU"
  else:
    cause = ("this TensorFlow %s is a CPU build" % tf.VERSION if not built_with_cuda else
             "TensorFlow %s finds no usable GPU (check the driver with nvidia-smi and the "
             "CUDA libraries)" % tf.VERSION)
    fix = ("install a GPU build (bash init_tf.sh on the GPU host), or pass --device=cpu to "
           "train on the CPU on purpose")
    if device_flag == "gpu":
      raise ValueError("--device=gpu but %s; %s" % (cause, fix))
    if cards_listed(cuda_visible_devices):
      raise ValueError("CUDA_VISIBLE_DEVICES=%s lists cards but %s; %s"
                       % (cuda_visible_devices, cause, fix))
    kind = "CPU"
  if not amp:
    dtype = tf.float32
  elif amp_dtype == "auto":
    dtype = tf.float16 if kind == "GPU" else tf.bfloat16
  else:
    dtype = tf.as_dtype(amp_dtype)
  return Device(kind, gpus if kind == "GPU" else [], dtype)


def detect_device():
  """choose_device with the flags, the environment and what TensorFlow lists."""
  # list_physical_devices starts no GPU, so it does not fight the session's
  # visible_device_list (one card per Horovod rank).
  return choose_device(FLAGS.device, tf.config.experimental.list_physical_devices("GPU"),
                       os.environ.get("CUDA_VISIBLE_DEVICES"), tf.test.is_built_with_cuda(),
                       # --use_fp16 is an alias of --amp; --amp_dtype implies it.
                       FLAGS.amp or FLAGS.use_fp16 or FLAGS.amp_dtype != "auto",
                       FLAGS.amp_dtype)


def gpu_index(ranks, num_gpus):
  """The index, among the GPUs this process sees, of the one this rank uses: its local
  rank, or 0 when the launcher gave each rank a single card.

  Raises:
    ValueError: more ranks on this host than GPUs.
  """
  if ranks.local_rank < num_gpus:
    return ranks.local_rank
  if num_gpus == 1:
    return 0
  raise ValueError("%d ranks on this host but TensorFlow sees %d GPUs; launch one rank per "
                   "GPU (IX_NUM_CUDA_VISIBLE_DEVICES) or pass --device=cpu"
                   % (ranks.local_size, num_gpus))


def gpu_name(gpu, config):
  """The product name of a GPU (a tf.config PhysicalDevice), "" if unknown.

  TensorFlow >= 2.3 reads it without starting the GPU. TensorFlow 1.15 only names it
  once the device is created: with the session's own config (this rank's
  visible_device_list), as the session would.
  """
  details = getattr(tf.config.experimental, "get_device_details", None)
  if details is not None:
    return details(gpu).get("device_name", "")
  from tensorflow.python.client import device_lib  # pylint: disable=g-import-not-at-top
  for device in device_lib.list_local_devices(config):
    match = re.search(r"name: ([^,]+)", device.physical_device_desc or "")
    if device.device_type == "GPU" and match:
      return match.group(1)
  return ""


def device_line(device, ranks, name="", cores=None):
  """The run's device, e.g. "GPU 0 of 8, NVIDIA A100-SXM4-40GB, compute float16" (this
  rank's card among the job's) or "CPU, 2 cores, compute bfloat16"."""
  if device.kind == "GPU":
    where = "GPU %d of %d" % (gpu_index(ranks, len(device.gpus)), ranks.size)
    if name:
      where += ", " + name
  else:
    where = "CPU, %d cores" % (cores or os.cpu_count() or 1)
    if ranks.local_size > 1:
      where += ", %d ranks on this host" % ranks.local_size
  return "%s, compute %s" % (where, device.dtype.name)


def session_config(ranks, device):
  """Threads, GPU placement and XLA for this rank's session."""
  cores = os.cpu_count() or 1
  intra = FLAGS.intra_op_threads or max(1, cores // ranks.local_size)
  config = tf.ConfigProto(intra_op_parallelism_threads=intra,
                          inter_op_parallelism_threads=FLAGS.inter_op_threads or 2,
                          allow_soft_placement=True)
  if device.kind == "GPU":
    config.gpu_options.allow_growth = True
    # One card per rank: the local rank picks it.
    config.gpu_options.visible_device_list = str(gpu_index(ranks, len(device.gpus)))
  else:
    config.device_count["GPU"] = 0
  if FLAGS.use_xla:
    config.graph_options.optimizer_options.global_jit_level = tf.OptimizerOptions.ON_1
  return config


def enable_cpu_xla(argv):
  """Lets --use_xla auto-cluster on a CPU too: TensorFlow applies global_jit_level to
  GPUs only unless TF_XLA_FLAGS holds --tf_xla_cpu_global_jit. TensorFlow reads it once,
  and within absl's app.run too early for main to set it, so this runs before app.run
  on the command line `argv` (where a GPU build might find a GPU, it is left alone)."""
  try:
    FLAGS(argv)
  except flags.Error:
    return  # app.run reports it.
  if not FLAGS.use_xla or (FLAGS.device != "cpu" and tf.test.is_built_with_cuda()):
    return
  flags_now = os.environ.get("TF_XLA_FLAGS", "")
  if "--tf_xla_cpu_global_jit" not in flags_now:
    os.environ["TF_XLA_FLAGS"] = (flags_now + " --tf_xla_cpu_global_jit").strip()


def build_model(bert_config, features, is_training, dtype):
  """BERT with its two pretraining heads on a batch of features.

  Returns:
    dict of tensors: total_loss, mlm_loss, nsp_loss (float32 scalars) and the sums that
    evaluation adds up over batches: mlm_correct, mlm_weight, mlm_loss_sum, nsp_correct,
    nsp_count, nsp_loss_sum.
  """
  model = modeling.BertModel(config=bert_config, is_training=is_training,
                             input_ids=features["input_ids"],
                             input_mask=features["input_mask"],
                             token_type_ids=features["segment_ids"],
                             compute_type=dtype)
  with tf.variable_scope("", custom_getter=modeling.get_custom_getter(dtype)):
    (mlm_loss, mlm_example_loss, mlm_log_probs) = modeling.get_masked_lm_output(
        bert_config, model.get_sequence_output(), model.get_embedding_table(),
        features["masked_lm_positions"], features["masked_lm_ids"],
        features["masked_lm_weights"])
    (nsp_loss, nsp_example_loss, nsp_log_probs) = modeling.get_next_sentence_output(
        bert_config, model.get_pooled_output(), features["next_sentence_labels"])

  mlm_ids = tf.reshape(features["masked_lm_ids"], [-1])
  mlm_weights = tf.reshape(features["masked_lm_weights"], [-1])
  mlm_hits = tf.cast(tf.equal(tf.argmax(mlm_log_probs, axis=-1, output_type=tf.int32), mlm_ids),
                     tf.float32)
  nsp_labels = tf.reshape(features["next_sentence_labels"], [-1])
  nsp_hits = tf.cast(tf.equal(tf.argmax(nsp_log_probs, axis=-1, output_type=tf.int32),
                              nsp_labels), tf.float32)
  return {
      "total_loss": mlm_loss + nsp_loss,
      "mlm_loss": mlm_loss,
      "nsp_loss": nsp_loss,
      "mlm_correct": tf.reduce_sum(mlm_hits * mlm_weights),
      "mlm_weight": tf.reduce_sum(mlm_weights),
      "mlm_loss_sum": tf.reduce_sum(mlm_example_loss * mlm_weights),
      "nsp_correct": tf.reduce_sum(nsp_hits),
      "nsp_count": tf.cast(tf.size(nsp_hits), tf.float32),
      "nsp_loss_sum": tf.reduce_sum(nsp_example_loss),
  }


EVAL_SUMS = ("mlm_correct", "mlm_weight", "mlm_loss_sum", "nsp_correct", "nsp_count",
             "nsp_loss_sum")


class Evaluator(object):
  """Evaluates the current weights on the eval set; each rank reads its part of it and
  the sums are all-reduced, so N ranks report what one card would on the whole set.

  Args:
    bert_config: BertConfig.
    eval_files: list of TFRecord paths.
    ranks: Ranks.
    dtype: compute type of the model.
    batch_size, max_seq_length, max_predictions_per_seq: of the eval records.
    max_eval_steps: batches per rank (0: the whole set).
  """

  def __init__(self, bert_config, eval_files, ranks, dtype, batch_size, max_seq_length,
               max_predictions_per_seq, max_eval_steps=0):
    dataset = input_pipeline.make_dataset(
        eval_files, batch_size, max_seq_length, max_predictions_per_seq,
        is_training=False, num_shards=ranks.size, shard_index=ranks.rank,
        vocab_size=bert_config.vocab_size)
    if max_eval_steps > 0:
      dataset = dataset.take(max_eval_steps)
    self.iterator = tf.data.make_initializable_iterator(dataset)
    # AUTO_REUSE: the eval model shares the training model's variables, or makes them
    # when there is no training.
    with tf.variable_scope("", reuse=tf.AUTO_REUSE):
      outputs = build_model(bert_config, self.iterator.get_next(), False, dtype)
    self.batch_sums = tf.stack([outputs[k] for k in EVAL_SUMS])
    self.ranks = ranks
    if ranks.hvd is not None:
      self.rank_sums = tf.placeholder(tf.float64, [len(EVAL_SUMS)])
      self.all_sums = ranks.hvd.allreduce(self.rank_sums, op=ranks.hvd.Sum,
                                          name="eval_sums")

  def evaluate(self, sess):
    """Returns dict: masked_lm_accuracy, masked_lm_loss, next_sentence_accuracy,
    next_sentence_loss, eval_samples."""
    sess.run(self.iterator.initializer)
    sums = np.zeros(len(EVAL_SUMS), np.float64)
    while True:
      try:
        sums += sess.run(self.batch_sums)
      except tf.errors.OutOfRangeError:
        break
    if self.ranks.hvd is not None:
      sums = sess.run(self.all_sums, {self.rank_sums: sums})
    s = dict(zip(EVAL_SUMS, sums))
    return {
        "masked_lm_accuracy": s["mlm_correct"] / max(s["mlm_weight"], 1e-12),
        "masked_lm_loss": s["mlm_loss_sum"] / max(s["mlm_weight"], 1e-12),
        "next_sentence_accuracy": s["nsp_correct"] / max(s["nsp_count"], 1.0),
        "next_sentence_loss": s["nsp_loss_sum"] / max(s["nsp_count"], 1.0),
        "eval_samples": int(s["nsp_count"]),
    }


def log_hyperparameters(logger, ranks, global_batch_size, learning_rate):
  """The MLPerf hyperparameter keys of the BERT benchmark."""
  c = logs.mllog.constants
  logger.mlperf(c.SUBMISSION_BENCHMARK, "bert")
  logger.mlperf(c.SUBMISSION_ORG, FLAGS.submission_org)
  logger.mlperf(c.SUBMISSION_PLATFORM, FLAGS.submission_platform)
  logger.mlperf(c.SUBMISSION_DIVISION, "closed")
  logger.mlperf(c.SUBMISSION_STATUS, "onprem")
  # The recipe does not drop the OS page cache (that needs root); the log says so.
  logger.mlperf(c.CACHE_CLEAR, False)
  logger.mlperf(c.GLOBAL_BATCH_SIZE, global_batch_size)
  logger.mlperf("train_batch_size", FLAGS.train_batch_size)
  logger.mlperf("max_sequence_length", FLAGS.max_seq_length)
  logger.mlperf("max_predictions_per_seq", FLAGS.max_predictions_per_seq)
  logger.mlperf(c.GRADIENT_ACCUMULATION_STEPS, FLAGS.num_accumulation_steps)
  logger.mlperf(c.OPT_BASE_LR, learning_rate)
  logger.mlperf(c.OPT_LAMB_EPSILON, FLAGS.epsilon)
  logger.mlperf(c.OPT_LR_TRAINING_STEPS, FLAGS.num_train_steps)
  logger.mlperf(c.OPT_LR_WARMUP_STEPS, FLAGS.num_warmup_steps)
  logger.mlperf("num_warmup_steps", FLAGS.num_warmup_steps)
  logger.mlperf("start_warmup_step", FLAGS.start_warmup_step)
  logger.mlperf(c.OPT_LAMB_BETA_1, FLAGS.beta_1)
  logger.mlperf(c.OPT_LAMB_BETA_2, FLAGS.beta_2)
  logger.mlperf(c.OPT_LAMB_WEIGHT_DECAY, FLAGS.weight_decay_rate)
  logger.mlperf(c.OPT_LAMB_LR_DECAY_POLY_POWER, FLAGS.poly_power)
  logger.mlperf("opt_name", FLAGS.optimizer)
  logger.mlperf("num_ranks", ranks.size)


def run(bert_config, train_files, eval_files, ranks, device, skipped_records=None, stop=None):
  """Builds the graph, then trains and evaluates. Returns the process exit status.

  device: Device (detect_device). skipped_records: (optional)
  input_pipeline.SkippedRecords, the training records left out (--skip_corrupt_records).
  stop: (optional) the installed signals.StopRequest: SIGTERM or SIGINT then stop the
  training after the current update, on every rank, with a checkpoint.
  """
  stop = stop or signals.StopRequest()
  run_start = time.time()
  is_chief = ranks.is_chief
  config = session_config(ranks, device)
  name = ""
  if device.kind == "GPU" and is_chief:
    name = gpu_name(device.gpus[gpu_index(ranks, len(device.gpus))], config)
  where = device_line(device, ranks, name)
  logger = logs.RunLogger(
      output_dir=FLAGS.output_dir, is_chief=is_chief,
      dllog_path=FLAGS.dllog_path or os.path.join(FLAGS.output_dir, "dllog.json"),
      mllog_path=FLAGS.mllog_path or logs.new_log_path(FLAGS.output_dir, "mlperf", ".log"))
  logger.mlperf(logs.mllog.constants.INIT_START, kind="start")
  logger.print("device: " + where)
  logger.mlperf("device", where)
  logger.record("device", {"device": where, "kind": device.kind,
                           "compute_type": device.dtype.name})
  if FLAGS.seed is not None:
    tf.set_random_seed(FLAGS.seed)
  dtype = device.dtype
  global_batch_size = FLAGS.train_batch_size * FLAGS.num_accumulation_steps * ranks.size
  learning_rate_value = FLAGS.learning_rate * (ranks.size if FLAGS.scale_lr_by_ranks else 1)
  logger.print("bert_pretrain: %d rank(s), batch %d x %d accumulation x %d ranks = %d "
               "sentences per update, seq %d, %s compute, optimizer %s, lr %g%s"
               % (ranks.size, FLAGS.train_batch_size, FLAGS.num_accumulation_steps, ranks.size,
                  global_batch_size, FLAGS.max_seq_length, dtype.name, FLAGS.optimizer,
                  learning_rate_value,
                  " (scaled by ranks)" if FLAGS.scale_lr_by_ranks else ""))
  log_hyperparameters(logger, ranks, global_batch_size, learning_rate_value)
  if skipped_records is not None and FLAGS.skip_corrupt_records:
    bad = skipped_records.bad
    logger.print("--skip_corrupt_records: %d of %d training records skipped%s"
                 % (len(bad), skipped_records.records,
                    "; first: " + input_pipeline.describe_bad_record(bad[0]) if bad else ""))
    logger.metrics(0, {"skipped_records": len(bad), "records": skipped_records.records},
                   prefix="data")

  global_step = tf.train.get_or_create_global_step()
  outputs = update_op = accumulate_op = learning_rate = loss_scale = None
  if FLAGS.do_train:
    skip_batches = tf.placeholder_with_default(tf.constant(0, tf.int64), [])
    dataset = input_pipeline.make_dataset(
        train_files, FLAGS.train_batch_size, FLAGS.max_seq_length,
        FLAGS.max_predictions_per_seq, is_training=True, num_shards=ranks.size,
        shard_index=ranks.rank, shuffle_buffer=FLAGS.shuffle_buffer, seed=FLAGS.seed,
        vocab_size=bert_config.vocab_size,
        skip_records=skipped_records.bad if skipped_records is not None else (),
        skip_batches=skip_batches)
    train_iterator = tf.data.make_initializable_iterator(dataset)
    features = train_iterator.get_next()
    outputs = build_model(bert_config, features, True, dtype)
    learning_rate = optimization.learning_rate_schedule(
        global_step, learning_rate_value, FLAGS.num_train_steps, FLAGS.num_warmup_steps,
        FLAGS.poly_power, FLAGS.start_warmup_step)
    optimizer = optimization.create_optimizer(FLAGS.optimizer, learning_rate,
                                              FLAGS.weight_decay_rate, FLAGS.beta_1,
                                              FLAGS.beta_2, FLAGS.epsilon)
    if dtype == tf.float16:
      loss_scale = optimization.DynamicLossScale(initial_scale=FLAGS.init_loss_scale)
    allreduce_fn = None
    if ranks.hvd is not None:
      hvd = ranks.hvd
      allreduce_fn = lambda grads: [hvd.allreduce(g, op=hvd.Average) for g in grads]
    (accumulate_op, update_op) = optimization.create_train_ops(
        outputs["total_loss"], optimizer, global_step, FLAGS.num_accumulation_steps,
        allreduce_fn=allreduce_fn if FLAGS.allreduce_post_accumulation else None,
        loss_scale=loss_scale,
        pre_accumulation_fn=None if FLAGS.allreduce_post_accumulation else allreduce_fn,
        compile_optimizer=FLAGS.use_xla)
  if FLAGS.do_train:
    losses = tf.stack([outputs["total_loss"], outputs["mlm_loss"], outputs["nsp_loss"]])
    if ranks.hvd is not None:
      losses = ranks.hvd.allreduce(losses, op=ranks.hvd.Average, name="display_losses")
    stop_feed, stop_agreed = signals.agreed_signal(ranks.hvd)
    with tf.control_dependencies([update_op]):
      # global_step after the update: one more, or the same when loss scaling skipped
      # an update whose gradients overflowed.
      step_fetches = {"step": global_step.read_value()}
      if loss_scale is not None:
        step_fetches.update(loss_scale=loss_scale.scale.read_value(),
                            skipped_steps=loss_scale.skipped_steps.read_value())
    # The stop request agreed by all ranks, in the same session run as the update.
    step_fetches["stop_signal"] = stop_agreed
    # When this rank's forward pass ended (seconds since the epoch): what the step took
    # here before waiting for the other ranks in the all-reduce.
    with tf.control_dependencies([outputs["total_loss"]]):
      forward_done = tf.timestamp()
    display_fetches = dict(step_fetches, losses=losses, learning_rate=learning_rate,
                           forward_done=forward_done)
    rank_times = None
    if ranks.hvd is not None:
      # Gathered on display steps only: each rank's input + forward time of that step.
      rank_time = tf.placeholder(tf.float64, [1])
      rank_times = ranks.hvd.allgather(rank_time, name="rank_step_times")
  evaluator = None
  if FLAGS.do_eval:
    evaluator = Evaluator(bert_config, eval_files, ranks, dtype, FLAGS.eval_batch_size,
                          FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
                          FLAGS.max_eval_steps)

  model_variables = tf.trainable_variables()
  # max_to_keep=0 keeps every checkpoint. Relative paths in the `checkpoint` file keep a
  # copied or moved output_dir pointing at its own files.
  saver = tf.train.Saver(max_to_keep=FLAGS.keep_checkpoint_max or None,
                         save_relative_paths=True)
  # Checked before every save: nothing with NaN or Inf is written. Weights are the same
  # on every rank, so every rank gets the same answer and they stop together.
  all_finite = checkpoints.all_finite(tf.global_variables())
  broadcast_op = ranks.hvd.broadcast_global_variables(0) if ranks.hvd is not None else None

  sess = tf.Session(config=config)
  sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
  # check_flags read its values already.
  resume_prefix = checkpoints.find_resume_checkpoint(FLAGS.output_dir,
                                                     resume_settings(bert_config),
                                                     check_values=False)
  if resume_prefix:
    checkpoints.check_resumable(resume_prefix, tf.global_variables())
    present = dict(tf.train.list_variables(resume_prefix))
    tf.train.Saver(var_list=[v for v in tf.global_variables()
                             if v.op.name in present]).restore(sess, resume_prefix)
    # The earlier run's checkpoints in this output_dir (never those the `checkpoint`
    # file may name elsewhere) stay in the rotation of --keep_checkpoint_max.
    saver.recover_last_checkpoints(
        [prefix for _, prefix in checkpoints.list_checkpoints(FLAGS.output_dir)])
    logger.print("Resuming from %s at step %d (weights, optimizer state, learning-rate "
                 "schedule); --init_checkpoint is not applied"
                 % (resume_prefix, sess.run(global_step)))
  elif FLAGS.init_checkpoint:
    checkpoints.restore_model_weights(sess, checkpoints.resolve_checkpoint(FLAGS.init_checkpoint),
                                      model_variables, log=logger.print)
  else:
    logger.print("No --init_checkpoint: the model starts from random weights")
  if broadcast_op is not None:
    sess.run(broadcast_op)
  if FLAGS.do_train:
    sess.run(train_iterator.initializer,
             {skip_batches: data_position(int(sess.run(global_step)), logger.print)})
  if is_chief and FLAGS.do_train:
    checkpoints.write_run_marker(FLAGS.output_dir, resume_settings(bert_config))
  sess.graph.finalize()  # Nothing may add ops inside the loop.
  logger.mlperf(logs.mllog.constants.INIT_STOP, kind="end")
  logger.mlperf(logs.mllog.constants.RUN_START, kind="start")

  step = int(sess.run(global_step))
  results = {}
  last_eval_step = None
  status = "aborted"
  eval_time = 0.0

  monitor = health.HealthMonitor()

  def evaluate(at_step):
    nonlocal eval_time, last_eval_step
    start = time.time()
    samples = {"epoch_num": at_step * global_batch_size}
    logger.mlperf(logs.mllog.constants.EVAL_START, metadata=samples, kind="start")
    res = evaluator.evaluate(sess)
    logger.mlperf(logs.mllog.constants.EVAL_STOP, metadata=samples, kind="end")
    eval_time += time.time() - start
    res["eval_time_s"] = round(time.time() - start, 3)
    if last_eval_step is None:
      logger.mlperf(logs.mllog.constants.EVAL_SAMPLES, res["eval_samples"])
    last_eval_step = at_step
    logger.mlperf(logs.mllog.constants.EVAL_ACCURACY, res["masked_lm_accuracy"],
                  metadata=samples)
    logger.eval_results(at_step, res, FLAGS.output_dir if is_chief else None,
                        samples=at_step * global_batch_size)
    for warning in monitor.evaluation(at_step, res["masked_lm_accuracy"]):
      logger.warning(at_step, warning)
    return res

  def reached_target(res):
    return FLAGS.stop_threshold > 0 and res["masked_lm_accuracy"] >= FLAGS.stop_threshold

  if evaluator is not None and (FLAGS.eval_at_start or not FLAGS.do_train):
    results = evaluate(step)
    results_at_start = results
  else:
    results_at_start = None

  # Throughput bookkeeping: steps after the first fps_warmup_steps, without checkpoint
  # and evaluation time, give the steady-state FPS.
  trained_sentences = 0
  steady_sentences = 0
  steady_time = 0.0
  checkpoint_time = 0.0
  loop_start = time.time()
  window_start, window_steps = time.time(), 0
  iterations = 0  # updates run in this process, skipped ones included
  last_scale = sess.run(loss_scale.scale) if loss_scale is not None else None
  next_eval_samples = max(FLAGS.samples_start_eval, step * global_batch_size +
                          FLAGS.samples_between_eval)
  last_saved = step
  loss_is_finite = True
  loop_eval_time = 0.0
  if FLAGS.do_train and step >= FLAGS.num_train_steps:
    logger.print("global_step %d already reached --num_train_steps=%d; nothing to train"
                 % (step, FLAGS.num_train_steps))
  block_first_step = None  # MLPerf "blocks": the training between two evaluations.
  stopped_by = 0  # The signal that stopped the training (all ranks agree), 0: none.
  stop.arm()

  def weights_are_finite():
    """Runs the all-finite check before a save; says so when it fails."""
    if sess.run(all_finite):
      return True
    saved = checkpoints.list_checkpoints(FLAGS.output_dir)
    logger.print("NaN or Inf in the weights or optimizer state after step %d: stopping "
                 "without saving. Lower --learning_rate or raise --num_warmup_steps and run "
                 "again: %s" % (step, "it resumes from %s" % os.path.basename(saved[-1][1])
                                if saved else "it starts anew"))
    return False

  def block(kind):
    nonlocal block_first_step
    if kind == "start":
      block_first_step = step
    metadata = {"first_epoch_num": block_first_step * global_batch_size,
                "epoch_count": FLAGS.samples_between_eval}
    logger.mlperf(logs.mllog.constants.BLOCK_START if kind == "start"
                  else logs.mllog.constants.BLOCK_STOP, metadata=metadata, kind=kind)
    if kind == "end":
      block_first_step = None

  while FLAGS.do_train and step < FLAGS.num_train_steps:
    if block_first_step is None:
      block("start")
    step_start = time.time()
    for _ in range(FLAGS.num_accumulation_steps - 1):
      sess.run(accumulate_op)
    display = step + 1 == FLAGS.num_train_steps or (step + 1) % FLAGS.display_loss_steps == 0
    # Losses are fetched (and averaged over ranks) on display steps only.
    values = sess.run(display_fetches if display else step_fetches, {stop_feed: stop.signum})
    step_time = time.time() - step_start
    iterations += 1
    trained_sentences += global_batch_size
    if iterations > FLAGS.fps_warmup_steps:
      steady_sentences += global_batch_size
      steady_time += step_time
    window_steps += 1
    if values["step"] == step:
      # Skipped by loss scaling (the scale is halved): this update is run again with
      # new data, and only applied updates count towards --num_train_steps.
      if last_scale <= 1.0:
        loss_is_finite = False
        logger.print("Gradients are not finite at step %d even with loss scale 1: stopping "
                     "without saving. Lower --learning_rate or raise --num_warmup_steps"
                     % (step + 1))
        break
      last_scale = values["loss_scale"]
      continue
    step = int(values["step"])
    if loss_scale is not None:
      last_scale = values["loss_scale"]

    if step % FLAGS.display_loss_steps == 0 or step == FLAGS.num_train_steps:
      window_fps = window_steps * global_batch_size / max(time.time() - window_start, 1e-9)
      total_loss, mlm_loss, nsp_loss = values["losses"]
      line = ("Step %d, total_loss: %.4f, mlm_loss: %.4f, nsp_loss: %.4f, learning_rate: %.3e, "
              "sentences_per_second: %.2f" % (step, total_loss, mlm_loss, nsp_loss,
                                              values["learning_rate"], window_fps))
      if loss_scale is not None:
        line += ", loss_scale: %g, skipped_steps: %d" % (values["loss_scale"],
                                                         values["skipped_steps"])
      logger.print(line)
      logged = {"total_loss": total_loss, "mlm_loss": mlm_loss, "nsp_loss": nsp_loss,
                "learning_rate": values["learning_rate"], "throughput_train": window_fps,
                "samples": step * global_batch_size}
      scale = skipped = None
      if loss_scale is not None:
        scale, skipped = values["loss_scale"], values["skipped_steps"]
        logged.update(loss_scale=scale, skipped_steps=skipped)
      logger.metrics(step, logged, prefix="train")
      warnings = monitor.window(step, window_fps, window_steps, scale, skipped)
      if rank_times is not None:
        own_time = values["forward_done"] - step_start
        warnings += monitor.rank_step_times(
            step, list(sess.run(rank_times, {rank_time: [own_time]})))
      for warning in warnings:
        logger.warning(step, warning)
      # All ranks see the same averaged loss, so they stop together. With loss
      # scaling a non-finite step is skipped, not fatal.
      loss_is_finite = bool(np.isfinite(total_loss)) or loss_scale is not None
      if not loss_is_finite:
        logger.print("Loss is %s at step %d: stopping without saving. Lower --learning_rate "
                     "or raise --num_warmup_steps" % (total_loss, step))
        break
      window_start, window_steps = time.time(), 0

    if step % FLAGS.save_checkpoints_steps == 0:
      start = time.time()
      loss_is_finite = weights_are_finite()
      if not loss_is_finite:
        break
      if is_chief:
        checkpoints.save_checkpoint(saver, sess, FLAGS.output_dir, step)
      checkpoint_time += time.time() - start
      last_saved = step
      window_start += time.time() - start

    stopped_by = int(values["stop_signal"])
    if stopped_by:
      # Every rank says where it stopped: the ranks agree on the step.
      print("%s: rank %d stops after step %d; to resume, run the same command with "
            "--output_dir=%s" % (signals.name(stopped_by), ranks.rank, step, FLAGS.output_dir),
            flush=True)
      break
    if evaluator is not None and step * global_batch_size >= next_eval_samples \
        and step < FLAGS.num_train_steps:
      while next_eval_samples <= step * global_batch_size:
        next_eval_samples += FLAGS.samples_between_eval
      block("end")
      results = evaluate(step)
      loop_eval_time += results["eval_time_s"]
      window_start += results["eval_time_s"]
      if reached_target(results):
        logger.print("masked_lm_accuracy %.4f reached --stop_threshold=%g at step %d"
                     % (results["masked_lm_accuracy"], FLAGS.stop_threshold, step))
        break
  train_time = time.time() - loop_start
  if block_first_step is not None:
    block("end")

  if FLAGS.do_train and step != last_saved and loss_is_finite:
    loss_is_finite = weights_are_finite()
    if loss_is_finite and is_chief:
      checkpoints.save_checkpoint(saver, sess, FLAGS.output_dir, step)
  if evaluator is not None and last_eval_step != step and loss_is_finite and not stopped_by:
    results = evaluate(step)
  if results and reached_target(results):
    status = "success"
  logger.mlperf(logs.mllog.constants.TRAIN_SAMPLES, step * global_batch_size)
  logger.mlperf(logs.mllog.constants.RUN_STOP, kind="end", metadata={"status": status})

  e2e_time = time.time() - run_start
  fps_all = trained_sentences / max(train_time - loop_eval_time, 1e-9)
  fps_steady = steady_sentences / steady_time if steady_time > 0 else fps_all
  summary = {"e2e_time_s": e2e_time, "training_sentences": trained_sentences,
             "throughput_with_overhead": fps_all, "throughput": fps_steady,
             "checkpoint_time_s": checkpoint_time, "eval_time_s": eval_time}
  if results_at_start and FLAGS.do_train:
    logger.print("masked_lm_accuracy before training: %.4f"
                 % results_at_start["masked_lm_accuracy"])
  logger.print("e2e_time: %.2f s, training sentences: %d, checkpoint time: %.2f s, eval time: "
               "%.2f s" % (e2e_time, trained_sentences, checkpoint_time, eval_time))
  logger.print("Throughput Average (sentences/sec) with overhead = %.2f (warm-up and checkpoint "
               "time included, evaluation excluded)" % fps_all)
  logger.print("Throughput Average (sentences/sec) = %.2f (after %d warm-up steps, without "
               "checkpoint and eval time)" % (fps_steady, FLAGS.fps_warmup_steps))
  accuracy = results.get("masked_lm_accuracy") if results else None
  cards = "1 card" if ranks.size == 1 else "%d cards" % ranks.size
  logger.print("| %s | acc %s | fps %.2f | status %s |"
               % (cards, "%.6f" % accuracy if accuracy is not None else "n/a", fps_steady,
                  status if FLAGS.stop_threshold > 0 else "no target"))
  logger.metrics(step, summary, prefix="summary")
  logger.close()
  if stopped_by and ranks.hvd is not None:
    # A barrier: no rank exits (which makes the launcher end the others) before rank 0
    # has saved and written its logs.
    sess.run(stop_agreed)
  sess.close()
  if is_chief:
    dllog_path = FLAGS.dllog_path or os.path.join(FLAGS.output_dir, "dllog.json")
    try:
      report.write_report(FLAGS.output_dir, dllog_path)
    except (ValueError, EnvironmentError, RuntimeError) as e:
      print("report: not drawn (%s); the run itself is complete" % e)
  if stopped_by:
    return signals.exit_status(stopped_by)
  return 0 if loss_is_finite else 1


def data_position(step, log):
  """Micro-batches of this rank's training data to skip when resuming at `step`.

  With --seed the data order is the same in every run, so a resumed run skips what the
  run it resumes consumed (step x num_accumulation_steps micro-batches per rank) and
  continues that order. Without --seed a resumed run starts a new shuffled pass.
  """
  if step == 0:
    return 0
  if FLAGS.seed is None:
    log("Data: no --seed, so the resumed run starts a new shuffled pass over the data "
        "(with --seed it continues the data order where the run stopped)")
    return 0
  skip = step * FLAGS.num_accumulation_steps
  log("Data: skipping the %d micro-batches (%d records) of each rank that the run consumed "
      "up to step %d; the data order continues where it stopped"
      % (skip, skip * FLAGS.train_batch_size, step))
  return skip


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("unexpected arguments: %s; flags take the form --name=value"
                         % " ".join(argv[1:]))
  tf.logging.set_verbosity(tf.logging.ERROR)
  tf.disable_v2_behavior()
  stop = signals.StopRequest()
  stop.install()
  try:
    device = detect_device()
    bert_config, train_files, eval_files, skipped_records = check_flags()
  except ValueError as e:
    print("run_pretraining: error: %s" % e, file=sys.stderr)
    return 2
  ranks = None
  try:
    ranks = Ranks(FLAGS.horovod, FLAGS.stall_timeout_s, FLAGS.output_dir)
    if ranks.is_chief:
      # Held while this frame lives (the whole run); a Horovod job's other ranks share it.
      lock = checkpoints.OutputDirLock(FLAGS.output_dir)
      lock.acquire()
      removed = checkpoints.remove_partial_checkpoints(FLAGS.output_dir)
      if removed:
        print("Removed what an interrupted save left in %s: %s"
              % (FLAGS.output_dir, ", ".join(removed)))
    status = run(bert_config, train_files, eval_files, ranks, device, skipped_records, stop)
    ranks.stop()
    return status
  except ValueError as e:
    print("run_pretraining: error: %s" % e, file=sys.stderr)
    return 2
  except EnvironmentError as e:
    if not checkpoints.is_disk_full(e):
      raise
    print("run_pretraining: error: %s" % checkpoints.disk_full_message(
        FLAGS.output_dir, e.filename or "its logs"), file=sys.stderr)
    return 2
  except tf.errors.ResourceExhaustedError as e:
    if checkpoints.is_disk_full(e):
      print("run_pretraining: error: %s" % checkpoints.disk_full_message(
          FLAGS.output_dir, "its files"), file=sys.stderr)
      return 2
    print("run_pretraining: error: out of memory (%s); lower --train_batch_size and raise "
          "--num_accumulation_steps to keep the global batch" % e.message.splitlines()[0],
          file=sys.stderr)
    return 2
  except tf.errors.DataLossError as e:
    print("run_pretraining: error: %s" % bad_record_message(e, bert_config, train_files,
                                                            eval_files, ranks),
          file=sys.stderr)
    return 2
  except tf.errors.InvalidArgumentError as e:
    if input_pipeline.TOKEN_ID_ERROR not in e.message:
      raise
    print("run_pretraining: error: %s" % bad_record_message(e, bert_config, train_files,
                                                            eval_files, ranks),
          file=sys.stderr)
    return 2
  except tf.errors.OpError as e:
    if ranks is None or ranks.hvd is None or not _is_horovod_error(e.message):
      raise
    stalled = ranks.stalled_ranks()
    print("run_pretraining: error: Horovod stopped the job (%s)%s; checkpoints in %s are "
          "kept: rerun the same command to resume"
          % (_error_line(e.message).split(". ")[0],
             "; rank %s stopped answering" % ", ".join(str(r) for r in stalled) if stalled
             else "; a rank stalled or failed: its number is in the lines above "
             "('Missing ranks', or its own error)", FLAGS.output_dir), file=sys.stderr)
    return 3


def bad_record_message(error, bert_config, train_files, eval_files, ranks):
  """The one-line error for a bad record met while training or evaluating: reads this
  rank's files to name the file and the record (the rest of the line says what to do)."""
  where = []
  for files in (train_files, eval_files):
    where.extend(input_pipeline.rank_files(files, ranks.size if ranks else 1,
                                           ranks.rank if ranks else 0))
  record = input_pipeline.locate_bad_record(where, FLAGS.max_seq_length,
                                            FLAGS.max_predictions_per_seq,
                                            bert_config.vocab_size, error.message)
  if record is None:
    return ("bad TFRecord data (%s); find it with python3 tools/inspect_tfrecords.py "
            "--input=%s" % (_error_line(error.message), FLAGS.input_files_dir))
  if "token id" in record.problem:
    fix = ("use the bert_config.json whose vocab_size matches the data's vocab, re-create "
           "the file, or pass --skip_corrupt_records")
  else:
    fix = "re-create or remove the file, or pass --skip_corrupt_records"
  return "bad TFRecord %s; %s; checkpoints in %s are kept" % (
      input_pipeline.describe_bad_record(record), fix, FLAGS.output_dir)


def _error_line(message):
  """The informative line of a TensorFlow error message (not "Graph execution error:")."""
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  for line in lines:
    if not line.startswith(("Graph execution error", "Detected at node", "File ", "Node:",
                            "[[", "Traceback")) and not line.endswith(":"):
      return line
  return lines[0] if lines else "no message"


def _is_horovod_error(message):
  """True for the errors Horovod raises when the job is broken (a rank stalled or gone)."""
  return any(word in message for word in ("Horovod", "horovod", "gloo", "Gloo"))


if __name__ == "__main__":
  enable_cpu_xla(sys.argv)
  app.run(lambda argv: sys.exit(main(argv)))
