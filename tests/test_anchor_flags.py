"""The anchors' run_pretraining.py flags (NVIDIA's, Habana's, Iluvatar's, MLPerf reference's)
are accepted: with their meaning, or with a one-line note saying what this recipe does
instead."""

import json
import os

import pytest

from bert_pretrain.training import checkpoints
from bert_pretrain import config
from bert_pretrain import run_pretraining as rp
from conftest import AMP_ON_THIS_CPU, base_flags, run_pretraining


def anchor(*argv):
  """Parses argv, applies anchor_flags; returns (FLAGS values, notes). Unparses after."""
  notes = []
  try:
    rp.FLAGS(["run_pretraining"] + list(argv))
    config.apply_anchor_flags(log=notes.append)
    values = {name: getattr(rp.FLAGS, name) for name in (
        "optimizer", "poly_power", "max_eval_steps", "init_checkpoint",
        "num_accumulation_steps")
              if rp.FLAGS[name].present}  # given, as the demo and the RCPs read it
    return values, notes
  finally:
    rp.FLAGS.unparse_flags()


def test_the_anchors_names_of_our_flags_set_them():
  values, notes = anchor("--optimizer_type=adam", "--power=0.5", "--num_eval_iterations=7",
                         "--nodo_train", "--eval_checkpoint_path=/ckpt/model.ckpt-28252",
                         "--steps_per_update=4")
  assert values == {"optimizer": "adam", "poly_power": 0.5, "max_eval_steps": 7,
                    "init_checkpoint": "/ckpt/model.ckpt-28252", "num_accumulation_steps": 4}
  assert notes == []


@pytest.mark.parametrize("argv,note", [
    (["--enable_device_warmup=True"], "--enable_device_warmup: the FPS always leaves out the "
     "first --fps_warmup_steps=10 updates"),
    (["--noenable_device_warmup", "--fps_warmup_steps=3"], "--noenable_device_warmup: the FPS "
     "leaves out the first --fps_warmup_steps=3 updates anyway; pass --fps_warmup_steps=0"),
    (["--is_dist_eval_enabled"], "--is_dist_eval_enabled: evaluation is always distributed "
     "over the ranks"),
    (["--is_dist_eval_enabled=false"], "--nois_dist_eval_enabled: cannot be honoured: "
     "evaluation is always distributed over the ranks"),
    (["--iterations_per_loop=1000"], "--iterations_per_loop=1000: one update per session call"),
    (["--noreport_loss"], "--noreport_loss: cannot be honoured: losses are logged every "
     "--display_loss_steps=10 updates"),
    (["--eval_checkpoint_path=/c/model.ckpt-1"], "--eval_checkpoint_path is read with "
     "--nodo_train only"),
    (["--compute_lm_loss_per_seq"], "--compute_lm_loss_per_seq: no effect: the masked-LM "
     "loss is the mean over the batch's predictions"),
    (["--num_gpus=1", "--device=cpu"], "--num_gpus=1: no effect; --device=cpu chooses the "
     "device, and run_multi_card_FPS.sh starts one rank per card"),
    (["--nouse_tpu"], "--nouse_tpu: no effect; --device=auto chooses the device"),
])
def test_an_anchor_flag_that_changes_nothing_here_gets_one_note(argv, note):
  _, notes = anchor(*argv)
  assert len(notes) == 1 and notes[0].startswith("run_pretraining: note: " + note), notes


@pytest.mark.parametrize("argv,message", [
    # MLPerf reference's command lines: its records by a glob, its evaluation's by name.
    (["--input_file=/data/tf_records4/part-*"], "--input_file=/data/tf_records4/part-* is "
     "MLPerf reference's (record files by a glob or a list); here pass the folder that holds "
     "them and no other records: --input_files_dir=/data/tf_records4"),
    (["--input_file=/data/eval/eval_10k", "--nodo_train"], "--input_file=/data/eval/eval_10k "
     "is MLPerf reference's (record files by a glob or a list); here pass the folder that "
     "holds them and no other records: --eval_files_dir=/data/eval"),
    (["--use_tpu"], "--use_tpu: this recipe runs on GPUs and CPUs (--device), not TPUs; drop "
     "--use_tpu"),
])
def test_mlperf_reference_flags_that_mean_something_else_here_are_refused_with_the_fix(
    argv, message):
  with pytest.raises(ValueError) as raised:
    anchor(*argv)
  assert str(raised.value) == message


@pytest.mark.parametrize("flags,message", [
    ({"optimizer_type": "adam", "optimizer": "lamb"},
     "--optimizer_type=adam and --optimizer=lamb disagree"),
    ({"manual_fp16": None, "noamp": None}, "--manual_fp16 asks for float16 compute and --noamp"),
    ({"nodo_train": None, "eval_checkpoint_path": "/a/model.ckpt-1",
      "init_checkpoint": "/b/model.ckpt-2"}, "--eval_checkpoint_path=/a/model.ckpt-1 and "
     "--init_checkpoint=/b/model.ckpt-2 disagree"),
    # MLPerf reference's command line: its batch is all GPUs', which would train 8x larger.
    ({"num_gpus": 8, "train_batch_size": 256}, "--num_gpus=8 is MLPerf reference's, where "
     "--train_batch_size=256 is the batch of all 8 GPUs; here it is each card's: pass "
     "--train_batch_size=32 without --num_gpus"),
])
def test_an_anchor_flag_contradicting_ours_is_a_one_line_error(pretraining_data, tmp_path,
                                                               flags, message):
  result = run_pretraining(*base_flags(pretraining_data, tmp_path / "out", **flags))
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].startswith("run_pretraining: error: " + message)
  assert not (tmp_path / "out").exists()


def test_the_iluvatar_command_line_runs_with_its_flags(pretraining_data, tmp_path):
  """The flags of the anchor's run_1card_FPS.sh / run_multi_card_FPS.sh and their
  run_pretraining.py, carried over as they are."""
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(
      pretraining_data, out, num_train_steps=2, do_train="True", do_eval="True", amp=None,
      nouse_xla=None, enable_device_warmup="True", is_dist_eval_enabled="True",
      optimizer_type="adam", iterations_per_loop=1000, report_loss="True",
      manual_fp16="False", verbose_logging=None, dllog_path=str(tmp_path / "dllog.json"),
      max_eval_steps=1))
  assert result.returncode == 0, result.stderr
  assert "no flag" not in result.stderr
  notes = [l for l in result.stdout.splitlines() if l.startswith("run_pretraining: note: ")]
  assert [n.split(":")[2].strip() for n in notes] == [
      "--enable_device_warmup", "--is_dist_eval_enabled", "--iterations_per_loop=1000",
      "--report_loss", "--verbose_logging"]
  assert AMP_ON_THIS_CPU in result.stdout  # --amp on a CPU
  with open(str(out / checkpoints.RUN_MARKER)) as f:
    assert json.load(f)["optimizer"] == "adam"
  assert os.path.exists(str(tmp_path / "dllog.json"))
