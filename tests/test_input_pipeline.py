"""The training and evaluation datasets of input_pipeline.make_dataset."""

import glob
import os

import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain.data import input_pipeline
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


def _training_batches(pretraining_data, count, batch_size, **layout):
  """The input_ids of the first `count` training batches of one process, as
  make_dataset gives them for a job `layout` (num_shards, shard_index, local_shards,
  skip_samples), seed 5."""
  files = sorted(glob.glob(os.path.join(pretraining_data["train"], "*")))
  with tf.Graph().as_default():
    dataset = input_pipeline.make_dataset(files, batch_size, SEQ_LENGTH, PREDICTIONS,
                                          is_training=True, shuffle_buffer=50, seed=5,
                                          **layout)
    ids = tf.data.make_one_shot_iterator(dataset).get_next()["input_ids"]
    with tf.Session() as sess:
      return [sess.run(ids) for _ in range(count)]


def test_every_layout_trains_on_the_same_global_batches_of_one_order(pretraining_data):
  """Update u of a job of global batch 8 trains on records 8u..8u+7 of one order, on one
  replica of 8, two processes of 4 (Horovod, multi_worker_mirrored) or one process of two
  replicas (mirrored); a resumed run skips to the same records."""
  one = np.concatenate(_training_batches(pretraining_data, 4, 8))
  assert len(set(map(tuple, one))) > 8  # the batches hold different records
  rank_0, rank_1 = [_training_batches(pretraining_data, 4, 4, num_shards=2, shard_index=i)
                    for i in (0, 1)]
  two_ranks = np.concatenate([b for u in range(4) for b in (rank_0[u], rank_1[u])])
  np.testing.assert_array_equal(two_ranks, one)
  mirrored = _training_batches(pretraining_data, 8, 4, num_shards=2, local_shards=2)
  np.testing.assert_array_equal(np.concatenate(mirrored), one)
  resumed = _training_batches(pretraining_data, 2, 8, skip_samples=16)
  np.testing.assert_array_equal(np.concatenate(resumed), one[16:])


def test_the_shards_a_files_name_counts_but_which_are_not_there_are_named():
  files = ["/d/part-00000-of-00004", "/d/part-00002-of-00004", "/d/eval-0", "/e/x-1-of-2",
           "/e/x-0-of-2"]
  assert input_pipeline.missing_shards(files) == (
      ["/d/part-00001-of-00004", "/d/part-00003-of-00004"], 6)
  assert input_pipeline.missing_shards(files[2:]) == ([], 0)
