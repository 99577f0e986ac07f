"""The settings of a pretraining run, each written once.

One plain dataclass per concern; its fields are the command-line flags (define_flags makes
absl flags of them, with the field's default and help), and the code below the entry
points takes a section, never the flags:

  Data        the training and evaluation records, how they are read and checked
  Model       the BERT config, the initial checkpoint, the vocab
  Optimizer   LAMB or Adam, the learning-rate schedule, accumulation, clipping
  Evaluation  when and how much to evaluate, the target, the load check
  Run         output_dir, batch, steps, seed, checkpoints, logs
  Runtime     device, precision, engine, threads (run_classifier shares it)

PRESETS are the settings the scripts and the demo choose (--preset), kept as data; the
flags given on the command line win over a preset, a preset over the defaults. A script's
preset without --input_files_dir is the embedded demo, whose settings win over the
script's. The defaults are MLPerf's rules (sequence 512, LAMB as its reference, its
evaluation and target); the learning rate and steps are the model zoo script's, and
--reference_hyperparameters takes those of MLPerf's RCP for the run's global batch.

ANCHOR_ALIASES maps the flag names of the recipes this one replaces (NVIDIA's, Habana's,
Iluvatar's and MLPerf reference's run_pretraining.py) onto ours; ANCHOR_NOTES lists the
anchors' flags that are accepted and say in one line what this recipe does instead.
"""

import collections
import dataclasses
import os
import typing

from absl import flags

DISTRIBUTIONS = ("none", "horovod", "mirrored", "multi_worker_mirrored")
# Written into output_dir by this recipe: the settings its checkpoints need and the
# layout and data of the run that wrote them (training/checkpoints.py writes and reads it).
RUN_MARKER = "bert_pretrain_run.json"
# MLPerf's sequence length and masked positions: the records' and the run's default.
MAX_SEQ_LENGTH = 512
MAX_PREDICTIONS_PER_SEQ = 76
# Google's and MLPerf's data creation: create_pretraining_data's and the wiki pipeline's.
MASKED_LM_PROB = 0.15
SHORT_SEQ_PROB = 0.1
DUPE_FACTOR = 10
DATA_SEED = 12345
CLIPPING = ("per_micro_batch", "after_allreduce")
CROSS_REPLICA_GRADIENTS = ("sum", "mean")
LR_SCHEDULE_STEPS = ("micro_batch", "update")
RESUME_CHANGES = ("global_batch", "seed", "data", "shuffle_buffer", "tensorflow")
# --seed is below this, as the seed a run draws is (TensorFlow takes int64 seeds).
SEED_LIMIT = 2 ** 31
# The largest finite float32: a flag's number above it is infinite in the graph.
FLOAT32_MAX = 3.4028234663852886e38
# The checkout (or the installed package's parent), where the scripts keep the demo's cache.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def setting(default, help_text, choices=None, is_list=False):
  """A field of a section: its default, its flag's help and, for an enum, its choices."""
  return dataclasses.field(default=default, metadata={
      "help": help_text, "choices": choices, "list": is_list})


@dataclasses.dataclass
class Data(object):
  input_files_dir: typing.Optional[str] = setting(
      None, "Folder (or glob) of the training TFRecords.")
  eval_files_dir: typing.Optional[str] = setting(
      None, "Folder (or glob) of the evaluation TFRecords.")
  max_seq_length: int = setting(MAX_SEQ_LENGTH, "Tokens per sequence; must match the records.")
  max_predictions_per_seq: int = setting(
      MAX_PREDICTIONS_PER_SEQ, "Masked positions per sequence; must match the records.")
  shuffle_buffer: int = setting(10000, "Training records held for shuffling.")
  skip_corrupt_records: bool = setting(
      False, "Read every training record before training and leave out the corrupt ones "
      "(bad CRC, cut short, other lengths, token ids outside the vocab), counted in the "
      "log, instead of stopping at the first.")
  max_corrupt_share: float = setting(
      0.001, "With --skip_corrupt_records: stop when more than this fraction of the "
      "training records is corrupt.")
  full_record_check_mb: int = setting(
      256, "Data sets smaller than this (MB) are read whole before training (CRCs, "
      "framing); larger ones check each file's first record up front and locate a bad "
      "record when training meets it.")
  enable_packed_data_mode: bool = setting(
      False, "Expect packed records (python3 -m bert_pretrain.pack_records); they are "
      "recognised from their features anyway, and with this flag unpacked ones are an "
      "error. The demo then trains on its records packed.")
  avg_seq_per_pack: float = setting(
      0.0, "Packed records: the mean sequences a pack, which turns packs into samples "
      "(the global batch, the evaluation interval, FPS, mllog); 0: the packer's figure "
      "from pack_records.json beside the records; given with it, within 0.05 of it (the "
      "file's is used); between 1 and the sequences a pack holds.")
  log_trained_records: bool = setting(
      False, "Append a fingerprint of every record each micro-batch trains on to "
      "output_dir/trained_records-rank-N.txt (N: the process; lines 'update micro-batch "
      "fingerprints...'), to check which records a run and its resumed runs trained on.")


