"""Checkpoints: --init_checkpoint path forms, foreign checkpoints, shape errors, resume."""

import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain.training import checkpoints
from bert_pretrain.data import input_pipeline
from bert_pretrain.model import modeling
from conftest import (ROOT, TINY_CONFIG, base_flags, rank_command, rewrite_checkpoint,
                      run_pretraining, start_command)


def save_foreign_checkpoint(folder, config_dict, step=28252, seed=3):
  """A checkpoint as Google's or MLPerf's recipes write it: the model, Adam slots,
  global_step and an unrelated variable. Returns (prefix, values by name)."""
  from bert_pretrain.training import pretraining
  config = modeling.BertConfig.from_dict(config_dict)
  with tf.Graph().as_default():
    tf.set_random_seed(seed)
    features = input_pipeline.constant_features(1, 8, 2)
    pretraining.build_model(config, features, False, tf.float32)
    model_vars = tf.trainable_variables()
    extras = [tf.get_variable(v.op.name + "/adam_m", initializer=tf.ones_like(v.initialized_value()))
              for v in model_vars[:3]]
    global_step = tf.Variable(step, dtype=tf.int64, name="global_step")
    extras.append(tf.get_variable("some_other_recipe/counter", initializer=7.0))
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      prefix = tf.train.Saver().save(sess, os.path.join(str(folder), "model.ckpt"),
                                     global_step=global_step)
      values = sess.run({v.op.name: v for v in model_vars})
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
  # Found from the checkpoint's shapes before any graph is built.
  assert re.search(r"--init_checkpoint=\S+ holds a model with hidden_size=48, "
                   r"intermediate_size=96 but --bert_config_file=\S+ says hidden_size=32, "
                   r"intermediate_size=64; pass the config the checkpoint was trained with$",
                   error), error
  assert tf.train.latest_checkpoint(str(out)) is None


def test_an_incomplete_checkpoint_is_refused_naming_the_newest_complete_one(pretraining_data,
                                                                           tmp_path):
  """A save or a copy that did not finish: the .data file missing or cut short, found
  from the sizes before anything is built; a folder's newest is not passed over
  silently."""
  folder = tmp_path / "ckpts"
  folder.mkdir()
  for step in (1, 2, 3):
    save_foreign_checkpoint(folder, TINY_CONFIG, step=step)
  newest, good = str(folder / "model.ckpt-3"), str(folder / "model.ckpt-2")
  assert checkpoints.missing_data(newest) == ""
  data = newest + ".data-00000-of-00001"
  size = os.path.getsize(data)
  os.truncate(data, size - 4)
  assert checkpoints.missing_data(newest) == (
      "its .data file holds %d of the %d bytes its tensors take" % (size - 4, size))
  with pytest.raises(ValueError) as error:
    checkpoints.resolve_checkpoint(str(folder))
  assert str(error.value) == (
      "--init_checkpoint=%s: its newest checkpoint model.ckpt-3 is incomplete (its .data "
      "file holds %d of the %d bytes its tensors take): a save or copy not finished; pass "
      "--init_checkpoint=%s, the newest complete one there" % (folder, size - 4, size, good))
  os.remove(data)
  with pytest.raises(ValueError, match=r"^--checkpoint=%s: the checkpoint is incomplete "
                     r"\(model.ckpt-3.data-00000-of-00001 is missing\): a save or copy not "
                     r"finished; pass --checkpoint=%s, the newest" % (newest, good)):
    checkpoints.resolve_checkpoint(newest, "--checkpoint")
  assert checkpoints.resolve_checkpoint(good) == good
  # The run refuses it in one line before it writes anything.
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(pretraining_data, out, init_checkpoint=str(folder)))
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [
      "run_pretraining: error: --init_checkpoint=%s: its newest checkpoint model.ckpt-3 is "
      "incomplete (model.ckpt-3.data-00000-of-00001 is missing): a save or copy not "
      "finished; pass --init_checkpoint=%s, the newest complete one there" % (folder, good)]
  assert not out.exists()


