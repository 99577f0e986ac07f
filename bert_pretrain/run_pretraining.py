r"""BERT pretraining (masked LM + next sentence): the command.

  python3 -m bert_pretrain.run_pretraining --input_files_dir=... --eval_files_dir=... \
      --bert_config_file=bert_config.json --init_checkpoint=model.ckpt-28252 \
      --output_dir=./results --train_batch_size=6

Runs on one card, or on many (--horovod, one process per card, launched by
run_multi_card_FPS.sh; or TensorFlow's engines, --distribution). This file is the entry
point only: it parses the flags (their definitions, defaults and presets are in
config.py), builds the settings, checks what the run reads (training/inputs.py), chooses
the device and the ranks, runs the training (training/loop.py) and turns what goes wrong
into one line that says what to do.
"""

import os
import sys

from absl import flags
import tensorflow.compat.v1 as tf

from bert_pretrain import config
from bert_pretrain import demo
from bert_pretrain import errors
from bert_pretrain.data import input_pipeline
from bert_pretrain.distributed import device as device_lib
from bert_pretrain.distributed import launch
from bert_pretrain.distributed import ranks as ranks_lib
from bert_pretrain.training import checkpoints
from bert_pretrain.training import inputs as inputs_lib
from bert_pretrain.training import logs
from bert_pretrain.training import loop
from bert_pretrain.training import mlperf
from bert_pretrain.training import resume as resume_lib
from bert_pretrain.training import signals
from bert_pretrain.wiki import workdir

config.define_pretraining_flags()
FLAGS = flags.FLAGS


def main(argv):
  logs.whole_lines()
  if len(argv) > 1:
    errors.unexpected_arguments("run_pretraining", argv[1:])
  tf.logging.set_verbosity(tf.logging.ERROR)
  tf.disable_v2_behavior()
  stop = signals.StopRequest()
  stop.install()
  demo_folder = None
  try:
    config.apply_presets()
    # --use_fp16 and --manual_fp16 (the anchors' names) are aliases of --amp; --amp_dtype
    # implies it.
    device = device_lib.detect_device(FLAGS.device, config.mixed_precision(), FLAGS.amp_dtype)
    config.apply_anchor_flags()
    demo_settings = config.from_flags(config.Demo) if config.is_demo() else None
    if demo_settings:
      inputs_lib.check_settings(config.settings_from_flags())  # before the demo builds
      if FLAGS.check_only:  # the demo makes its own inputs, and a folder unless given one
        if FLAGS["output_dir"].present:
          inputs_lib.check_output_folder(FLAGS.output_dir, True, "none")
        return 0
      demo_folder = demo.set_up_run(FLAGS)
    cfg = config.settings_from_flags()
    inputs = inputs_lib.check_inputs(cfg)
    if FLAGS.check_only:
      processes = os.environ.get(launch.CHECK_PROCESSES_VARIABLE)
      resume_lib.check_launch(cfg, inputs, int(processes) if processes else None)
      return 0
  except (ValueError, workdir.PrepareError) as e:
    demo.remove_unused(demo_folder)
    errors.print_error("run_pretraining", e)
    return 2
  except (EnvironmentError, tf.errors.OpError) as e:
    if not errors.is_file_error(e):
      raise
    demo.remove_unused(demo_folder)
    errors.print_error("run_pretraining", errors.os_error_message(e))
    return 2
  ranks = None
  try:
    ranks = ranks_lib.Ranks(cfg.runtime.engine(), cfg.runtime.stall_timeout_s,
                            cfg.run.output_dir,
                            device_lib.replica_devices(device, cfg.runtime.cpu_devices))
    notes = loss_scale_notes(device, inputs.resume_checkpoint)
    if cfg.optimizer.reference_hyperparameters:
      notes.append(apply_reference_hyperparameters(
          inputs_lib.global_batch_size(cfg, ranks.replicas, inputs.packing)))
      cfg = cfg._replace(optimizer=config.from_flags(config.Optimizer))
      inputs_lib.check_settings(cfg)
    finetunes = bool(demo_settings and ranks.size == 1 and demo_settings.demo_finetune_epochs)
    status = run(cfg, inputs, ranks, device, stop, notes,
                 "the demo's fine-tuning step" if finetunes else None)
    if status == 0 and finetunes:
      # The demo's downstream step: does the pretrained model beat random weights?
      demo.finetune(demo_settings.demo_cache_dir, cfg.run.output_dir,
                    {"bert_config_file": cfg.model.bert_config_file,
                     "vocab_file": cfg.model.vocab_file},
                    epochs=demo_settings.demo_finetune_epochs, known_run=True)
    return status
  except Exception as e:  # pylint: disable=broad-except
    status = error_status(e, cfg, inputs, ranks)
    if status is None:
      raise
    return status