@dataclasses.dataclass
class Model(object):
  bert_config_file: typing.Optional[str] = setting(
      None, "bert_config.json of the model to train.")
  init_checkpoint: typing.Optional[str] = setting(
      None, "Checkpoint whose model weights start the run: a prefix (model.ckpt-28252), "
      "one of its files, or a folder. Ignored when --output_dir already holds a checkpoint "
      "of this recipe (resume).")
  vocab_file: typing.Optional[str] = setting(
      None, "(optional) vocab.txt; checked against vocab_size.")


@dataclasses.dataclass
class Optimizer(object):
  optimizer: str = setting("lamb", "LAMB or Adam with weight decay.", choices=["lamb", "adam"])
  learning_rate: float = setting(5e-5, "Peak learning rate.")
  num_train_steps: int = setting(13206, "Optimizer updates to train for.")
  num_warmup_steps: int = setting(0, "Updates of linear learning-rate warm-up.")
  start_warmup_step: int = setting(0, "Update at which the warm-up starts.")
  poly_power: float = setting(1.0, "Power of the polynomial learning-rate decay.")
  weight_decay_rate: float = setting(
      0.01, "Decoupled weight decay (not on LayerNorm, bias).")
  beta_1: float = setting(0.9, "First-moment decay.")
  beta_2: float = setting(0.999, "Second-moment decay.")
  epsilon: float = setting(1e-6, "Optimizer epsilon.")
  lamb_adapt_layernorm_and_bias: bool = setting(
      False, "LAMB's trust ratio ||w|| / ||update|| for LayerNorm and bias variables too, "
      "as NVIDIA's LAMB does; by default they keep a ratio of 1, as in MLPerf's reference.")
  gradient_clipping: str = setting(
      "per_micro_batch", "Where gradients are clipped to global norm 1.0: "
      "per_micro_batch (MLPerf's reference and NVIDIA: each micro-batch's gradient on "
      "each rank, before accumulation and the all-reduce) or after_allreduce (the "
      "update's mean gradient; then k micro-batches of b and r ranks update as one batch "
      "of k*r*b). MLPerf's rules allow both.", choices=list(CLIPPING))
  reference_hyperparameters: bool = setting(
      False, "Take the learning rate, steps, warm-up, betas, epsilon and weight decay of "
      "MLPerf's reference convergence point (RCP) for the run's global batch size; flags "
      "given on the command line still win (a --preset's values do not), and the log "
      "names the RCP.")
  num_accumulation_steps: int = setting(1, "Micro-batches summed into one update.")
  lr_schedule_step: str = setting(
      "micro_batch", "What the learning-rate schedule steps by with accumulation: "
      "micro_batch (MLPerf's reference: its schedule counts micro-batches, k times as "
      "many, and an update takes the value of its last, so update u is at u + (k-1)/k "
      "updates) or update (NVIDIA's: update u is at u).", choices=list(LR_SCHEDULE_STEPS))
  cross_replica_gradients: str = setting(
      "sum", "How the ranks' gradients are combined: sum (MLPerf's reference, TensorFlow's "
      "cross-replica sum: clipped per micro-batch, with LAMB or Adam, r ranks update as "
      "their mean would with epsilon / r) or mean (NVIDIA's and Horovod's average).",
      choices=list(CROSS_REPLICA_GRADIENTS))
  allreduce_post_accumulation: bool = setting(
      True, "All-reduce once per update, after accumulation (otherwise after every "
      "micro-batch).")
  scale_lr_by_ranks: bool = setting(False, "Multiply --learning_rate by the number of ranks.")
  init_loss_scale: float = setting(
      2.0 ** 15, "Initial dynamic loss scale of float16 compute (x2 after 1000 good steps, "
      "halved by an overflowing one).")


