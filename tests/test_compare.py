"""bert_pretrain/compare.py: real short runs side by side, the band around the reference's
loss, the throughput ratio, the picture, and one-line errors for bad run folders."""

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from bert_pretrain import compare
from bert_pretrain import demo
from bert_pretrain.model import modeling
from conftest import ROOT, TWO_LAYER_CONFIG, base_flags, run_pretraining

STEPS = 12


def run_compare(*args, cwd=None):
  return subprocess.run([sys.executable, "-m", "bert_pretrain.compare"] + list(args),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        universal_newlines=True, cwd=cwd, timeout=300,
                        env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.fixture(scope="module")
def runs(pretraining_data, tmp_path_factory):
  """Short real runs on the fixture data from one checkpoint of a dropout-free config
  (TensorFlow 1.15 draws other dropout masks in a graph of another compute type) of two
  layers (one layer's loss moved too little for another data order to leave the 0.1%
  band at the first step): float32 and bfloat16 with seed 1, float32 with seed 2, and
  float32 with seed 1 at twice the learning rate."""
  root = tmp_path_factory.mktemp("runs")
  config = dict(TWO_LAYER_CONFIG, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  (root / "bert_config.json").write_text(json.dumps(config))
  init = str(root / "init" / "model.ckpt-0")
  demo.write_fresh_checkpoint(modeling.BertConfig.from_dict(config), init)
  made = {}
  for name, overrides in (("fp32", {}), ("bf16", {"amp_dtype": "bfloat16"}),
                          ("seed2", {"seed": 2}), ("lr2", {"learning_rate": 2e-3})):
    values = dict(num_train_steps=STEPS, display_loss_steps=2, eval_at_start=None,
                  seed=1, fps_warmup_steps=2, bert_config_file=str(root / "bert_config.json"),
                  init_checkpoint=init)
    values.update(overrides)
    out = root / name
    result = run_pretraining(*base_flags(pretraining_data, out, **values))
    assert result.returncode == 0, result.stderr
    made[name] = str(out)
  return made


def _png_size(path):
  with open(path, "rb") as f:
    header = f.read(24)
  assert header[:8] == b"\x89PNG\r\n\x1a\n"
  return struct.unpack(">II", header[16:24])


def table_row(out, name):
  (line,) = [l for l in out.splitlines() if l.startswith(name + " ")]
  return line


def test_float32_and_bfloat16_runs_of_one_seed_stay_in_the_band_and_report_their_speed(
    runs, tmp_path):
  pytest.importorskip("matplotlib", reason="init_tf.sh installs matplotlib")
  report_png = os.path.join(runs["fp32"], "report.png")
  drawn = subprocess.run([sys.executable, "-m", "bert_pretrain.training.report", runs["fp32"]],
                         env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE)
  assert drawn.returncode == 0
  with open(report_png, "rb") as f:
    report_before = f.read()
  result = run_compare(runs["fp32"], runs["bf16"], cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert "left the 0.1% band at" in out.splitlines()[0]
  assert "(reference)" in table_row(out, "fp32") and " float32 " in table_row(out, "fp32")
  bf16 = table_row(out, "bf16")
  assert " bfloat16 " in bf16 and " %d " % STEPS in bf16 and " %d " % (8 * STEPS) in bf16
  assert "never, to step %d (at most " % STEPS in bf16
  fp32_run, bf16_run = compare.Run(runs["fp32"], "fp32"), compare.Run(runs["bf16"], "bf16")
  ratio = bf16_run.throughput()[0] / fp32_run.throughput()[0]
  assert "%.3fx" % ratio in bf16
  # The steady-state figure is the run's own summary line's.
  assert bf16_run.throughput() == ([r for r in bf16_run.records
                                    if r["type"] == "summary"][-1]["throughput"], "")
  assert ("compare: the runs have the reference's --seed=1 and training files (their "
          "bert_pretrain_run.json say); the band assumes the same initial weights too"
          ) in out.splitlines()
  assert "compare: compare.png" in out
  assert _png_size(str(tmp_path / "compare.png")) == (1280, 640)
  with open(report_png, "rb") as f:
    assert f.read() == report_before  # a run's own picture stays as it was


def test_a_run_of_another_seed_leaves_the_band_at_the_first_step_and_says_why(runs, tmp_path):
  result = run_compare(runs["fp32"], runs["seed2"], "--png_path=" + str(tmp_path / "c.png"))
  assert result.returncode == 0, result.stderr
  assert "step 2 (" in table_row(result.stdout, "seed2")
  assert "from the first step: not the same seed and data?" in result.stdout
  assert ("compare: the band assumes the reference's --seed=1 and training files: seed2 has "
          "--seed=2") in result.stdout.splitlines()


def test_a_run_of_another_learning_rate_is_not_compared_step_by_step(runs, tmp_path):
  result = run_compare(runs["fp32"], runs["lr2"], runs["bf16"],
                       "--png_path=" + str(tmp_path / "c.png"))
  assert result.returncode == 0, result.stderr
  assert "not compared: learning rate" in table_row(result.stdout, "lr2")
  assert "never, to step" in table_row(result.stdout, "bf16")


def test_the_band_is_left_at_the_first_common_step_outside_it(runs):
  reference, run = compare.Run(runs["fp32"], "fp32"), compare.Run(runs["bf16"], "bf16")
  losses = {r["step"]: r["total_loss"] for r in reference.train}
  shares = [(r["step"], abs(r["total_loss"] - losses[r["step"]]) / losses[r["step"]])
            for r in run.train]
  assert len(shares) == STEPS // 2 and max(s for _, s in shares) > 0
  # A band between the differences: the first step above it is where the run leaves it.
  band = sorted(s for _, s in shares)[len(shares) // 2]
  expected = [step for step, share in shares if share > band][0]
  step, last, largest = compare.band_exit(run, reference, band)
  assert (step, last) == (expected, expected)
  assert largest == max(s for st, s in shares if st <= expected)
  assert compare.band_exit(run, reference, 0.5) == (None, STEPS, max(s for _, s in shares))


def test_bad_run_folders_are_one_line_errors(runs, tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  cut = tmp_path / "cut"
  cut.mkdir()
  with open(os.path.join(runs["fp32"], "dllog.json")) as f:
    text = f.read()
  first_train = text.index('"type": "train"')
  (cut / "dllog.json").write_text(text[:first_train + 20])
  for args, message in (
      ([runs["fp32"], str(empty)], "%s does not exist" % (empty / "dllog.json")),
      ([runs["fp32"], str(cut)], "%s holds no training step (it is cut short at line "
       % (cut / "dllog.json")),
      ([str(tmp_path / "missing"), runs["fp32"]], "is not a folder"),
      ([runs["fp32"]], "give two run folders or more")):
    result = run_compare(*args, cwd=str(tmp_path))
    assert result.returncode == 2, result.stdout
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("compare: error: ")
    assert message in result.stderr
  assert not (tmp_path / "compare.png").exists()


def test_a_picture_path_that_cannot_be_written_is_one_line_and_the_written_path_is_printed(
    runs, tmp_path):
  pytest.importorskip("matplotlib", reason="init_tf.sh installs matplotlib")
  (tmp_path / "taken.png").mkdir()
  (tmp_path / "mine.png").write_text("a picture of the user's")
  for path, message in (
      ("x.txt", "--png_path=x.txt does not end with .png, .svg or .pdf; pass e.g. "
       "--png_path=x.png"),
      ("afile", "--png_path=afile does not end with .png, .svg or .pdf; pass e.g. "
       "--png_path=afile.png"),
      ("missing/x.png", "--png_path=missing/x.png: missing does not exist; pass a path in "
       "a folder that exists"),
      # Not written over: a file compare did not draw (a run's report.png, say).
      ("mine.png", "--png_path=mine.png exists without compare's mark (a run's report.png, "
       "a picture of yours, or one an older version drew); pass another path, or remove it "
       "first"),
      # Found only when the picture is written, after the table.
      ("taken.png", "taken.png: Is a directory; it is a folder: pass a file there")):
    result = run_compare(runs["fp32"], runs["bf16"], "--png_path=" + path, cwd=str(tmp_path))
    assert result.returncode == 2, result.stdout
    assert result.stderr == "compare: error: %s\n" % message
  assert sorted(os.listdir(str(tmp_path))) == ["mine.png", "taken.png"]
  assert (tmp_path / "mine.png").read_text() == "a picture of the user's"
  for _ in range(2):  # its own picture, drawn again
    result = run_compare(runs["fp32"], runs["bf16"], "--png_path=c.SVG", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "compare: c.SVG"
  assert open(str(tmp_path / "c.SVG")).read().lstrip().startswith("<?xml")


def test_a_log_cut_after_some_steps_is_compared_up_to_there(runs, tmp_path):
  cut = tmp_path / "cut"
  shutil.copytree(runs["bf16"], str(cut))
  with open(os.path.join(runs["bf16"], "dllog.json")) as f:
    lines = f.read().splitlines(True)
  steps = [i for i, line in enumerate(lines) if '"type": "train"' in line]
  # Killed while writing its third display step's record.
  (cut / "dllog.json").write_text("".join(lines[:steps[2]]) + lines[steps[2]][:30])
  result = run_compare(runs["fp32"], str(cut), "--png_path=" + str(tmp_path / "c.png"))
  assert result.returncode == 0, result.stderr
  assert ("compare: note: cut: line %d of its dllog.json is cut short (a killed run?)"
          % (steps[2] + 1)) in result.stdout
  assert "never, to step 4 (" in table_row(result.stdout, "cut")
  # Without its summary, its speed is its display windows' median, and says so.
  assert " (median window) " in table_row(result.stdout, "cut")
  assert " (median window) " not in table_row(result.stdout, "fp32")


def test_a_run_of_warm_up_updates_alone_shows_its_speed_with_the_overhead_in(runs, tmp_path):
  short = tmp_path / "short"
  shutil.copytree(runs["bf16"], str(short))
  with open(os.path.join(runs["bf16"], "dllog.json")) as f:
    records = [json.loads(line) for line in f]
  for record in records:  # as a run whose updates were all within --fps_warmup_steps
    if record["type"] == "summary":
      record.update(steady_time_s=0.0, steady_sentences=0)
  (short / "dllog.json").write_text("".join(json.dumps(r) + "\n" for r in records))
  result = run_compare(runs["fp32"], str(short), "--png_path=" + str(tmp_path / "c.png"))
  assert result.returncode == 0, result.stderr
  summary = [r for r in records if r["type"] == "summary"][-1]
  assert " %.2f (with overhead) " % summary["throughput"] in table_row(result.stdout, "short")


def _packed_log(folder, last_step, per_update, skipped=None):
  """A dllog.json of a packed run as RunLogger writes it: samples rounded each step; with
  skipped, a float16 run's, whose samples count the updates loss scaling skipped."""
  os.makedirs(str(folder))
  with open(str(folder / "dllog.json"), "w") as f:
    for step in range(10, last_step + 1, 10):
      record = {"type": "train", "step": step, "total_loss": 7.0, "learning_rate": 1e-3,
                "samples": round((step + (skipped or 0)) * per_update)}
      if skipped is not None:
        record.update(loss_scale=2.0 ** 15, skipped_steps=skipped)
      f.write(json.dumps(record) + "\n")
  return compare.Run(str(folder), folder.name)


def test_a_float16_run_that_skipped_updates_compares_with_one_that_skipped_none(tmp_path):
  # 6 updates skipped at the start: step 100 logs (100 + 6) x 8 samples read.
  reference = _packed_log(tmp_path / "reference", 100, 8)
  assert compare.settings_differ(_packed_log(tmp_path / "fp16", 100, 8, skipped=6),
                                 reference) == ""
  assert compare.settings_differ(_packed_log(tmp_path / "other", 100, 9, skipped=6),
                                 reference) == "samples per update 9 vs 8"


def test_packed_runs_of_one_global_batch_compare_though_they_stopped_at_other_steps(
    tmp_path):
  # 8 packs of 1.999 sentences: step 100 logs 1599 samples (15.99 a step), step 90 1439.
  reference = _packed_log(tmp_path / "reference", 100, 8 * 1.999)
  assert compare.settings_differ(_packed_log(tmp_path / "early", 90, 8 * 1.999),
                                 reference) == ""
  assert compare.settings_differ(_packed_log(tmp_path / "other", 90, 8 * 2.5), reference) == (
      "samples per update 20 vs 15.99")


def test_a_log_with_a_line_that_is_not_utf8_is_compared_without_it_and_named(runs, tmp_path):
  damaged = tmp_path / "damaged"
  shutil.copytree(runs["bf16"], str(damaged))
  with open(os.path.join(runs["bf16"], "dllog.json"), "rb") as f:
    lines = f.read().splitlines(True)
  steps = [i for i, line in enumerate(lines) if b'"type": "train"' in line]
  lines[steps[1]] = b"\xff" + lines[steps[1]][1:]
  with open(str(damaged / "dllog.json"), "wb") as f:
    f.write(b"".join(lines))
  result = run_compare(runs["fp32"], str(damaged), "--png_path=" + str(tmp_path / "c.png"))
  assert result.returncode == 0, result.stderr
  assert ("compare: note: %s: line %d is not UTF-8 text (damaged?) and passed over; the "
          "other records are read" % (damaged / "dllog.json", steps[1] + 1)
          ) in result.stdout.splitlines()
  assert "never, to step %d (" % STEPS in table_row(result.stdout, "damaged")
