"""bert_pretrain/conformance.py: one batch on the tested device and type against the CPU in
float32, layer by layer; exact against itself, within the tolerances in bfloat16 and
float16, and a wrong op named at its layer."""

import json

import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import conformance
from bert_pretrain.distributed import device as device_lib
from bert_pretrain.data import input_pipeline
from bert_pretrain.model import modeling
from bert_pretrain.training import pretraining
from conftest import (FLOAT16_ON_THIS_CPU, PREDICTIONS, SEQ_LENGTH, TWO_LAYER_CONFIG,
                      pack_fixture_records, run_command)

ENCODER_ROWS = ["bert/embeddings/LayerNorm",
                "bert/encoder/layer_0/attention/output/LayerNorm",
                "bert/encoder/layer_0/output/LayerNorm",
                "bert/encoder/layer_1/attention/output/LayerNorm",
                "bert/encoder/layer_1/output/LayerNorm"]


def run_conformance(*flags):
  return run_command("bert_pretrain.conformance", *flags, timeout=600)


def model_flags(data):
  return ["--bert_config_file=" + data["config"], "--max_seq_length=%d" % SEQ_LENGTH,
          "--max_predictions_per_seq=%d" % PREDICTIONS, "--train_batch_size=8",
          "--device=cpu", "--intra_op_threads=1"]


def check_on_cpu(dtype, batch, fault_layer=-1):
  return conformance.check(modeling.BertConfig.from_dict(TWO_LAYER_CONFIG), batch,
                           device_lib.Device("CPU", [], dtype),
                           pretraining.session_config(1, 2), fault_layer=fault_layer,
                           log=lambda line: None)


def test_the_cpu_in_float32_against_itself_is_exact_in_every_row():
  batch = conformance.synthetic_batch(4, SEQ_LENGTH, PREDICTIONS, TWO_LAYER_CONFIG["vocab_size"])
  rows, compute = check_on_cpu(tf.float32, batch)
  assert compute == "float32"
  assert [r.name for r in rows if r.section == "forward"][:5] == ENCODER_ROWS
  assert [r.name for r in rows if r.section == "gradient"] == [
      "cls/seq_relationship", "cls/predictions", "bert/pooler",
      "bert/encoder/layer_1/{intermediate,output}", "bert/encoder/layer_1/attention",
      "bert/encoder/layer_0/{intermediate,output}", "bert/encoder/layer_0/attention",
      "bert/embeddings"]
  assert [r.error for r in rows] == [0.0] * len(rows)
  assert conformance.verdict(rows)[0] == 0


def test_a_failed_next_sentence_gradient_says_a_small_batch_can_cancel_it():
  row = lambda section, name, error: conformance.Row(section, name, name, 5, error, 0.1)
  forward = row("forward", "bert/embeddings", 0.01)
  (status, line) = conformance.verdict([forward, row("gradient", "cls/seq_relationship", 0.4)])
  assert (status, line) == (1, (
      "FAIL: cls/seq_relationship (cls/seq_relationship) is the first outside its tolerance: "
      "relative error 4.00e-01 > 1.00e-01; the rows before it are within theirs; an "
      "untrained model's next-sentence gradients can cancel out over a small batch, leaving "
      "little to compare: check with --train_batch_size=8 or more, or a trained "
      "--init_checkpoint"))
  (status, line) = conformance.verdict([forward, row("gradient", "bert/embeddings", 0.4)])
  assert status == 1 and line.endswith("the rows before it are within theirs")


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_bfloat16_and_float16_on_the_cpu_stay_within_their_tolerances(pretraining_data,
                                                                       dtype):
  batch = conformance.read_batch(input_pipeline.list_record_files(pretraining_data["train"]),
                                 8, SEQ_LENGTH, PREDICTIONS, TWO_LAYER_CONFIG["vocab_size"])
  rows, compute = check_on_cpu(dtype, batch)
  assert compute == dtype.name
  assert conformance.first_failure(rows) is None, conformance.format_table(rows)
  # The tested graph did compute in the low-precision type: the encoder's outputs carry
  # its rounding (the embeddings compute in float32 in every type).
  unit = conformance.UNIT_ROUNDOFF[dtype.name]
  errors = {r.name: r.error for r in rows}
  assert errors[ENCODER_ROWS[0]] == 0.0
  assert all(unit / 10 < errors[name] for name in ENCODER_ROWS[1:]), errors
  assert all(unit / 10 < r.error for r in rows if r.section == "gradient"), errors