@dataclasses.dataclass
class Evaluation(object):
  do_eval: bool = setting(True, "Evaluate on --eval_files_dir (periodically and at the end).")
  eval_at_start: bool = setting(False, "Also evaluate before the first training step.")
  eval_batch_size: int = setting(24, "Sequences per evaluation batch on each card.")
  max_eval_steps: int = setting(0, "Evaluation batches per card (0: the whole set).")
  samples_between_eval: typing.Optional[int] = setting(
      None, "Evaluate every this many training samples (default: MLPerf's rule for the "
      "global batch size, floor(0.05 * (230.23 * batch + 3e6) / 25000) * 25000).")
  samples_start_eval: int = setting(
      0, "No periodic evaluation before this many training samples (MLPerf's evaluations "
      "start at 0).")
  stop_threshold: float = setting(
      0.72, "Stop when masked-LM accuracy reaches this (0: never).")
  expected_initial_accuracy: typing.Optional[float] = setting(
      None, "Masked-LM accuracy expected right after loading --init_checkpoint, checked "
      "by the evaluation at start (--eval_at_start; a warning when it is off by more than "
      "--initial_accuracy_tolerance). Default: 0.34085 for MLPerf's model.ckpt-28252 on "
      "eval_10k, none for other checkpoints.")
  initial_accuracy_tolerance: float = setting(
      0.01, "See --expected_initial_accuracy.")
  allow_random_heads: bool = setting(
      False, "With --nodo_train: evaluate even weights without the masked-LM or "
      "next-sentence head (a fine-tuned encoder, or no checkpoint at all); those heads "
      "are random, so is the accuracy.")


@dataclasses.dataclass
class Run(object):
  output_dir: str = setting("./results", "Checkpoints, TensorBoard events, eval results.")
  do_train: bool = setting(True, "Train.")
  check_only: bool = setting(
      False, "Check the flags, the files and --output_dir as every run does before it "
      "builds anything, then exit (run_multi_card_FPS.sh runs this once before it starts "
      "the ranks of a job on this host).")
  train_batch_size: int = setting(24, "Sequences per micro-batch on each card.")
  seed: typing.Optional[int] = setting(
      None, "Random seed of the data order, the dropout masks and the initialization. "
      "Without it a run draws one and records it in output_dir/bert_pretrain_run.json, "
      "which a resumed run reuses.")
  allow_resume_change: str = setting(
      "", "Resume although the run in --output_dir had another (comma-separated): "
      "global_batch (continue at the same sample with updates of the new size; steps and "
      "schedules go on counting updates), seed (another data order and dropout masks), "
      "data (other training files), shuffle_buffer, tensorflow (another version: another "
      "data order). A changed layout of the same global batch (ranks, "
      "engine, per-card batch, accumulation) needs none: it continues at the same "
      "sample, re-sharded.", is_list=True)
  save_checkpoints_steps: int = setting(
      1000, "Save a checkpoint every this many updates (and always at the end).")
  keep_checkpoint_max: int = setting(5, "Checkpoints kept in output_dir (0: all).")
  display_loss_steps: int = setting(
      10, "Log losses and throughput every this many updates.")
  fps_warmup_steps: int = setting(10, "Updates left out of the steady-state FPS.")
  dllog_path: typing.Optional[str] = setting(
      None, "JSON-lines log (default: output_dir/dllog.json).")
  mllog_path: typing.Optional[str] = setting(
      None, "MLPerf log (default: output_dir/mlperf.log).")
  draw_report: bool = setting(
      True, "Draw output_dir/report.png at the end (losses, accuracy, throughput, learning "
      "rate); the summary lines are printed either way. --nodraw_report saves the 1.5 s "
      "of matplotlib in short runs.")
  peak_tflops: float = setting(
      0.0, "A card's matmul peak in TFLOPS in the run's compute type, for the model FLOPs "
      "utilization (MFU) in the summary (0: none, or measured with --measure_peak).")
  measure_peak: bool = setting(
      False, "Measure the matmul peak at the start (square matmuls in the compute type, "
      "a few seconds) for the MFU, when --peak_tflops is not given.")
  clear_cache: bool = setting(
      False, "Drop the OS page cache on each host before the run starts, as MLPerf's rules "
      "ask of a timed result, and log cache_clear true (needs root).")
  submission_org: str = setting("unknown", "MLPerf log: submitting organization.")
  submission_platform: str = setting("unknown", "MLPerf log: system name.")


