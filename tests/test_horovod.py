"""Several ranks with Horovod (Gloo and MPI) on the CPU: same weights as one card with
the same global batch, distributed evaluation, a killed rank, and the launcher script."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import demo
from bert_pretrain import modeling
from conftest import PREDICTIONS, ROOT, SEQ_LENGTH, TINY_CONFIG, base_flags, run_pretraining

MODULE = [sys.executable, "-m", "bert_pretrain.run_pretraining"]


def _env(**extra):
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
             OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
  env.update(extra)
  return env


def launch(launcher, flags, timeout=240, **env):
  """Runs the training module under `launcher` (a list: horovodrun ... or mpirun ...)."""
  return subprocess.run(launcher + MODULE + ["--horovod"] + flags, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, universal_newlines=True, env=_env(**env),
                        timeout=timeout)


GLOO = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"]
HOROVODRUN_MPI = ["horovodrun", "-np", "2", "-H", "localhost:2", "--mpi"]
MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"]


@pytest.fixture(scope="module")
def equal_weight_data(pretraining_data, tmp_path_factory):
  """The fixture records in one file with every masked_lm_weight set to 1, so every
  micro-batch normalizes its masked-LM loss by the same count, and a fresh checkpoint
  of a dropout-free config. Then ranks x batch and one card x (ranks * batch) compute
  the same mean gradient."""
  root = tmp_path_factory.mktemp("equal_weights")
  (root / "train").mkdir()
  files = sorted(os.listdir(pretraining_data["train"]))
  with tf.io.TFRecordWriter(str(root / "train" / "part-0")) as writer:
    for name in files:
      for record in tf.io.tf_record_iterator(os.path.join(pretraining_data["train"], name)):
        example = tf.train.Example.FromString(record)
        weights = example.features.feature["masked_lm_weights"].float_list.value
        for i in range(len(weights)):
          weights[i] = 1.0
        writer.write(example.SerializeToString())
  config = dict(TINY_CONFIG, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  (root / "bert_config.json").write_text(json.dumps(config))
  demo.write_fresh_checkpoint(modeling.BertConfig.from_dict(config), str(root / "init" / "model.ckpt-0"))
  return dict(pretraining_data, train=str(root / "train"), config=str(root / "bert_config.json"),
              init=str(root / "init" / "model.ckpt-0"))


def _final_weights(output_dir):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(output_dir)))
  names = [n for n in reader.get_variable_to_shape_map() if n.startswith(("bert/", "cls/"))
           and not n.endswith(("adam_m", "adam_v"))]
  return reader.get_tensor("global_step"), {n: reader.get_tensor(n) for n in names}


def _ordered_flags(data, out, batch, accumulation):
  # shuffle_buffer=1 with one file reads records in order; rank r gets records r::2.
  return base_flags(data, out, input_files_dir=data["train"], bert_config_file=data["config"],
                    init_checkpoint=data["init"], train_batch_size=batch,
                    num_accumulation_steps=accumulation, num_train_steps=3, shuffle_buffer=1,
                    learning_rate=5e-3, nodo_eval=None)


@pytest.mark.parametrize("launcher,accumulation", [(GLOO, 1), (HOROVODRUN_MPI, 2)],
                         ids=["gloo", "mpi-accumulation"])
def test_two_ranks_match_one_card_with_twice_the_batch(equal_weight_data, tmp_path, launcher,
                                                       accumulation):
  one = run_pretraining(*_ordered_flags(equal_weight_data, tmp_path / "one", 8, accumulation))
  assert one.returncode == 0, one.stderr
  two = launch(launcher, _ordered_flags(equal_weight_data, tmp_path / "two", 4, accumulation))
  assert two.returncode == 0, two.stdout[-3000:]
  assert "2 rank(s), batch 4 x %d accumulation x 2 ranks = %d sentences" % (
      accumulation, 8 * accumulation) in two.stdout
  step_one, weights_one = _final_weights(tmp_path / "one")
  step_two, weights_two = _final_weights(tmp_path / "two")
  assert step_one == step_two == 3
  assert sorted(weights_one) == sorted(weights_two)
  moved = 0.0
  reader = tf.train.load_checkpoint(equal_weight_data["init"])
  for name in weights_one:
    np.testing.assert_allclose(weights_two[name], weights_one[name], rtol=1e-4, atol=1e-5,
                               err_msg=name)
    moved = max(moved, np.abs(weights_one[name] - reader.get_tensor(name)).max())
  assert moved > 1e-3  # the steps did train
  # Only rank 0 writes: one checkpoint set, one log of 3 steps.
  assert len(re.findall(r"Step 3,", two.stdout)) == 1


def test_distributed_eval_equals_single_card_eval(equal_weight_data, tmp_path):
  flags = lambda out: base_flags(equal_weight_data, out, init_checkpoint=equal_weight_data["init"],
                                 bert_config_file=equal_weight_data["config"], nodo_train=None,
                                 eval_batch_size=5)
  one = run_pretraining(*flags(tmp_path / "one"))
  assert one.returncode == 0, one.stderr
  two = launch(MPIRUN, flags(tmp_path / "two"))
  assert two.returncode == 0, two.stdout[-3000:]
  pattern = r"masked_lm_accuracy = ([\d.]+)"
  acc_one = float(re.search(pattern, one.stdout).group(1))
  acc_two = [float(a) for a in re.findall(pattern, two.stdout)]
  assert len(acc_two) == 1  # rank 0 reports
  assert acc_two[0] == pytest.approx(acc_one, abs=1e-9)
  samples = lambda s: int(re.search(r"eval_samples = (\d+)", s).group(1))
  assert samples(two.stdout) == samples(one.stdout) > 0
  loss = lambda s: float(re.search(r"masked_lm_loss = ([\d.]+)", s).group(1))
  assert loss(two.stdout) == pytest.approx(loss(one.stdout), rel=1e-5)


def test_a_killed_rank_ends_the_job_quickly(pretraining_data, tmp_path):
  flags = base_flags(pretraining_data, tmp_path / "out", num_train_steps=10 ** 6,
                     display_loss_steps=5, nodo_eval=None)
  proc = subprocess.Popen(GLOO + MODULE + ["--horovod"] + flags, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, env=_env())
  try:
    deadline = time.time() + 120
    for line in proc.stdout:
      if "Step 5," in line or time.time() > deadline:
        break
    ranks = subprocess.run(["pgrep", "-f", "bert_pretrain.run_pretraining --horovod"],
                           stdout=subprocess.PIPE, universal_newlines=True).stdout.split()
    ranks = [int(p) for p in ranks if int(p) != proc.pid]
    assert ranks, "no rank found to kill"
    killed_at = time.time()
    os.kill(max(ranks), signal.SIGKILL)
    proc.stdout.read()
    status = proc.wait(timeout=90)
    assert time.time() - killed_at < 60
    assert status != 0
  finally:
    if proc.poll() is None:
      proc.kill()


def _launcher_env(**values):
  env = _env(**values)
  for name in ("IX_NUM_CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
    if name not in values:
      env.pop(name, None)
  return env


@pytest.mark.parametrize("values,ranks,message", [
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "4"}, "4", ""),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, "3", ""),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "0,1"}, "2", ""),
    ({}, "2", "2 CPU ranks"),
])
def test_rank_count_from_the_environment(values, ranks, message):
  result = subprocess.run(["bash", "-c", 'here=.; source scripts/common.sh; count_ranks'],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True,
                          env=_launcher_env(PATH="/usr/bin:/bin", **values))
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == ranks
  assert message in result.stderr


@pytest.mark.parametrize("values,message", [
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "8", "CUDA_VISIBLE_DEVICES": "0,1"},
     "IX_NUM_CUDA_VISIBLE_DEVICES=8 but CUDA_VISIBLE_DEVICES=0,1 lists 2 cards"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "eight"}, "is not a positive number"),
])
def test_launcher_rejects_inconsistent_card_counts(values, message, tmp_path):
  result = subprocess.run(["bash", os.path.join(ROOT, "run_multi_card_FPS.sh")],
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=_launcher_env(**values), timeout=60)
  assert result.returncode != 0
  assert message in result.stderr
  assert not (tmp_path / "results").exists()


def test_multi_card_script_runs_the_demo_on_two_ranks(tmp_path):
  result = subprocess.run(
      ["bash", os.path.join(ROOT, "run_multi_card_FPS.sh"), "--num_train_steps=20",
       "--display_loss_steps=10", "--samples_between_eval=100000"],
      cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      universal_newlines=True, timeout=400,
      env=_launcher_env(IX_NUM_CUDA_VISIBLE_DEVICES="2", DEMO_CACHE=str(tmp_path / "cache")))
  assert result.returncode == 0, result.stdout[-3000:]
  out = result.stdout
  assert "Launching 2 ranks" in out
  assert "2 rank(s)" in out and "Step 20," in out
  assert out.count("***** Eval results *****") == 2  # before and after training
  assert re.search(r"\| 2 cards \| acc [\d.]+ \| fps [\d.]+ \|", out)
  demo_runs = os.listdir(str(tmp_path / "results"))
  assert len(demo_runs) == 1 and demo_runs[0].startswith("demo-")