def test_a_second_gelu_in_the_last_layer_is_named_at_its_feed_forward_output():
  batch = conformance.synthetic_batch(4, SEQ_LENGTH, PREDICTIONS, TWO_LAYER_CONFIG["vocab_size"])
  rows, _ = check_on_cpu(tf.float32, batch, fault_layer=1)
  failed = conformance.first_failure(rows)
  assert failed.name == "bert/encoder/layer_1/output/LayerNorm"
  assert [r.error for r in rows[:rows.index(failed)]] == [0.0] * 4


def test_the_command_names_the_layer_of_an_injected_fault_and_exits_1(pretraining_data):
  result = run_conformance(*model_flags(pretraining_data) + [
      "--input_files_dir=" + pretraining_data["train"], "--inject_fault_layer=0"])
  assert result.returncode == 1, result.stderr
  out = result.stdout
  assert ("conformance: FAIL: bert/encoder/layer_0/output/LayerNorm (layer 0 feed-forward "
          "output) is the first outside its tolerance") in out
  lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(("bert/", "cls/"))}
  assert " 0.00e+00 " in lines["bert/encoder/layer_0/attention/output/LayerNorm"]
  assert lines["bert/encoder/layer_0/output/LayerNorm"].endswith("<- outside its tolerance")
  assert "conformance: tested: CPU, " in out and "compute float32" in out


def test_the_command_compares_a_checkpoint_in_float16_and_passes(pretraining_data,
                                                                 equal_weight_data):
  result = run_conformance(*model_flags(pretraining_data) + [
      "--input_files_dir=" + pretraining_data["train"], "--amp_dtype=float16",
      "--init_checkpoint=" + equal_weight_data["init"]])
  assert result.returncode == 0, result.stdout + result.stderr
  out = result.stdout
  # The device line says float16 is slow on a CPU without its arithmetic.
  assert "%s; reference: the CPU, compute float32" % FLOAT16_ON_THIS_CPU in out, out
  assert "conformance: batch: the first 8 records of %s: 8 x %d" % (
      pretraining_data["train"], SEQ_LENGTH) in out
  assert "Loaded 30 of 30 model variables from %s" % equal_weight_data["init"] in out
  assert "loss scale 32768" in out
  for name in ENCODER_ROWS[:3] + ["cls/predictions/logits", "total_loss", "bert/embeddings"]:
    assert "\n%s " % name in out
  assert "conformance: PASS: every layer and gradient group within its tolerance" in out


def test_bad_inputs_are_one_line_errors_before_any_graph(pretraining_data, equal_weight_data,
                                                         tmp_path):
  two_layers = tmp_path / "two_layers.json"
  two_layers.write_text(json.dumps(TWO_LAYER_CONFIG))
  pack_fixture_records(pretraining_data["train"], tmp_path / "packed")
  for flags, message in (
      # Another model than the checkpoint's: run_pretraining refuses it too.
      (model_flags(dict(pretraining_data, config=str(two_layers))) + [
          "--init_checkpoint=" + equal_weight_data["init"]],
       "holds a model with num_hidden_layers=1 but --bert_config_file=%s says "
       "num_hidden_layers=2; pass the config the checkpoint was trained with" % two_layers),
      (model_flags(pretraining_data) + ["--input_files_dir=%s" % (tmp_path / "packed")],
       "holds packed records, but conformance compares a batch of unpacked ones; pass the "
       "folder pack_records packed (its --input)"),
      ([], "--bert_config_file is required"),
      (model_flags(pretraining_data) + ["--inject_fault_layer=1"],
       "--inject_fault_layer=1: the model has layers 0 to 0; pass one of them (-1: none)"),
      (model_flags(pretraining_data) + ["--inject_fault_layer=-2"],
       "--inject_fault_layer=-2: the model has layers 0 to 0"),
      (model_flags(pretraining_data) + ["--init_loss_scale=inf"],
       "--init_loss_scale=inf must be at least 1 and finite"),
      (model_flags(pretraining_data) + ["--init_checkpoint=" + str(tmp_path / "none")],
       "no checkpoint there")):
    result = run_conformance(*flags)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("conformance: error: ")
    assert message in result.stderr