@dataclasses.dataclass
class Runtime(object):
  device: str = setting(
      "auto", "auto: a GPU if TensorFlow sees one, else the CPU, but an error when "
      "CUDA_VISIBLE_DEVICES lists cards TensorFlow cannot see; gpu: a GPU or an error; "
      "cpu: the CPU on purpose, even where GPUs are visible.",
      choices=["auto", "gpu", "cpu"])
  amp: bool = setting(
      False, "Mixed precision: float16 compute with loss scaling on GPUs, bfloat16 on CPUs "
      "where TensorFlow computes it faster than float32, float32 on others (see "
      "--amp_dtype); master weights stay float32.")
  use_fp16: bool = setting(False, "Alias of --amp.")
  amp_dtype: str = setting(
      "auto", "Compute type of --amp (auto: float16 on GPUs, bfloat16 on CPUs with "
      "bfloat16 instructions and oneDNN, float32 on others). float16 always uses dynamic "
      "loss scaling, also on a CPU. Setting it implies --amp.",
      choices=["auto", "float16", "bfloat16"])
  distribution: str = setting(
      "none", "How several cards train together: horovod (one process per card, launched "
      "by horovodrun or mpirun), mirrored (this process drives every card of the host: "
      "tf.distribute.MirroredStrategy), multi_worker_mirrored (one process per host, "
      "TF_CONFIG names the workers: tf.distribute.experimental."
      "MultiWorkerMirroredStrategy), none (one card).", choices=list(DISTRIBUTIONS))
  horovod: bool = setting(False, "Same as --distribution=horovod.")
  cpu_devices: int = setting(
      1, "With --distribution=mirrored on a CPU: logical CPU devices, one replica each (to "
      "try the engine; the cores are shared, so it is no faster).")
  use_xla: bool = setting(False, "XLA JIT: auto-clustering of the graph (on a CPU too).")
  intra_op_threads: int = setting(0, "Threads per op (0: cores / ranks on this host).")
  inter_op_threads: int = setting(0, "Ops run at once (0: 2).")
  stall_timeout_s: int = setting(
      300, "With several processes: a rank that does not take part for this long (stuck in "
      "I/O, stopped, frozen), or has not joined the job this long after a process "
      "started, is named and the job ends with an error; sets Horovod's "
      "HOROVOD_STALL_CHECK_TIME_SECONDS and HOROVOD_STALL_SHUTDOWN_TIME_SECONDS unless "
      "they are set (0: never).")

  def engine(self):
    """The engine: --distribution, or horovod for --horovod."""
    return "horovod" if self.horovod else self.distribution


@dataclasses.dataclass
class Demo(object):
  """The embedded demo's (bert_pretrain/demo.py), read when the run is the demo: --preset=demo,
  or a script's preset without --input_files_dir."""
  demo_cache_dir: str = setting(
      os.path.join(ROOT, "demo_cache"), "The demo's data, vocab, config and initial "
      "checkpoint, built here once.")
  demo_finetune_epochs: float = setting(
      3.0, "Epochs of the demo's fine-tuning step (word order, from the pretrained "
      "checkpoint and from random weights) after a run of one process; 0: none.")