def test_an_unreadable_checkpoint_beside_an_incomplete_one_is_passed_over(tmp_path):
  for step in (1, 2, 3):
    save_foreign_checkpoint(tmp_path, TINY_CONFIG, step=step)
  (tmp_path / "model.ckpt-2.index").write_bytes(b"not an index")
  os.remove(str(tmp_path / "model.ckpt-3.data-00000-of-00001"))
  with pytest.raises(ValueError, match=r"its newest checkpoint model.ckpt-3 is incomplete "
                     r"\(model.ckpt-3.data-00000-of-00001 is missing\): a save or copy not "
                     r"finished; pass --init_checkpoint=\S+/model.ckpt-1, the newest "
                     r"complete one there$"):
    checkpoints.resolve_checkpoint(str(tmp_path))


def test_a_checkpoint_with_one_weight_of_another_shape_is_refused_before_the_run_writes(
    pretraining_data, tmp_path):
  """A stitched-together checkpoint whose pooler alone does not fit the config: the
  sizes the config names all agree, the pooler's kernel does not."""
  prefix, _ = save_foreign_checkpoint(tmp_path, TINY_CONFIG)
  h = TINY_CONFIG["hidden_size"]
  stitched = rewrite_checkpoint(
      prefix, str(tmp_path / "stitched" / "model.ckpt"), lambda name, value: (
          np.zeros([h, h // 2], np.float32) if name == "bert/pooler/dense/kernel" else value))
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(pretraining_data, out, init_checkpoint=stitched))
  assert result.returncode == 2, result.stderr
  assert re.fullmatch(
      r"run_pretraining: error: --init_checkpoint=\S+ holds bert/pooler/dense/kernel of "
      r"shape \[%d, %d\] but --bert_config_file=\S+ makes it \[%d, %d\]; pass the config "
      r"the checkpoint was trained with" % (h, h // 2, h, h), result.stderr.strip()), (
          result.stderr)
  assert not out.exists()  # no MLPerf log of a run that never started


def test_weights_stored_in_float16_are_loaded_cast_to_float32(pretraining_data, tmp_path):
  prefix, values = save_foreign_checkpoint(tmp_path, TINY_CONFIG)
  half = rewrite_checkpoint(
      prefix, str(tmp_path / "half" / "model.ckpt"), lambda name, value: (
          value.astype(np.float16) if value.dtype == np.float32 else value))
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(pretraining_data, out, init_checkpoint=half,
                                       num_train_steps=1, nodo_eval=None,
                                       learning_rate=1e-12))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Loaded %d of %d model variables from %s (%d stored in float16, cast)" % (
      len(values), len(values), half, len(values)) in result.stdout, result.stdout[-3000:]
  # A step at a learning rate of 1e-12 leaves the float16 values as they were.
  trained = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(out)))
  for name in ("bert/embeddings/word_embeddings", "cls/predictions/output_bias"):
    np.testing.assert_allclose(trained.get_tensor(name),
                               values[name].astype(np.float16).astype(np.float32), atol=1e-6)


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
  # The JSON-lines log says where each part's weights came from.
  records = [json.loads(line) for line in open(str(out / "dllog.json"))]
  assert [(r["from"], r.get("checkpoint"), r.get("step")) for r in records
          if r["type"] == "weights"] == [("random", None, None),
                                         ("resumed", str(out / "model.ckpt-3"), 3)]
  # Each run has its own MLPerf log, so each holds one run for the compliance checker.
  assert (out / "mlperf.log").exists() and (out / "mlperf.2.log").exists()

  # Resuming with another sequence length or optimizer is refused before training.
  third = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=7,
                                      optimizer="adam", nodo_eval=None))
  assert third.returncode != 0
  assert "holds a run with other optimizer (optimizer was lamb, now adam)" in third.stderr
  # Another model config names the values that differ.
  other = tmp_path / "bert_config.json"
  other.write_text(json.dumps(dict(TINY_CONFIG, num_hidden_layers=3)))
  fourth = run_pretraining(*base_flags(dict(pretraining_data, config=str(other)), out,
                                       num_train_steps=7, nodo_eval=None))
  assert fourth.returncode == 2
  assert ("holds a run with other bert_config (bert_config.json's num_hidden_layers was %d, "
          "now 3); resume with the same settings" % TINY_CONFIG["num_hidden_layers"]
          in fourth.stderr), fourth.stderr
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


