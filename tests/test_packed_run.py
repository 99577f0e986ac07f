"""Training on packed records (bert_pretrain.pack_records): recognised from their
features, the batch counted in packs and the samples in sentences, resumed in packs,
and trained alike by Horovod, mirrored and multi_worker_mirrored."""

import json
import os
import re

import pytest

from conftest import (assert_same_weights, base_flags, ordered_flags, run_pretraining)
from test_distribution import finish, start_workers
from test_horovod import GLOO, launch


def _mllog(out):
  """{key: value} of the run's mlperf.log (the last value of a key logged twice)."""
  values = {}
  for name in os.listdir(str(out)):
    if name.startswith("mlperf") and name.endswith(".log"):
      for line in open(str(out / name)):
        record = json.loads(line.split(":::MLLOG ", 1)[1])
        values[record["key"]] = record["value"]
  return values


def test_a_run_on_packed_records_counts_sentences_and_resumes_in_packs(packed_data, tmp_path):
  per_pack = packed_data["summary"]["sequences_per_pack"]
  assert per_pack > 1.05  # the fixture's short sequences share packs
  # An update's sentences count at the mean a pack; MLPerf's global batch is a whole number.
  sentences = 8 * per_pack
  out = tmp_path / "out"
  # The anchors' two flags, given as their scripts give them, agree with the records.
  flags = base_flags(packed_data, out, save_checkpoints_steps=2, enable_packed_data_mode=None,
                     avg_seq_per_pack="%.2f" % per_pack)
  first = run_pretraining(*flags)
  assert first.returncode == 0, first.stderr[-3000:]
  assert ("batch 8 x 1 accumulation x 1 ranks = 8 packs of up to 3 sentences, %.2f sentences "
          "at the data's %.3f a pack per update" % (sentences, per_pack)) in first.stdout
  mllog = _mllog(out)
  assert mllog["global_batch_size"] == round(sentences)
  assert mllog["train_samples"] == round(4 * sentences)
  assert "training sentences: %d," % round(4 * sentences) in first.stdout
  summary = [json.loads(line) for line in open(str(out / "dllog.json"))][-1]
  assert summary["type"] == "summary"
  assert summary["training_sentences"] == pytest.approx(4 * sentences)
  # The packs' padding, counted from the trained batches (the packer's is the set's).
  assert 0 < summary["padding_share"] < packed_data["summary"]["padding_before"]

  rerun = run_pretraining(*[f for f in flags if not f.startswith("--num_train_steps")] +
                          ["--num_train_steps=6"])
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  # The data position counts records: 4 updates of 8 packs.
  assert ("Data: continuing at pack 32 of the data order, the records the run consumed "
          "up to step 4") in rerun.stdout
  assert re.search(r"^Step 6,", rerun.stdout, re.M)
  assert _mllog(out)["train_samples"] == round(6 * sentences)


def test_horovod_mirrored_and_multi_worker_train_packed_records_to_the_same_weights(
    packed_data, equal_weight_data, tmp_path):
  """Each replica normalizes its losses by its own packs' predictions and sequences, and
  the engines average the replicas' gradients alike: 3 updates of 2 x 4 packs end at
  the same weights (rtol 1e-4)."""
  data = dict(equal_weight_data, train=packed_data["train"])
  flags = lambda out: ordered_flags(data, out, 4, 1)
  horovod = launch(GLOO, flags(tmp_path / "horovod"))
  assert horovod.returncode == 0, horovod.stdout[-3000:]
  assert "8 packs of up to 3 sentences" in horovod.stdout
  mirrored = run_pretraining(*flags(tmp_path / "mirrored") +
                             ["--distribution=mirrored", "--cpu_devices=2"])
  assert mirrored.returncode == 0, mirrored.stderr[-3000:]
  results = finish(start_workers(flags(tmp_path / "workers"), tmp_path / "logs"),
                   tmp_path / "logs")
  for status, output in results:
    assert status == 0, output[-3000:]
  for other in ("mirrored", "workers"):
    largest = assert_same_weights(tmp_path / "horovod", tmp_path / other, data["init"])
    print("packed records, %s against Horovod: largest weight difference %.3g"
          % (other, largest))