@dataclasses.dataclass
class Anchors(object):
  """Flags of the anchors' run_pretraining.py (NVIDIA DeepLearningExamples, Habana's MLPerf
  BERT, Iluvatar's CoreX recipe, MLPerf's reference) that users carry over and that are
  not ours under the same name: other names of our flags (ANCHOR_ALIASES), and flags
  accepted so that a carried-over command line runs, which say in one line what this
  recipe does instead (ANCHOR_NOTES; apply_anchor_flags, which refuses those meaning
  something else here with the fix)."""
  optimizer_type: typing.Optional[str] = setting(None, "The anchors' --optimizer.",
                                                 choices=["lamb", "adam"])
  power: typing.Optional[float] = setting(None, "The anchors' --poly_power.")
  num_eval_iterations: typing.Optional[int] = setting(
      None, "NVIDIA's --max_eval_steps (its fine-tuning scripts'): evaluation batches per "
      "card.")
  manual_fp16: bool = setting(
      False, "The anchors' float16 by casts in the graph: here --amp (float16 with loss "
      "scaling on GPUs, bfloat16 on CPUs where it is faster than float32, see --amp_dtype).")
  eval_checkpoint_path: typing.Optional[str] = setting(
      None, "With --nodo_train: the checkpoint evaluated, as --init_checkpoint.")
  enable_device_warmup: bool = setting(
      False, "Accepted: the FPS always leaves out the first --fps_warmup_steps updates.")
  is_dist_eval_enabled: bool = setting(
      True, "Accepted: evaluation is always distributed over the ranks.")
  iterations_per_loop: int = setting(1, "Accepted: one update per session call.")
  report_loss: bool = setting(True, "Accepted: losses are logged every --display_loss_steps.")
  save_summary_steps: int = setting(
      0, "Accepted: TensorBoard gets what is logged, every --display_loss_steps.")
  verbose_logging: bool = setting(False, "Accepted, no effect.")
  checkpoint_all_workers: bool = setting(False, "Accepted: rank 0 writes the checkpoints.")
  use_lightweight_checkpoint: bool = setting(
      False, "Accepted: checkpoints hold the weights and the optimizer state.")
  deterministic_run: bool = setting(
      False, "Accepted: --seed fixes the data order and the dropout masks.")
  enable_habana_backend: bool = setting(False, "Accepted: --device chooses the device.")
  compute_lm_loss_per_seq: bool = setting(
      False, "Accepted: the masked-LM loss is the mean over the batch's predictions.")
  tf_profiler_begin_iter: int = setting(0, "Accepted: bench/profile_step.py profiles a step.")
  tf_profiler_num_iter: int = setting(0, "Accepted: bench/profile_step.py profiles a step.")
  steps_per_update: typing.Optional[int] = setting(
      None, "MLPerf reference's name for --num_accumulation_steps.")
  input_file: typing.Optional[str] = setting(
      None, "MLPerf reference's record files (a glob or a list): here their folder is "
      "--input_files_dir (--eval_files_dir for the evaluation's); refused with the folder "
      "to pass.")
  use_tpu: bool = setting(False, "MLPerf reference's: accepted false (--device chooses).")
  num_gpus: typing.Optional[int] = setting(
      None, "MLPerf reference's GPUs of one process, whose --train_batch_size is their "
      "batch together; here --train_batch_size is each card's and run_multi_card_FPS.sh "
      "starts a rank per card, so only 0 or 1 is accepted (no effect).")


# The sections of run_pretraining's settings, and one run's values of them.
PRETRAINING = (Data, Model, Optimizer, Evaluation, Run, Runtime)
Settings = collections.namedtuple("Settings", ["data", "model", "optimizer", "evaluation",
                                               "run", "runtime"])