def loss_scale_notes(device, resume_checkpoint):
  """A note when --init_loss_scale is given but not used: the compute is not float16, or
  the loss scale goes on from the checkpoint resumed (a float16 run's)."""
  if not FLAGS["init_loss_scale"].present:
    return []
  if device.dtype != tf.float16:
    return ["--init_loss_scale has no effect: only float16 compute scales the loss, this "
            "run computes %s" % device.dtype.name]
  if resume_checkpoint and tf.train.load_checkpoint(resume_checkpoint).has_tensor(
      "loss_scale/scale"):
    return ["--init_loss_scale starts a fresh run only: the loss scale goes on from %s's"
            % os.path.basename(resume_checkpoint)]
  return []


def run(cfg, inputs, ranks, device, stop, notes, then=None):
  """Holds output_dir's lock (the chief does) while the training runs; returns the exit
  status. then: what would follow the training in this process (a stop skips it)."""
  if ranks.is_chief:
    # Held while this frame lives (the whole run); a Horovod job's other ranks share it.
    lock = checkpoints.OutputDirLock(cfg.run.output_dir)
    lock.acquire()
    removed = checkpoints.remove_partial_checkpoints(cfg.run.output_dir)
    if removed:
      print("Removed what an interrupted save left in %s: %s"
            % (cfg.run.output_dir, ", ".join(removed)))
  status = loop.run(cfg, inputs, ranks, device, stop, notes)
  if ranks.parts and not stop.requested:  # saved: a signal now ends it at once
    stop.disarm("at the end of the run")
  ranks.part(status)
  ranks.stop()
  if then and status == 0:  # from now on a signal ends the process at once
    stop.disarm("during %s (the pretraining run is saved)" % then)
  if stop.requested:
    if status == 0 and then:  # the signal came during the last update
      print("%s: the training is complete; %s is skipped: run the same command with "
            "--output_dir=%s to run it" % (errors.signal_name(stop.signum), then,
                                            cfg.run.output_dir))
      status = signals.exit_status(stop.signum)
    # Saved and logged. horovodrun --gloo kills the ranks 5 s after it forwards a signal
    # or a rank exits, and the interpreter's teardown (TensorFlow, Horovod) took 2 of
    # those at load 2, more than 5 with the save at load 9: skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # pylint: disable=protected-access
  return status


def error_status(e, cfg, inputs, ranks):
  """Prints the one-line error for what stopped the run and returns the exit status
  (2: the input or the machine, 3: the job), or None for an error it does not know."""
  def say(message):
    errors.print_error("run_pretraining", message)
    if ranks is not None:  # its peers, which now wait for it, name it and its error
      ranks.stop(error=str(message))
  output_dir = cfg.run.output_dir
  if isinstance(e, ValueError):
    say(e)
  elif isinstance(e, EnvironmentError):
    say(errors.os_error_message(e, lambda what: checkpoints.disk_full_message(output_dir,
                                                                              what)))
  elif isinstance(e, tf.errors.ResourceExhaustedError):
    if checkpoints.is_disk_full(e):
      say(checkpoints.disk_full_message(output_dir, "its files"))
    else:
      say("out of memory (%s); lower --train_batch_size and raise --num_accumulation_steps "
          "to keep the global batch" % e.message.splitlines()[0])
  elif (isinstance(e, tf.errors.DataLossError) or (
      isinstance(e, tf.errors.InvalidArgumentError) and
      input_pipeline.TOKEN_ID_ERROR in e.message)) and not (
          # A peer's, passed on by TensorFlow's collectives: named below.
          ranks is not None and ranks.hvd is None and ranks.is_job_error(e)):
    say(bad_record_message(e, cfg, inputs, ranks))
  elif isinstance(e, tf.errors.OpError) and errors.is_file_error(e):
    say(errors.os_error_message(e))
  elif isinstance(e, tf.errors.OpError) and ranks is not None and ranks.is_job_error(e):
    stalled = ranks.stalled_ranks()
    # The peer whose error broke the collective writes it as it exits (say()): a moment.
    ended = ranks.ended_ranks(wait_s=0 if ranks.hvd or stalled else 2)
    stalled = [r for r in stalled if r not in ended]
    if ended:
      who = "; " + ranks.ended_words(ended)
    elif stalled:
      who = "; %s stopped answering" % ranks.names(stalled)
    else:
      who = ("; a rank stalled or failed: its number is in the lines above ('Missing "
             "ranks', or its own error)")
    # A rank the job's end stopped is not its cause: it says nothing to its peers.
    errors.print_error("run_pretraining", "%s stopped the job (%s)%s%s" % (
        "Horovod" if ranks.hvd else "TensorFlow's collective all-reduce",
        _error_line(e.message).split(". ")[0], who, "" if ended else "; %s%s" % (
            checkpoints.rerun_advice(output_dir), ranks.stall_reports(stalled))))
    return 3
  else:
    return None
  return 2


