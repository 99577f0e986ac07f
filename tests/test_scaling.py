"""bench/scaling.py: a tiny 1-rank and 2-rank run with each engine gives FPS and eval
times."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_scaling_table_gives_fps_and_eval_time_of_one_and_two_ranks_of_each_engine(tmp_path):
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "bench", "scaling.py"), "--models=tiny",
       "--num_train_steps=4", "--fps_warmup_steps=1", "--noindependent",
       "--out_dir=" + str(tmp_path)],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      timeout=900, env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.returncode == 0, result.stdout[-3000:]
  with open(os.path.join(str(tmp_path), "scaling.json")) as f:
    (row,) = json.load(f)
  for run in ("1", "2", "2-mirrored", "2-multi_worker_mirrored"):
    assert row["runs"][run]["fps"] > 0, row
    assert row["runs"][run]["eval_s"] > 0, row
  assert ("| 2 mirrored sent/s | efficiency | 2 multi_worker_mirrored sent/s | efficiency | "
          "eval s 1 rank | eval s 2 ranks |") in result.stdout
  # Every run evaluated the whole eval set: the same number of samples.
  logs = [open(os.path.join(str(tmp_path), "logs", "scaling-tiny-%s.log" % tag)).read()
          for tag in ("np1", "np2", "np2-mirrored", "np2-multi_worker_mirrored")]
  samples = [[line for line in log.splitlines() if "eval_samples = " in line][-1]
             for log in logs]
  assert len(set(line.split("=")[-1] for line in samples)) == 1, samples