# The settings the scripts and the demo choose (--preset); what they do not name keeps its
# default. The demo's data paths come from its cache (--demo_cache_dir, bert_pretrain/demo.py).
# --reference_hyperparameters goes over a preset's values, not over flags given.
PRESETS = {
    # run_1card_FPS.sh: mixed precision as the anchor's scripts run; the evaluation at
    # start checks the initial checkpoint (MLPerf's scores about 0.34085).
    "one_card": {"amp": True, "eval_at_start": True},
    # run_multi_card_FPS.sh, as the anchor's: a global batch of 4 x ranks x batch, 1000
    # updates, one Horovod rank per card.
    "multi_card": {"amp": True, "eval_at_start": True, "num_accumulation_steps": 4,
                   "num_train_steps": 1000, "distribution": "horovod"},
    # The embedded demo: 500 LAMB updates of 32 sequences of 128 tokens, evaluated every
    # 125 updates and at the start; one micro-batch per update on any number of cards.
    "demo": {"amp": True, "eval_at_start": True, "max_seq_length": 128,
             "max_predictions_per_seq": 20, "train_batch_size": 32,
             "num_accumulation_steps": 1, "learning_rate": 5e-3, "num_warmup_steps": 50,
             "num_train_steps": 500, "display_loss_steps": 50, "save_checkpoints_steps": 250,
             "stop_threshold": 0.0, "samples_start_eval": 0, "samples_between_eval": 4000,
             "eval_batch_size": 64},
}
# The scripts' presets: without --input_files_dir they run the demo.
SCRIPT_PRESETS = ("one_card", "multi_card")


def _flag_type(field):
  hint = field.type
  if getattr(hint, "__origin__", None) is typing.Union:  # Optional[x]
    hint = [a for a in hint.__args__ if a is not type(None)][0]
  return hint


def define_flags(sections, flag_values=flags.FLAGS):
  """Defines an absl flag for every field of the section classes."""
  for section in sections:
    for field in dataclasses.fields(section):
      meta, kind = field.metadata, _flag_type(field)
      args = (field.name, field.default, meta["help"])
      kwargs = {"flag_values": flag_values}
      if meta["choices"]:
        flags.DEFINE_enum(field.name, field.default, meta["choices"], meta["help"], **kwargs)
      elif meta["list"]:
        flags.DEFINE_list(*args, **kwargs)
      elif kind is bool:
        flags.DEFINE_bool(*args, **kwargs)
      elif kind is int:
        flags.DEFINE_integer(*args, **kwargs)
      elif kind is float:
        flags.DEFINE_float(*args, **kwargs)
      else:
        flags.DEFINE_string(*args, **kwargs)


def define_pretraining_flags(flag_values=flags.FLAGS):
  """run_pretraining's flags: the sections', the anchors' and --preset."""
  define_flags(PRETRAINING + (Demo, Anchors), flag_values)
  flags.DEFINE_enum("preset", None, sorted(PRESETS), "Settings chosen together: one_card "
                    "and multi_card (the scripts'; without --input_files_dir they run the "
                    "demo), demo (the embedded demo: data, vocab, config and initial "
                    "checkpoint from --demo_cache_dir; after a run of one process, a "
                    "fine-tuning step); flags given win over the preset.",
                    flag_values=flag_values)


def is_demo(flag_values=flags.FLAGS):
  """Whether the run is the embedded demo: --preset=demo, or a script's preset without
  --input_files_dir."""
  preset = flag_values.preset
  return preset == "demo" or (preset in SCRIPT_PRESETS and
                              not flag_values["input_files_dir"].present)


def apply_presets(flag_values=flags.FLAGS):
  """Sets the values of --preset (and the demo's over a script's, for a demo run) of the
  flags the command line did not give.

  Raises:
    ValueError: --preset=demo with --input_files_dir, or a demo with --eval_files_dir.
  """
  if flag_values.preset == "demo" and flag_values["input_files_dir"].present:
    raise ValueError("--preset=demo trains on the demo's data but --input_files_dir is "
                     "given; drop it, or pass --preset=one_card to train on yours")
  if is_demo(flag_values) and flag_values["eval_files_dir"].present:
    if flag_values.preset == "demo":
      raise ValueError("--preset=demo evaluates on the demo's data but --eval_files_dir is "
                       "given; drop it, or pass --preset=one_card with --input_files_dir "
                       "to train on yours")
    raise ValueError("--eval_files_dir is given but not --input_files_dir, so this run would "
                     "be the embedded demo, on its own data; pass --input_files_dir too, or "
                     "drop --eval_files_dir for the demo")
  names = [flag_values.preset] if flag_values.preset else []
  if is_demo(flag_values) and "demo" not in names:
    names.append("demo")
  values = {}
  for name in names:
    values.update(PRESETS[name])
  if any(flag_values[alias].present and not flag_values[alias].value
         for alias in ("use_fp16", "manual_fp16")):
    values.pop("amp", None)  # --nouse_fp16: the anchors' way to say float32
  for flag, value in values.items():
    if not flag_values[flag].present:
      setattr(flag_values, flag, value)


