"""The training and evaluation datasets of input_pipeline.make_dataset."""

import glob
import os

import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain import input_pipeline
from conftest import PREDICTIONS, SEQ_LENGTH


def _autotune_enabled(options):
  if hasattr(options, "autotune"):
    return options.autotune.enabled
  return options.experimental_optimization.autotune


def _eval_batches(pretraining_data, passes):
  """The masked_lm_ids of every eval batch, for each of `passes` passes over one
  re-initialized iterator, as run_pretraining's Evaluator reads them."""
  files = sorted(glob.glob(os.path.join(pretraining_data["eval"], "*")))
  with tf.Graph().as_default():
    dataset = input_pipeline.make_dataset(files, 8, SEQ_LENGTH, PREDICTIONS,
                                          is_training=False)
    iterator = tf.data.make_initializable_iterator(dataset)
    ids = iterator.get_next()["masked_lm_ids"]
    result = []
    with tf.Session() as sess:
      for _ in range(passes):
        sess.run(iterator.initializer)
        batches = []
        while True:
          try:
            batches.append(sess.run(ids))
          except tf.errors.OutOfRangeError:
            break
        result.append(np.concatenate(batches))
  return result


def test_datasets_run_without_the_autotune_thread_that_stalls_iterator_teardown(
    pretraining_data):
  # tf.data's autotuning thread sleeps up to a minute between rounds, and destroying an
  # iterator (re-initializing the eval iterator, closing the session) waits for it: an
  # evaluation of the demo took 0.1 s or 53 s. Both datasets turn it off.
  files = sorted(glob.glob(os.path.join(pretraining_data["train"], "*")))
  with tf.Graph().as_default():
    for is_training in (True, False):
      dataset = input_pipeline.make_dataset(files, 4, SEQ_LENGTH, PREDICTIONS,
                                            is_training=is_training)
      assert _autotune_enabled(dataset.options()) is False, is_training


def test_each_evaluation_pass_reads_the_whole_eval_set_in_the_same_order(pretraining_data):
  first, second, third = _eval_batches(pretraining_data, 3)
  records = sum(1 for f in glob.glob(os.path.join(pretraining_data["eval"], "*"))
                for _ in tf.python_io.tf_record_iterator(f))
  assert len(first) == records > 8
  np.testing.assert_array_equal(first, second)
  np.testing.assert_array_equal(first, third)
