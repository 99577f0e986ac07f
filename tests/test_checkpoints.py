"""Checkpoints: --init_checkpoint path forms, foreign checkpoints, shape errors, resume."""

import os
import re

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import checkpoints
from bert_pretrain import input_pipeline
from bert_pretrain import modeling
from conftest import TINY_CONFIG, base_flags, run_pretraining


def save_foreign_checkpoint(folder, config_dict, step=28252, seed=3):
  """A checkpoint as Google's or MLPerf's recipes write it: the model, Adam slots,
  global_step and an unrelated variable. Returns (prefix, values by name)."""
  from bert_pretrain import run_pretraining as rp
  config = modeling.BertConfig.from_dict(config_dict)
  with tf.Graph().as_default():
    tf.set_random_seed(seed)
    features = input_pipeline.constant_features(1, 8, 2)
    rp.build_model(config, features, False, tf.float32)
    model_vars = tf.trainable_variables()
    extras = [tf.get_variable(v.op.name + "/adam_m", initializer=tf.ones_like(v.initialized_value()))
              for v in model_vars[:3]]
    global_step = tf.Variable(step, dtype=tf.int64, name="global_step")
    extras.append(tf.get_variable("some_other_recipe/counter", initializer=7.0))
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      prefix = tf.train.Saver().save(sess, os.path.join(str(folder), "model.ckpt"),
                                     global_step=global_step)
      values = {v.op.name: sess.run(v) for v in model_vars}
  return prefix, values


def test_resolve_checkpoint_forms(tmp_path):
  prefix, _ = save_foreign_checkpoint(tmp_path, TINY_CONFIG)
  assert prefix.endswith("model.ckpt-28252")
  for form in (prefix, prefix + ".index", prefix + ".data-00000-of-00001", str(tmp_path)):
    assert checkpoints.resolve_checkpoint(form) == prefix
  # A folder without the "checkpoint" index file still works.
  os.remove(os.path.join(str(tmp_path), "checkpoint"))
  assert checkpoints.resolve_checkpoint(str(tmp_path)) == prefix
  with pytest.raises(ValueError, match="no checkpoint there"):
    checkpoints.resolve_checkpoint(str(tmp_path / "model.ckpt-1"))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(ValueError, match="folder without a checkpoint"):
    checkpoints.resolve_checkpoint(str(empty))


def test_foreign_checkpoint_loads_weights_only(pretraining_data, tmp_path):
  """A checkpoint with optimizer slots and global_step 28252 starts a run at step 0 with
  its weights."""
  (tmp_path / "ckpt").mkdir()
  prefix, values = save_foreign_checkpoint(tmp_path / "ckpt", TINY_CONFIG)
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(pretraining_data, out, init_checkpoint=prefix + ".index",
                                       num_train_steps=1, nodo_eval=None))
  assert result.returncode == 0, result.stderr
  loaded = re.search(r"Loaded (\d+) of (\d+) model variables", result.stdout)
  assert loaded and loaded.group(1) == loaded.group(2) == str(len(values))
  assert "Model variables not in the checkpoint" not in result.stdout
  saved = tf.train.latest_checkpoint(str(out))
  assert saved.endswith("model.ckpt-1")  # global_step of the foreign run is not taken
  reader = tf.train.load_checkpoint(saved)
  assert not reader.has_tensor("some_other_recipe/counter")
  # One LAMB step moves each weight by at most about learning_rate * |w|.
  w = values["bert/embeddings/word_embeddings"]
  w1 = reader.get_tensor("bert/embeddings/word_embeddings")
  assert 0 < np.abs(w1 - w).max() < 0.01


def test_checkpoint_of_another_shape_is_a_clear_error(pretraining_data, tmp_path):
  bigger = dict(TINY_CONFIG, hidden_size=48, intermediate_size=96)
  prefix, _ = save_foreign_checkpoint(tmp_path, bigger)
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(pretraining_data, out, init_checkpoint=prefix,
                                       num_train_steps=1))
  assert result.returncode != 0
  error = result.stderr.strip().splitlines()[-1]
  assert re.search(r"variable bert/\S+ has shape \[\d+(, \d+)*\] but the model needs", error), error
  assert "bert_config_file" in error
  assert tf.train.latest_checkpoint(str(out)) is None


def test_resume_continues_the_step_count(pretraining_data, tmp_path):
  out = tmp_path / "out"
  first = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=3, nodo_eval=None))
  assert first.returncode == 0, first.stderr
  assert tf.train.latest_checkpoint(str(out)).endswith("model.ckpt-3")
  before = tf.train.load_checkpoint(str(out / "model.ckpt-3"))

  # A foreign init checkpoint is not applied when resuming.
  ckpt_dir = tmp_path / "foreign"
  ckpt_dir.mkdir()
  prefix, _ = save_foreign_checkpoint(ckpt_dir, TINY_CONFIG)
  second = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=5,
                                       init_checkpoint=prefix, nodo_eval=None))
  assert second.returncode == 0, second.stderr
  assert "Resuming from" in second.stdout and "at step 3" in second.stdout
  assert "Loaded" not in second.stdout
  steps = [int(s) for s in re.findall(r"^Step (\d+),", second.stdout, re.M)]
  assert steps == [4, 5]
  after = tf.train.load_checkpoint(str(out / "model.ckpt-5"))
  assert after.get_tensor("global_step") == 5
  # The optimizer state was restored and moved on, not restarted.
  name = "bert/pooler/dense/kernel/adam_v"
  assert not np.allclose(after.get_tensor(name), before.get_tensor(name))
  assert os.path.exists(str(out / "model.ckpt-3.index"))  # nothing deleted
  # Each run has its own MLPerf log, so each holds one run for the compliance checker.
  assert (out / "mlperf.log").exists() and (out / "mlperf.2.log").exists()

  # Resuming with another sequence length or optimizer is refused before training.
  third = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=7,
                                      optimizer="adam", nodo_eval=None))
  assert third.returncode != 0
  assert "holds a run with other optimizer (optimizer was lamb)" in third.stderr
  assert tf.train.latest_checkpoint(str(out)).endswith("model.ckpt-5")


def test_foreign_checkpoint_in_output_dir_is_a_clear_error(pretraining_data, tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  save_foreign_checkpoint(out, TINY_CONFIG)
  files_before = sorted(os.listdir(str(out)))
  result = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=1))
  assert result.returncode != 0
  error = result.stderr.strip().splitlines()[-1]
  assert "not a checkpoint of this run's recipe" in error and "--init_checkpoint" in error
  assert sorted(os.listdir(str(out))) == files_before