def from_flags(section, flag_values=flags.FLAGS):
  """An instance of the section class holding the flags' values."""
  return section(**{f.name: getattr(flag_values, f.name) for f in dataclasses.fields(section)})


def settings_from_flags(flag_values=flags.FLAGS):
  """The run's Settings, from the flags."""
  return Settings(*[from_flags(section, flag_values) for section in PRETRAINING])


def mixed_precision(flag_values=flags.FLAGS):
  """Whether the flags ask for mixed precision: --amp, its aliases --use_fp16 and
  --manual_fp16 (the anchors' names), or an --amp_dtype, which implies it.

  Raises:
    ValueError: --noamp with one of the others.
  """
  fv = flag_values
  asked = [(flag, what) for flag, what, on in (
      ("--amp_dtype=%s" % fv.amp_dtype, "%s compute" % fv.amp_dtype,
       fv.amp_dtype != "auto"),
      ("--use_fp16", "mixed precision", fv.use_fp16),
      ("--manual_fp16", "float16 compute", getattr(fv, "manual_fp16", False))) if on]
  if asked and fv["amp"].present and not fv.amp:
    raise ValueError("%s asks for %s and --noamp for float32; pass one" % asked[0])
  return bool(fv.amp or asked)


def as_flags(settings):
  """Every value of a Settings by its flag's name."""
  return {f.name: getattr(section, f.name) for section in settings
          for f in dataclasses.fields(section)}


def default(section, name):
  """The default of a field of a section class (the flag's default)."""
  return {f.name: f.default for f in dataclasses.fields(section)}[name]


# Anchor name -> our flag of the same meaning.
ANCHOR_ALIASES = (("optimizer_type", "optimizer"), ("power", "poly_power"),
                  ("num_eval_iterations", "max_eval_steps"),
                  ("steps_per_update", "num_accumulation_steps"))

# What this recipe does instead of an accepted anchor flag: (for the anchor's default or
# what we always do, for another value). %(name)s is a flag's value.
ANCHOR_NOTES = {
    "enable_device_warmup": (
        "the FPS always leaves out the first --fps_warmup_steps=%(fps_warmup_steps)d "
        "updates (and checkpoint time); there is no separate warm-up run",
        "the FPS leaves out the first --fps_warmup_steps=%(fps_warmup_steps)d updates "
        "anyway; pass --fps_warmup_steps=0 to count them"),
    "is_dist_eval_enabled": (
        "evaluation is always distributed over the ranks (each reads its part of the eval "
        "set, the sums are all-reduced)",
        "cannot be honoured: evaluation is always distributed over the ranks (each reads its "
        "part of the eval set, the sums are all-reduced), which reports what one card would"),
    "iterations_per_loop": (
        "one update per session call (no Estimator loop); losses are logged every "
        "--display_loss_steps=%(display_loss_steps)d updates",) * 2,
    "report_loss": (
        "losses are logged every --display_loss_steps=%(display_loss_steps)d updates",
        "cannot be honoured: losses are logged every --display_loss_steps="
        "%(display_loss_steps)d updates; raise it to log less"),
    "save_summary_steps": (
        "TensorBoard gets the logged values, every --display_loss_steps="
        "%(display_loss_steps)d updates",) * 2,
    "verbose_logging": ("no effect: the trainable variables are not listed",) * 2,
    "checkpoint_all_workers": (
        "rank 0 writes the checkpoints (all ranks hold the same weights)",) * 2,
    "use_lightweight_checkpoint": (
        "checkpoints hold the weights and the optimizer state, so that a run resumes",) * 2,
    "deterministic_run": (
        "no effect; --seed fixes the initialization, the data order and the dropout "
        "masks (dropout stays on)",) * 2,
    "enable_habana_backend": ("no effect; --device=%(device)s chooses the device",) * 2,
    "compute_lm_loss_per_seq": (
        "no effect: the masked-LM loss is the mean over the batch's predictions, as in "
        "MLPerf's reference, packed records or not",) * 2,
    "tf_profiler_begin_iter": (
        "no effect; python3 -m bench.profile_step traces a training step",) * 2,
    "tf_profiler_num_iter": (
        "no effect; python3 -m bench.profile_step traces a training step",) * 2,
    "num_gpus": (
        "no effect; --device=%(device)s chooses the device, and run_multi_card_FPS.sh starts "
        "one rank per card",) * 2,
    "use_tpu": ("no effect; --device=%(device)s chooses the device",) * 2,
}