# Losing nothing: a run touches only its own output_dir, saves nothing non-finite, holds
# its output_dir alone, and survives a full disk.

def snapshot(folder):
  """{relative path: (size, sha256)} of every file under folder, hidden ones included."""
  found = {}
  for root, _, names in os.walk(str(folder)):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        found[os.path.relpath(path, str(folder))] = (os.path.getsize(path),
                                                     hashlib.sha256(f.read()).hexdigest())
  return found


def steps_of(folder):
  """The steps of the checkpoints in folder (by their .index files)."""
  return sorted(int(m.group(1)) for m in (re.match(r"model\.ckpt-(\d+)\.index$", n)
                                          for n in os.listdir(str(folder))) if m)


def test_a_resumed_run_keeps_the_newest_keep_checkpoint_max_of_all_its_checkpoints(
    pretraining_data, tmp_path):
  """A run that kept all its checkpoints, resumed with --keep_checkpoint_max=2: its first
  save leaves the newest two, the earlier run's included (TensorFlow's Saver would have
  deleted one a save), and only the checkpoints' own files, in a folder whose name holds
  a * and a ? (TensorFlow's patterns match them as themselves)."""
  out = tmp_path / "out?*"
  common = dict(save_checkpoints_steps=1, display_loss_steps=1, nodo_eval=None)
  first = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=4,
                                      keep_checkpoint_max=0, **common))
  assert first.returncode == 0, first.stderr
  assert steps_of(out) == [1, 2, 3, 4]
  (out / "model.ckpt-1.notes.txt").write_text("the user's")
  (out / "model.ckpt-2.bak").mkdir()
  second = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=5,
                                       keep_checkpoint_max=2, **common))
  assert second.returncode == 0, second.stderr
  assert "Resuming from %s at step 4" % (out / "model.ckpt-4") in second.stdout
  assert steps_of(out) == [4, 5]
  assert sorted(n for n in os.listdir(str(out)) if re.match(r"model\.ckpt-[123]\.", n)) == [
      "model.ckpt-1.notes.txt", "model.ckpt-2.bak"]
  assert 'model_checkpoint_path: "model.ckpt-5"' in (out / "checkpoint").read_text()


def test_a_copied_or_moved_output_dir_resumes_from_its_own_newest_checkpoint(
    pretraining_data, tmp_path):
  """The `checkpoint` file of run1 names run1's files by absolute path (as older versions
  and TensorFlow's default write it); copies and moves of run1 still resume from their own
  newest step and rotate only their own files. run1 is not touched."""
  run1 = tmp_path / "run1"
  common = dict(save_checkpoints_steps=10, keep_checkpoint_max=3, display_loss_steps=10,
                nodo_eval=None)
  first = run_pretraining(*base_flags(pretraining_data, run1, num_train_steps=30, **common))
  assert first.returncode == 0, first.stderr
  assert steps_of(run1) == [10, 20, 30]
  (run1 / "checkpoint").write_text(
      'model_checkpoint_path: "%s/model.ckpt-30"\n' % run1 +
      "".join('all_model_checkpoint_paths: "%s/model.ckpt-%d"\n' % (run1, s)
              for s in (10, 20, 30)))
  original = snapshot(run1)

  run2 = tmp_path / "run2"
  subprocess.check_call(["cp", "-a", str(run1), str(run2)])
  second = run_pretraining(*base_flags(pretraining_data, run2, num_train_steps=50, **common))
  assert second.returncode == 0, second.stderr
  assert "Resuming from %s/model.ckpt-30 at step 30" % run2 in second.stdout
  assert steps_of(run2) == [30, 40, 50]  # rotation removed run2's 10 and 20
  assert 'model_checkpoint_path: "model.ckpt-50"' in (run2 / "checkpoint").read_text()

  # A moved folder whose files' times say ckpt-20 is the newest: the step number decides.
  moving, run3 = tmp_path / "moving", tmp_path / "run3"
  subprocess.check_call(["cp", "-a", str(run1), str(moving)])
  subprocess.check_call(["mv", str(moving), str(run3)])
  later = os.stat(str(run3 / "model.ckpt-30.index")).st_mtime + 60
  for name in os.listdir(str(run3)):
    if name.startswith("model.ckpt-20."):
      os.utime(str(run3 / name), (later, later))
  third = run_pretraining(*base_flags(pretraining_data, run3, num_train_steps=40, **common))
  assert third.returncode == 0, third.stderr
  assert "Resuming from %s/model.ckpt-30 at step 30" % run3 in third.stdout
  assert steps_of(run3) == [20, 30, 40]
  reader = tf.train.load_checkpoint(str(run3 / "model.ckpt-40"))
  assert reader.get_tensor("global_step") == 40

  assert snapshot(run1) == original