def apply_reference_hyperparameters(global_batch_size):
  """Sets the hyperparameters of MLPerf's RCP for the global batch size (mlperf.choose_rcp)
  that the command line does not give. Returns the log line that says which RCP and
  which flags."""
  rcp = mlperf.choose_rcp(global_batch_size, mlperf.load_rcps())
  taken = []
  for name, value in sorted(rcp.hyperparameters.items()):
    if not FLAGS[name].present:
      setattr(FLAGS, name, value)
      taken.append("--%s=%s" % (name, value))
  if not FLAGS["optimizer"].present:
    FLAGS.optimizer = "lamb"
  return "--reference_hyperparameters: %s; %s" % (
      rcp.note, ", ".join(taken) if taken else "every one given on the command line")


def bad_record_message(error, cfg, inputs, ranks):
  """The one-line error for a bad record met while training or evaluating: reads this
  rank's files to name the file and the record (the rest of the line says what to do)."""
  # Every rank reads every training file (make_dataset), and its part of the eval set.
  packing = inputs.packing
  record = input_pipeline.locate_bad_record(
      inputs.train_files, cfg.data.max_seq_length, packing.max_predictions,
      inputs.bert_config.vocab_size, error.message, packing.max_sequences)
  if record is None:
    record = input_pipeline.locate_bad_record(
        input_pipeline.rank_files(inputs.eval_files, ranks.size if ranks else 1,
                                  ranks.rank if ranks else 0),
        cfg.data.max_seq_length, cfg.data.max_predictions_per_seq,
        inputs.bert_config.vocab_size, error.message)
  if record is None:
    return ("bad TFRecord data (%s); find it with python3 tools/inspect_tfrecords.py "
            "--input=%s" % (_error_line(error.message), cfg.data.input_files_dir))
  if "token id" in record.problem:
    fix = ("use the bert_config.json whose vocab_size matches the data's vocab, re-create "
           "the file, or pass --skip_corrupt_records")
  else:
    fix = "re-create or remove the file, or pass --skip_corrupt_records"
  return "bad TFRecord %s; %s; checkpoints in %s are kept" % (
      input_pipeline.describe_bad_record(record), fix, cfg.run.output_dir)


def _error_line(message):
  """The informative line of a TensorFlow error message (not "Graph execution error:")."""
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  for line in lines:
    if not line.startswith(("Graph execution error", "Detected at node", "File ", "Node:",
                            "[[", "Traceback")) and not line.endswith(":"):
      return line
  return lines[0] if lines else "no message"


def enable_cpu_xla(argv):
  """Lets --use_xla auto-cluster on a CPU too: TensorFlow applies global_jit_level to
  GPUs only unless TF_XLA_FLAGS holds --tf_xla_cpu_global_jit. TensorFlow reads it once,
  and within absl's app.run too early for main to set it, so this runs before it
  on the command line `argv` (where a GPU build might find a GPU, it is left alone)."""
  try:
    FLAGS(argv)
  except flags.Error:
    return  # errors.run_main reports it.
  if not FLAGS.use_xla or (FLAGS.device != "cpu" and tf.test.is_built_with_cuda()):
    return
  flags_now = os.environ.get("TF_XLA_FLAGS", "")
  if "--tf_xla_cpu_global_jit" not in flags_now:
    os.environ["TF_XLA_FLAGS"] = (flags_now + " --tf_xla_cpu_global_jit").strip()


if __name__ == "__main__":
  enable_cpu_xla(sys.argv)
  errors.run_main("run_pretraining", main)