def apply_anchor_flags(log=None, flag_values=flags.FLAGS):
  """Applies the anchors' flags given on the command line (Anchors) and notes, one line
  each, those that change nothing here.

  Args:
    log: prints a note; default: to stdout on the first rank only.

  Raises:
    ValueError: an anchor flag contradicts ours (--optimizer_type=adam --optimizer=lamb).
  """
  fv = flag_values
  if log is None:
    rank = (os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or
            os.environ.get("PMI_RANK") or "0")
    log = print if rank == "0" else (lambda line: None)
  for anchor, ours in ANCHOR_ALIASES:
    value = getattr(fv, anchor)
    if value is None:
      continue
    if fv[ours].present and getattr(fv, ours) != value:
      raise ValueError("--%s=%s and --%s=%s disagree (they are the same setting); pass one"
                       % (anchor, value, ours, getattr(fv, ours)))
    setattr(fv, ours, value)
    fv[ours].present = 1  # given, as the demo's paths and the RCP's values must see it
  if fv.eval_checkpoint_path:
    if fv.do_train:
      log("run_pretraining: note: --eval_checkpoint_path is read with --nodo_train only (then "
          "it is the checkpoint evaluated); this run evaluates the weights it trains")
    elif fv.init_checkpoint and fv.init_checkpoint != fv.eval_checkpoint_path:
      raise ValueError("--eval_checkpoint_path=%s and --init_checkpoint=%s disagree (with "
                       "--nodo_train both name the checkpoint evaluated); pass one"
                       % (fv.eval_checkpoint_path, fv.init_checkpoint))
    else:
      fv.init_checkpoint = fv.eval_checkpoint_path
      fv["init_checkpoint"].present = 1
  if fv.input_file is not None:
    first = fv.input_file.split(",")[0]
    folder = first if os.path.isdir(first) else os.path.dirname(first) or "."
    raise ValueError("--input_file=%s is MLPerf reference's (record files by a glob or a "
                     "list); here pass the folder that holds them and no other records: --%s=%s"
                     % (fv.input_file, "input_files_dir" if fv.do_train else "eval_files_dir",
                        folder))
  if fv.use_tpu:
    raise ValueError("--use_tpu: this recipe runs on GPUs and CPUs (--device), not TPUs; "
                     "drop --use_tpu")
  if fv.num_gpus is not None and fv.num_gpus > 1:
    # A batch meant for all GPUs would train with num_gpus times the global batch here.
    gpus, batch = fv.num_gpus, fv.train_batch_size
    raise ValueError(
        "--num_gpus=%d is MLPerf reference's, where --train_batch_size=%d is the batch of "
        "all %d GPUs; here it is each card's: pass --train_batch_size=%s without --num_gpus "
        "(run_multi_card_FPS.sh starts a rank per card)"
        % (gpus, batch, gpus, batch // gpus if batch % gpus == 0 else
           "<%d / %d, a whole number>" % (batch, gpus)))
  values = {name: getattr(fv, name) for name in ("fps_warmup_steps", "display_loss_steps",
                                                 "device")}
  for name, (usual, other) in sorted(ANCHOR_NOTES.items()):
    if fv[name].present:
      note = usual if getattr(fv, name) == fv[name].default else other
      if name in ("enable_device_warmup", "is_dist_eval_enabled"):
        # What the anchors turn on, this recipe always does: only "off" is not honoured.
        note = other if getattr(fv, name) is False else usual
      log("run_pretraining: note: %s: %s" % (fv[name].serialize(), note % values))