def write_changed_checkpoint(source, target, change):
  """Writes checkpoint `target` with the tensors of `source` passed through change(name,
  value)."""
  reader = tf.train.load_checkpoint(source)
  with tf.Graph().as_default():
    variables = {name: tf.Variable(change(name, reader.get_tensor(name)), name=name)
                 for name in reader.get_variable_to_shape_map()}
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      tf.train.Saver(variables).save(sess, target, write_meta_graph=False, write_state=False)


def test_a_diverging_run_saves_nothing_non_finite(pretraining_data, tmp_path):
  """Checkpoints every 2 updates, losses shown every 50: the run stops at the first save
  after the weights turn NaN, saving nothing from then on."""
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(
      pretraining_data, out, num_train_steps=60, learning_rate=1000, num_warmup_steps=100,
      save_checkpoints_steps=2, display_loss_steps=50, seed=1, nodo_eval=None))
  assert result.returncode == 1, result.stderr
  stopped = re.search(r"^NaN or Inf in the weights or optimizer state after step (\d+): "
                      r"stopping without saving\. Lower --learning_rate or raise "
                      r"--num_warmup_steps and run again: it resumes from model\.ckpt-(\d+)$",
                      result.stdout, re.M)
  assert stopped, result.stdout
  saved = steps_of(out)
  assert saved and saved[-1] == int(stopped.group(2)) == int(stopped.group(1)) - 2
  for step in saved:
    assert checkpoints.non_finite_variable(str(out / ("model.ckpt-%d" % step))) is None
  assert "Step " not in result.stdout  # no display step was reached


def test_resume_refuses_a_non_finite_checkpoint_and_names_the_last_good_one(
    pretraining_data, tmp_path):
  out = tmp_path / "out"
  first = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=4,
                                      save_checkpoints_steps=2, nodo_eval=None))
  assert first.returncode == 0, first.stderr
  # Two checkpoints after step 4 as an older version saved them when a run diverged.
  nan_in = "bert/encoder/layer_0/output/dense/kernel"
  for step in (6, 8):
    write_changed_checkpoint(
        str(out / "model.ckpt-4"), str(out / ("model.ckpt-%d" % step)),
        lambda name, value: (value * np.nan if name == nan_in else
                             np.int64(step) if name == "global_step" else value))
  error = _refused_with_one_line_keeping_the_folder(pretraining_data, out, 10)
  move = "cd %s && mkdir -p diverged && mv model.ckpt-6.* model.ckpt-8.* diverged/" % out
  assert error == (
      "run_pretraining: error: --output_dir=%s: its newest checkpoint model.ckpt-8 holds NaN "
      "or Inf (%s), the run that wrote it diverged; the last good one is model.ckpt-4: to "
      "resume from it move the newer ones away (%s) and run again with a lower "
      "--learning_rate, or start a new --output_dir with --init_checkpoint=%s/model.ckpt-4 "
      "(weights only)" % (out, nan_in, move, out))
  _resumes_after(move, pretraining_data, out, 4, 6)


