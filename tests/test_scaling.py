"""bench/scaling.py: a tiny 1-rank and 2-rank Horovod run gives FPS and eval times."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_scaling_table_gives_fps_and_eval_time_of_one_and_two_ranks(tmp_path):
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "bench", "scaling.py"), "--models=tiny",
       "--num_train_steps=4", "--fps_warmup_steps=1", "--noindependent",
       "--out_dir=" + str(tmp_path)],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      timeout=900, env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.returncode == 0, result.stdout[-3000:]
  with open(os.path.join(str(tmp_path), "scaling.json")) as f:
    (row,) = json.load(f)
  for ranks in ("1", "2"):
    assert row["runs"][ranks]["fps"] > 0, row
    assert row["runs"][ranks]["eval_s"] > 0, row
  assert "| eval s 1 rank | eval s 2 ranks |" in result.stdout
  # Both runs evaluated the whole eval set: the same number of samples.
  logs = [open(os.path.join(str(tmp_path), "logs", "scaling-tiny-np%d.log" % n)).read()
          for n in (1, 2)]
  samples = [[line for line in log.splitlines() if "eval_samples = " in line][-1]
             for log in logs]
  assert samples[0].split("=")[-1] == samples[1].split("=")[-1], samples
