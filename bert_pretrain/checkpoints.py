"""Finding and loading checkpoints: --init_checkpoint (weights only) and resume.

--init_checkpoint takes a prefix (model.ckpt-28252), the path of one of its files
(model.ckpt-28252.index, model.ckpt-28252.data-00000-of-00001) or a folder (its latest
checkpoint). Only model weights are taken from it: optimizer slots and global_step of a
foreign checkpoint are ignored. A checkpoint of this recipe in --output_dir is resumed
from instead: weights, optimizer state and global_step.
"""

import json
import os
import re

import tensorflow.compat.v1 as tf

_CHECKPOINT_FILE_SUFFIX = re.compile(r"\.(index|meta|data-\d{5}-of-\d{5})$")
# Written into output_dir by this recipe; a checkpoint without it is someone else's.
RUN_MARKER = "bert_pretrain_run.json"


def find_resume_checkpoint(output_dir, settings=None):
  """Returns the prefix of this recipe's latest checkpoint in output_dir, or None.

  Args:
    output_dir: the run's --output_dir.
    settings: (optional) dict of the settings a resumed run must share with the
      earlier one (write_run_marker stored them).

  Raises:
    ValueError: output_dir holds a checkpoint that this recipe did not write (MLPerf's
      model.ckpt-28252 copied there, say): resuming from it would take a foreign
      global_step and optimizer state.
  """
  if not tf.gfile.IsDirectory(output_dir) or \
      not tf.gfile.Glob(os.path.join(output_dir, "*.index")):
    return None
  marker = os.path.join(output_dir, RUN_MARKER)
  if not tf.gfile.Exists(marker):
    raise ValueError("--output_dir=%s holds a checkpoint that is not a checkpoint of this "
                     "run's recipe; to start from its weights pass it as --init_checkpoint with "
                     "a new --output_dir" % output_dir)
  if settings is not None:
    with tf.gfile.GFile(marker, "r") as f:
      earlier = json.load(f)
    changed = sorted(k for k in settings if k in earlier and earlier[k] != settings[k])
    if changed:
      raise ValueError("--output_dir=%s holds a run with other %s (%s); resume with the same "
                       "settings or use a new --output_dir"
                       % (output_dir, ", ".join(changed),
                          "; ".join("%s was %s" % (k, earlier[k]) for k in changed
                                    if k != "bert_config") or "bert_config.json differs"))
  # Without the "checkpoint" index file (copied folders), the newest *.index is taken.
  return resolve_checkpoint(output_dir, "--output_dir")


def write_run_marker(output_dir, settings):
  """Marks output_dir as this recipe's, with the settings its checkpoints need."""
  with tf.gfile.GFile(os.path.join(output_dir, RUN_MARKER), "w") as f:
    f.write(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def resolve_checkpoint(path, flag_name="--init_checkpoint"):
  """Returns the checkpoint prefix that `path` names.

  Raises:
    ValueError: nothing there is a checkpoint; the message says what to pass.
  """
  if tf.gfile.IsDirectory(path):
    prefix = tf.train.latest_checkpoint(path)
    if prefix is None:
      # A folder without a "checkpoint" index file: take the newest *.index in it.
      indexes = sorted(tf.gfile.Glob(os.path.join(path, "*.index")),
                       key=lambda p: tf.gfile.Stat(p).mtime_nsec)
      prefix = indexes[-1][:-len(".index")] if indexes else None
    if prefix is None:
      raise ValueError("%s=%s is a folder without a checkpoint; pass the checkpoint prefix, "
                       "e.g. %s=/path/model.ckpt-28252" % (flag_name, path, flag_name))
    return prefix
  prefix = _CHECKPOINT_FILE_SUFFIX.sub("", path)
  if not tf.gfile.Exists(prefix + ".index"):
    raise ValueError("%s=%s: no checkpoint there (%s.index does not exist); pass the prefix "
                     "of an existing checkpoint, e.g. %s=/path/model.ckpt-28252"
                     % (flag_name, path, prefix, flag_name))
  return prefix


def variable_name(variable):
  """The checkpoint name of a variable: its name without the ":0"."""
  return variable.op.name


def restore_model_weights(sess, prefix, model_variables, log=print):
  """Loads the model variables found in a checkpoint by name.

  Args:
    sess: the tf.Session whose variables are set.
    prefix: checkpoint prefix (resolve_checkpoint).
    model_variables: the variables to look for (the trainable variables of the model).
    log: function taking a line of text.

  Returns:
    The list of model variable names that the checkpoint did not have.

  Raises:
    ValueError: a variable has another shape in the checkpoint (names both shapes), or
      the checkpoint holds none of the model's variables.
  """
  checkpoint_shapes = dict(tf.train.list_variables(prefix))
  found = {}
  missing = []
  for var in model_variables:
    name = variable_name(var)
    if name not in checkpoint_shapes:
      missing.append(name)
      continue
    if list(checkpoint_shapes[name]) != var.shape.as_list():
      raise ValueError("checkpoint %s: variable %s has shape %s but the model needs %s; use "
                       "the --bert_config_file the checkpoint was trained with"
                       % (prefix, name, list(checkpoint_shapes[name]), var.shape.as_list()))
    found[name] = var
  if not found:
    raise ValueError("checkpoint %s holds none of the model's variables (e.g. %s); it is not "
                     "a BERT checkpoint with Google BERT variable names"
                     % (prefix, variable_name(model_variables[0])))
  tf.train.Saver(var_list=found).restore(sess, prefix)
  log("Loaded %d of %d model variables from %s" % (len(found), len(model_variables), prefix))
  if missing:
    log("Model variables not in the checkpoint (initialized fresh): %s" % ", ".join(missing))
  return missing


def check_resumable(prefix, variables, optional_prefixes=("loss_scale/",)):
  """Checks that `prefix` is a checkpoint of this recipe that holds `variables`.

  Raises:
    ValueError: a variable is missing or has another shape: the checkpoint was written
      by another recipe or another configuration.
  """
  checkpoint_shapes = dict(tf.train.list_variables(prefix))
  for var in variables:
    name = variable_name(var)
    if name.startswith(optional_prefixes):
      continue
    if name not in checkpoint_shapes:
      raise ValueError("--output_dir holds checkpoint %s, which lacks %s: it was written with "
                       "other settings (optimizer, accumulation, config); use those settings "
                       "or a new --output_dir" % (prefix, name))
    if list(checkpoint_shapes[name]) != var.shape.as_list():
      raise ValueError("--output_dir holds checkpoint %s whose %s has shape %s, but this run "
                       "needs %s; use the same --bert_config_file or a new --output_dir"
                       % (prefix, name, list(checkpoint_shapes[name]), var.shape.as_list()))