def _refused_with_one_line_keeping_the_folder(pretraining_data, out, steps):
  """Runs on `out` to `steps` updates; returns the run's one error line after checking
  that it exited 2 and left the folder as it was."""
  before = snapshot(out)
  refused = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=steps,
                                        nodo_eval=None))
  assert refused.returncode == 2
  errors = [l for l in refused.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1, refused.stderr
  assert snapshot(out) == before
  return errors[0]


def _resumes_after(move, pretraining_data, out, step, steps):
  """Doing what the message says (`move`) resumes from `step`; the run to `steps` saves
  a finite checkpoint."""
  subprocess.check_call(move, shell=True)
  resumed = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=steps,
                                        nodo_eval=None))
  assert resumed.returncode == 0, resumed.stderr
  assert "Resuming from %s/model.ckpt-%d at step %d" % (out, step, step) in resumed.stdout
  assert checkpoints.non_finite_variable(str(out / ("model.ckpt-%d" % steps))) is None


def test_a_damaged_checkpoint_is_named_and_the_run_resumes_from_the_last_good_one(
    pretraining_data, tmp_path):
  out = tmp_path / "out of run 1"  # the advice's shell command quotes it
  first = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=4,
                                      save_checkpoints_steps=2, nodo_eval=None))
  assert first.returncode == 0, first.stderr
  # A copy with flipped bytes fails the reader's checksum; the run's own is cut short.
  data = str(out / "model.ckpt-4.data-00000-of-00001")
  flipped = tmp_path / "flipped"
  flipped.mkdir()
  for name in os.listdir(str(out)):
    if name.startswith("model.ckpt-4."):
      content = bytearray((out / name).read_bytes())
      if ".data-" in name:
        content[len(content) // 2:len(content) // 2 + 64] = bytes(64)
      (flipped / name).write_bytes(bytes(content))
  with pytest.raises(checkpoints.DamagedCheckpoint):
    checkpoints.non_finite_variable(str(flipped / "model.ckpt-4"))
  size = os.path.getsize(data)
  with open(data, "r+b") as f:
    f.truncate(size // 2)
  error = _refused_with_one_line_keeping_the_folder(pretraining_data, out, 6)
  move = "cd %s && mkdir -p damaged && mv model.ckpt-4.* damaged/" % shlex.quote(str(out))
  assert error == (
      "run_pretraining: error: --output_dir=%s: its newest checkpoint model.ckpt-4 is damaged "
      "(Read less bytes than requested), cut short or corrupted on disk; the last good one "
      "is model.ckpt-2: to resume from it move the newer ones away (%s) and run the same "
      "command again, or start a new --output_dir with --init_checkpoint=%s/model.ckpt-2 "
      "(weights only)" % (out, move, out))
  # As --init_checkpoint of a new run: one line, no traceback, before the run starts.
  init = run_pretraining(*base_flags(pretraining_data, tmp_path / "new", num_train_steps=1,
                                     nodo_eval=None, init_checkpoint=str(out / "model.ckpt-4")))
  assert init.returncode == 2 and "Traceback" not in init.stderr, init.stderr[-3000:]
  assert init.stderr.strip().splitlines() == [
      "run_pretraining: error: --init_checkpoint=%s/model.ckpt-4: the checkpoint is incomplete "
      "(its .data file holds %d of the %d bytes its tensors take): a save or copy not "
      "finished; pass --init_checkpoint=%s/model.ckpt-2, the newest complete one there"
      % (out, size // 2, size, out)]
  _resumes_after(move, pretraining_data, out, 2, 4)


def test_the_advice_after_a_stopped_job_resumes_from_the_newest_checkpoint_or_starts_over(
    tmp_path):
  out = tmp_path / "out"
  assert checkpoints.rerun_advice(str(out)) == (
      "no checkpoint was saved in %s yet: the same command run again starts over" % out)
  with tf.Graph().as_default():
    tf.Variable(1.0, name="w")
    saver = tf.train.Saver()
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      for step in (2, 4):
        saver.save(sess, str(out / "model.ckpt"), global_step=step)
  assert checkpoints.rerun_advice(str(out)) == (
      "checkpoints in %s are kept: rerun the same command to resume from model.ckpt-4" % out)


def test_a_permission_or_network_error_is_not_taken_for_a_damaged_checkpoint():
  denied = tf.errors.PermissionDeniedError(None, None, "model.ckpt-4.index; Permission denied")
  assert checkpoints.DamagedCheckpoint.or_error("model.ckpt-4", denied) is denied
  cut = IndexError("Read less bytes than requested")
  damaged = checkpoints.DamagedCheckpoint.or_error("model.ckpt-4", cut)
  assert isinstance(damaged, checkpoints.DamagedCheckpoint)
  assert damaged.reason == "Read less bytes than requested"


def test_a_second_run_on_the_same_output_dir_is_refused_until_the_first_is_killed(
    pretraining_data, tmp_path):
  out = tmp_path / "out"
  flags = base_flags(pretraining_data, out, num_train_steps=10 ** 7,
                     save_checkpoints_steps=10 ** 7, display_loss_steps=10 ** 6,
                     nodo_eval=None)
  first = start_command("bert_pretrain.run_pretraining", *flags, stdout=os.devnull,
                        stderr=os.devnull)
  try:
    lock = out / ".bert_pretrain.lock"
    holder = "pid %d on %s" % (first.pid, socket.gethostname())
    for _ in range(600):  # the first run takes the lock after its input checks
      if lock.exists() and lock.read_text() == holder:
        break
      assert first.poll() is None, "the first run ended early"
      time.sleep(0.2)
    second = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=2,
                                         nodo_eval=None))
    assert second.returncode == 2
    errors = [l for l in second.stderr.splitlines() if "error:" in l]
    assert errors == ["run_pretraining: error: --output_dir=%s is in use by another run "
                      "(%s); wait for it to end or pass another --output_dir"
                      % (out, holder)], second.stderr
    assert "Step " not in second.stdout
    assert not (out / "mlperf.2.log").exists()  # the second run wrote no log
    # --check_only (and so a dry run) says the same, and leaves the lock to its holder.
    check = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=2,
                                        nodo_eval=None, check_only=None))
    assert check.returncode == 2
    assert [l for l in check.stderr.splitlines() if "error:" in l] == errors
    assert lock.read_text() == holder
    assert first.poll() is None
  finally:
    first.kill()
    first.wait()
  # The kernel dropped the killed run's lock: the next run is not blocked.
  third = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=2,
                                      nodo_eval=None))
  assert third.returncode == 0, third.stderr
  assert "Step 2," in third.stdout


def test_a_full_disk_is_named_keeps_earlier_checkpoints_and_resumes(pretraining_data,
                                                                     small_disk):
  out = small_disk / "out"
  common = dict(save_checkpoints_steps=2, nodo_eval=None)
  first = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=4, **common))
  assert first.returncode == 0, first.stderr
  assert steps_of(out) == [2, 4]
  kept = {n: v for n, v in snapshot(out).items() if n.startswith("model.ckpt-")}
  # Leave 300 kB: room for the logs, not for a 520 kB checkpoint.
  stat = os.statvfs(str(small_disk))
  filler = small_disk / "filler"
  filler.write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 300 * 1024))

  full = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=8, **common))
  assert full.returncode == 2
  errors = [l for l in full.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1, full.stderr
  size = sum(os.path.getsize(str(p)) for p in out.glob("model.ckpt-4.*")) / 1e6
  assert re.match(r"run_pretraining: error: the disk is full \(no space left on the device "
                  r"of --output_dir=%s, [\d.]+ MB free\) while writing checkpoint "
                  r"model\.ckpt-6; free space there \(a checkpoint takes %.1f MB beside the "
                  r"ones kept\), then run the same command again: it resumes from "
                  r"model\.ckpt-4$" % (re.escape(str(out)), size), errors[0]), errors[0]
  assert "Traceback" not in full.stderr
  after = snapshot(out)
  assert {n: v for n, v in after.items() if n.startswith("model.ckpt-")} == kept
  assert not [n for n in after if "tempstate" in n or n.startswith("model.ckpt-6")]

  # What a save killed halfway leaves is removed when the run starts again.
  (out / "model.ckpt-6.data-00000-of-00001.tempstate8817236").write_bytes(b"\0" * 100)
  (out / "model.ckpt-6.data-00000-of-00001").write_bytes(b"\0" * 100)
  filler.unlink()
  rerun = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=8, **common))
  assert rerun.returncode == 0, rerun.stderr
  assert ("Removed what an interrupted save left in %s: model.ckpt-6.data-00000-of-00001, "
          "model.ckpt-6.data-00000-of-00001.tempstate8817236" % out) in rerun.stdout
  assert "Resuming from %s/model.ckpt-4 at step 4" % out in rerun.stdout
  assert steps_of(out) == [2, 4, 6, 8]
  assert not [n for n in os.listdir(str(out)) if "tempstate" in n]


def test_a_saved_checkpoint_whose_index_went_is_refused_and_nothing_is_deleted(
    pretraining_data, tmp_path):
  """Its .data without its .index looks like a save cut short, which a run removes; but
  the `checkpoint` file lists it, written after the .index: the weights of the only
  checkpoint must not go, nor the run start over."""
  out = tmp_path / "out"
  flags = base_flags(pretraining_data, out, num_train_steps=3, nodo_eval=None)
  assert run_pretraining(*flags).returncode == 0
  (out / "model.ckpt-3.index").rename(tmp_path / "model.ckpt-3.index")
  before = sorted(os.listdir(str(out)))
  again = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=5,
                                      nodo_eval=None))
  assert again.returncode == 2, again.stdout[-2000:]
  lost = ("run_pretraining: error: --output_dir=%s: %s is missing, but the `checkpoint` file "
          "there lists model.ckpt-3 as saved (a save cut short never is): put it back, or to "
          "resume from an earlier checkpoint move model.ckpt-3.* away; nothing was deleted")
  assert again.stderr.strip().splitlines() == [lost % (out, "model.ckpt-3.index")]
  assert sorted(os.listdir(str(out))) == before
  (tmp_path / "model.ckpt-3.index").rename(out / "model.ckpt-3.index")
  # A shard of its .data gone (here the second of two) is told the same way.
  (out / "model.ckpt-3.data-00000-of-00001").rename(out / "model.ckpt-3.data-00000-of-00002")
  before = sorted(os.listdir(str(out)))
  again = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=5,
                                      nodo_eval=None))
  assert again.returncode == 2, again.stdout[-2000:]
  assert again.stderr.strip().splitlines() == [
      lost % (out, "model.ckpt-3.data-00001-of-00002")]
  assert sorted(os.listdir(str(out))) == before
  (out / "model.ckpt-3.data-00000-of-00002").rename(out / "model.ckpt-3.data-00000-of-00001")
  resumed = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=5,
                                        nodo_eval=None))
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "Resuming from %s/model.ckpt-3 at step 3" % out in resumed.stdout


def test_horovod_ranks_share_their_jobs_lock(pretraining_data, tmp_path):
  """Rank 0 takes the lock for the job: a 2-rank job runs (rank 1 does not ask for the
  lock rank 0 holds), and a 2-rank job on a folder another run holds is refused (rank 0
  exits 2, horovodrun ends rank 1). The timeouts only bound a hang on a loaded machine."""
  gloo = (["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"] +
          rank_command("--horovod"))
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  out = tmp_path / "out"
  flags = base_flags(pretraining_data, out, num_train_steps=2, nodo_eval=None)
  job = subprocess.run(gloo + flags, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, env=env, timeout=900)
  assert job.returncode == 0, job.stdout[-3000:]
  assert steps_of(out) == [2]

  held = checkpoints.OutputDirLock(str(out))
  held.acquire()
  before = _files_and_times(out)
  flags = base_flags(pretraining_data, out, num_train_steps=4, nodo_eval=None)
  refused = subprocess.run(gloo + flags, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, env=env, timeout=900)
  assert refused.returncode != 0
  # Each rank refuses before the job starts (the first to exit ends the other, maybe
  # before its line) and writes nothing in the holder's folder (heartbeats, stall
  # reports, a rerun advice of its checkpoint).
  assert ("run_pretraining: error: --output_dir=%s is in use by another run (pid %d on %s)"
          % (out, os.getpid(), socket.gethostname())) in refused.stdout, refused.stdout[-3000:]
  assert "Step " not in refused.stdout and "stopped the job" not in refused.stdout
  assert _files_and_times(out) == before
  assert steps_of(out) == [2]


class _Pressed(Exception):
  pass


def test_a_wait_for_a_held_lock_ends_at_a_signal_another_thread_got(tmp_path):
  """The demo waits for its cache's lock while another demo builds it: a Ctrl-C that the
  kernel gave another of its threads (TensorFlow's) ends the wait at once, not only when
  the holder lets go (here after 20 s)."""
  held = checkpoints.OutputDirLock(str(tmp_path))
  held.acquire()
  let_go = threading.Timer(20, held.release)
  let_go.start()

  def press(unused_signum, unused_frame):
    raise _Pressed()

  def to_this_thread():  # whose C-level handler only sets a flag for the main thread
    time.sleep(0.5)
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)

  previous = signal.signal(signal.SIGUSR1, press)
  started = time.monotonic()
  try:
    with pytest.raises(_Pressed):  # the signal may come before the wait, never outside
      threading.Thread(target=to_this_thread, daemon=True).start()
      checkpoints.OutputDirLock(str(tmp_path)).acquire(wait=True)
    waited = time.monotonic() - started
  finally:
    signal.signal(signal.SIGUSR1, previous)
    let_go.cancel()
    held.release()
  assert waited < 10


def _files_and_times(folder):
  """Each file under folder -> (size, modification time)."""
  found = {}
  for root, _, names in os.walk(str(folder)):
    for name in names:
      stat = os.stat(os.path.join(root, name))
      found[os.path.join(root, name)] = (stat.st_size, stat.st_mtime_ns)
  return found


def test_a_skipped_float16_step_passes_the_check_before_saving():
  """float16 compute with a loss scale so large that the gradients overflow: the step is
  skipped, the variables stay finite and the check before a save passes. Without loss
  scaling the same overflow makes them NaN and the check fails."""
  from bert_pretrain.training import optimization
  from bert_pretrain.training import pretraining
  config = modeling.BertConfig.from_dict(TINY_CONFIG)
  for scaled in (True, False):
    with tf.Graph().as_default():
      tf.set_random_seed(1)
      features = input_pipeline.constant_features(2, 16, 3)
      loss = pretraining.build_model(config, features, True, tf.float16)["total_loss"]
      loss_scale = optimization.DynamicLossScale(initial_scale=2.0 ** 60) if scaled else None
      if not scaled:
        loss = loss * 1e38 * 1e38  # inf, as an overflow makes it
      global_step = tf.train.get_or_create_global_step()
      _, update = optimization.create_train_ops(
          loss, optimization.create_optimizer("lamb", 1e-3), global_step,
          num_accumulation_steps=1, loss_scale=loss_scale)
      check = checkpoints.all_finite(tf.global_variables())
      with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        assert sess.run(check)
        sess.run(update)
        if scaled:
          assert sess.run(loss_scale.skipped_steps) == 1
        assert sess.run(check) == scaled


def test_a_damaged_run_record_is_named_with_the_fix_that_then_resumes(pretraining_data,
                                                                      tmp_path):
  out = tmp_path / "out"
  first = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=2,
                                      nodo_eval=None))
  assert first.returncode == 0, first.stderr
  marker = out / checkpoints.RUN_MARKER
  text = marker.read_text()
  marker.write_text(text[:text.index('"gelu"') + 3])  # cut inside a string
  files_before = snapshot(out)
  damaged = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=4,
                                        nodo_eval=None))
  assert damaged.returncode == 2
  errors = damaged.stderr.strip().splitlines()
  assert errors[-1].startswith("run_pretraining: error: %s is damaged (Unterminated string "
                               "starting at: line " % marker), errors[-1]
  assert "delete it (rm %s) and run again to resume from model.ckpt-2" % marker in errors[-1]
  assert snapshot(out) == files_before
  marker.unlink()
  resumed = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=4,
                                        nodo_eval=None))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Resuming from %s at step 2" % (out / "model.ckpt-2") in resumed.stdout
  assert "holds no layout of the run that wrote model.ckpt-2" in resumed.stdout
  assert json.loads(marker.read_text())["layout"]["global_batch_size"] == 8
