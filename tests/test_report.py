"""The run-health warnings and the run report (report.png and its summary)."""

import json
import os
import re
import signal
import struct
import subprocess
import sys

import pytest

from bert_pretrain.training import health
from bert_pretrain.training import logs
from bert_pretrain.training import report
from conftest import ROOT


def run_report(*args):
  return subprocess.run([sys.executable, "-m", "bert_pretrain.training.report"] + list(args),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        universal_newlines=True, env=dict(os.environ, PYTHONPATH=ROOT))


def test_falling_accuracy_warns_and_rising_accuracy_does_not():
  monitor = health.HealthMonitor(accuracy_drop=0.002)
  assert monitor.evaluation(100, 0.30) == []
  assert monitor.evaluation(200, 0.35) == []
  assert monitor.evaluation(300, 0.349) == []  # within the tolerance
  warnings = monitor.evaluation(400, 0.31)
  assert len(warnings) == 1
  assert "fell from 0.3490 to 0.3100 at step 400" in warnings[0]


def test_a_window_far_below_the_median_throughput_warns():
  monitor = health.HealthMonitor(fps_drop=0.5, min_windows=3)
  for step, fps in ((10, 30.0), (20, 100.0), (30, 102.0), (40, 98.0), (50, 60.0)):
    assert monitor.window(step, fps, 10, seconds=5.0) == []
  warnings = monitor.window(60, 40.0, 10, seconds=5.0)
  assert len(warnings) == 1 and "fell to 40.00 sentences/s at step 60" in warnings[0]


def test_short_windows_are_judged_together_so_one_slow_blip_does_not_warn():
  # Windows of 0.1 s: one at a tenth of the speed (a collection, a page fault) is jitter;
  # 2 s of them at a third of the speed are a fall.
  monitor = health.HealthMonitor(fps_drop=0.5, min_windows=3, min_span_s=2.0)
  warnings = []
  for step in range(1, 101):
    warnings += monitor.window(step, 10.0 if step % 25 == 0 else 100.0, 1, seconds=0.1)
  assert warnings == []
  for step in range(101, 121):
    warnings += monitor.window(step, 30.0, 1, seconds=0.1)
  assert len(warnings) == 1 and "fell to 30.00 sentences/s at step 120" in warnings[0]


def test_slow_first_windows_do_not_warn():
  monitor = health.HealthMonitor(fps_drop=0.5, min_windows=3)
  for step, fps in ((10, 100.0), (20, 10.0), (30, 100.0)):
    assert monitor.window(step, fps, 10, seconds=5.0) == []


def test_a_loss_scale_that_keeps_falling_warns():
  monitor = health.HealthMonitor(scale_windows=3)
  scales = [32768.0, 32768.0, 16384.0, 8192.0]
  for step, scale in enumerate(scales):
    assert monitor.window(step * 10, 100.0, 10, loss_scale=scale, skipped_steps=step) == []
  warnings = monitor.window(40, 100.0, 10, loss_scale=4096.0, skipped_steps=4)
  assert len(warnings) == 1 and "fell in 3 display windows in a row" in warnings[0]
  # A steady scale resets the count.
  assert monitor.window(50, 100.0, 10, loss_scale=4096.0, skipped_steps=4) == []


def test_a_window_that_skipped_more_updates_than_it_applied_warns():
  """Windows as the loop makes them: each ends at an applied update; the first, with the
  scale's fall from its initial value, does not warn."""
  monitor = health.HealthMonitor()
  assert monitor.window(1, 100.0, 16, loss_scale=2.0 ** 15, skipped_steps=15) == []
  assert monitor.window(11, 100.0, 14, loss_scale=2.0 ** 15, skipped_steps=19) == []
  warnings = monitor.window(21, 100.0, 21, loss_scale=2.0 ** 14, skipped_steps=30)
  assert warnings == ["11 of the 21 updates up to step 21 were skipped (non-finite "
                      "gradients): the weights train on fewer than half the batches; lower "
                      "--learning_rate or check the data"]


def test_the_slowest_rank_is_named_when_it_lags():
  monitor = health.HealthMonitor(lag=1.3)
  assert monitor.rank_step_times(10, [0.50, 0.52, 0.51, 0.55]) == []
  warnings = monitor.rank_step_times(20, [0.50, 0.52, 0.90, 0.51])
  assert len(warnings) == 1 and warnings[0].startswith("rank 2 is slow: 0.900 s")
  assert monitor.rank_step_times(30, [0.5]) == []
  # Short steps are noisy: 30% slower but by less than min_lag_s says nothing.
  assert monitor.rank_step_times(40, [0.010, 0.009, 0.013]) == []


def _write_log(path, resumed=False):
  """A dllog.json as RunLogger writes it: two runs, the second resumed at step 20."""
  logger = logs.RunLogger(dllog_path=str(path))
  logger.metrics(0, {"masked_lm_accuracy": 0.001, "samples": 0}, prefix="eval")
  for step, loss, fps in ((10, 8.0, 100.0), (20, 7.5, 110.0), (30, 7.2, 105.0)):
    logger.metrics(step, {"total_loss": loss, "mlm_loss": loss - 0.7, "nsp_loss": 0.7,
                          "learning_rate": 1e-3, "throughput_train": fps,
                          "samples": step * 32, "loss_scale": 1024.0}, prefix="train")
  logger.metrics(30, {"masked_lm_accuracy": 0.05, "samples": 30 * 32}, prefix="eval")
  logger.warning(30, "throughput fell to 1.00 sentences/s at step 30")
  logger.metrics(30, {"throughput": 104.0, "steady_sentences": 2080.0, "steady_time_s": 20.0},
                 prefix="summary")
  logger.close()
  if resumed:
    logger = logs.RunLogger(dllog_path=str(path))
    # The resumed run redoes step 30 with another loss.
    logger.metrics(30, {"total_loss": 7.1, "throughput_train": 90.0, "samples": 30 * 32},
                   prefix="train")
    logger.metrics(40, {"total_loss": 6.9, "throughput_train": 95.0, "samples": 40 * 32},
                   prefix="train")
    logger.metrics(40, {"masked_lm_accuracy": 0.08, "samples": 40 * 32}, prefix="eval")
    logger.metrics(40, {"throughput": 93.0, "steady_sentences": 320.0,
                        "steady_time_s": 320 / 93.0}, prefix="summary")
    logger.close()
  with open(str(path), "a") as f:
    f.write('{"type": "train", "step": 5')  # a line cut short by a kill


def test_the_summary_gives_the_run_history_with_a_resume_counted_once(tmp_path):
  _write_log(tmp_path / "dllog.json", resumed=True)
  summary = report.summarize(report.read_records(str(tmp_path / "dllog.json")))
  assert summary["last_step"] == 40 and summary["samples"] == 40 * 32
  assert summary["first_loss"] == 8.0 and summary["last_loss"] == 6.9
  assert (summary["first_accuracy"], summary["last_accuracy"]) == (0.001, 0.08)
  assert summary["evaluations"] == 3 and summary["runs"] == 2
  # Windows 10, 20, 30 (redone: 90) and 40.
  assert summary["median_fps"] == pytest.approx((95.0 + 100.0) / 2)
  # The parts' steady sentences over their steady time, not the last part's figure.
  assert summary["throughput"] == pytest.approx((2080 + 320) / (20 + 320 / 93.0))
  assert summary["warnings"] == ["throughput fell to 1.00 sentences/s at step 30"]
  text = "\n".join(report.format_summary(summary))
  assert "masked-LM accuracy: 0.0010 -> 0.0800 (best 0.0800, 3 evaluations)" in text
  one = dict(summary, first_accuracy=0.08, evaluations=1)
  assert ("masked-LM accuracy: 0.0800 -> 0.0800 (best 0.0800, 1 evaluation)"
          in report.format_summary(one))


def test_a_run_stopped_between_two_log_lines_is_counted_to_the_step_it_saved(tmp_path):
  # SIGTERM after update 34 of a run logging every 10: its summary has the last step.
  logger = logs.RunLogger(dllog_path=str(tmp_path / "dllog.json"))
  for step in (10, 20, 30):
    logger.metrics(step, {"total_loss": 7.0, "throughput_train": 100.0,
                          "samples": step * 32}, prefix="train")
  logger.metrics(34, {"samples": 34 * 32, "training_sentences": 34 * 32,
                      "throughput": 100.0}, prefix="summary")
  logger.close()
  summary = report.summarize(report.read_records(str(tmp_path / "dllog.json")))
  assert "updates: 34, training samples: 1088, runs logged: 1" in report.format_summary(
      summary)


def test_a_part_that_ended_before_its_summary_is_named_last_or_earlier():
  started = {"type": "device", "device": "CPU, 2 cores, compute float32"}
  finished = {"type": "summary", "step": 30, "throughput": 104.0, "steady_sentences": 2080.0,
              "steady_time_s": 20.0}
  trained = {"type": "train", "step": 40, "total_loss": 7.0, "throughput_train": 100.0}
  killed = [started, trained]  # kill -9 (or an error) before the summary
  for parts, last_open, earlier in (([started, finished], False, 0),
                                    ([started, finished] + killed, True, 0),
                                    (killed + [started, finished], False, 1),
                                    (killed + killed + [started, trained], True, 2)):
    summary = report.summarize(parts)
    assert (summary["last_part_open"], summary["parts_ended_early"]) == (last_open, earlier)
    text = "\n".join(report.format_summary(summary))
    assert ("the last part has no summary: it is still running, or it ended early" in
            text) == last_open
    assert ("%d earlier part%s ended early, without a summary"
            % (earlier, "" if earlier == 1 else "s") in text) == bool(earlier)
  # A log of a recipe version that wrote no device record names no part.
  assert report.summarize([trained])["last_part_open"] is False
  # A part that ended at once says how (logs.end_open_runs), last or earlier.
  stopped = [started, {"type": "ended", "how": "SIGTERM before training started: exiting "
                                               "(nothing to save)"}]
  summary = report.summarize([started, finished] + stopped)
  assert (summary["last_part_open"], summary["parts_ended_early"]) == (True, 0)
  assert ("the last part ended without a summary: SIGTERM before training started: exiting "
          "(nothing to save)") in report.format_summary(summary)
  summary = report.summarize(stopped + [started, finished])
  assert summary["parts_ended_early"] == 1
  assert ("1 earlier part ended early, without a summary (SIGTERM before training started: "
          "exiting (nothing to save)): not in the steady-state average"
          ) in report.format_summary(summary)


def test_an_evaluation_only_pass_on_a_run_folder_does_not_rewrite_its_history():
  """run_pretraining --nodo_train on a run's folder evaluates its checkpoint again, maybe
  in another compute type: the run's own evaluation at that step and its device stay."""
  records = [{"type": "device", "compute_type": "bfloat16"},
             {"type": "train", "step": 500, "total_loss": 6.0},
             {"type": "eval", "step": 500, "masked_lm_accuracy": 0.0917},
             {"type": "summary", "step": 500, "throughput": 300.0},
             {"type": "device", "compute_type": "float32"},  # the evaluation-only pass
             {"type": "eval", "step": 500, "masked_lm_accuracy": 0.0914},
             {"type": "summary", "step": 500}]
  summary = report.summarize(records)
  assert (summary["last_accuracy"], summary["best_accuracy"]) == (0.0917, 0.0917)
  assert report.training_device(records)["compute_type"] == "bfloat16"
  # A part stopped before its first log line trained too: it has a summary with its figure.
  stopped = records[:4] + [{"type": "device", "compute_type": "float32"},
                           {"type": "summary", "step": 502, "throughput": 10.0}]
  assert report.training_device(stopped)["compute_type"] == "float32"
  # A resumed training part's evaluation at the same step is the history's.
  resumed = records[:4] + [dict(records[0]), {"type": "eval", "step": 500,
                                               "masked_lm_accuracy": 0.0918},
                           {"type": "train", "step": 510, "total_loss": 5.9}]
  assert report.summarize(resumed)["last_accuracy"] == 0.0918


def test_a_part_too_short_for_a_steady_figure_leaves_the_throughput_to_the_others():
  parts = [{"type": "summary", "step": 30, "throughput": 104.0, "steady_sentences": 2080.0,
            "steady_time_s": 20.0},
           # Resumed for 2 updates, both warm-up: its figure has the overhead in.
           {"type": "summary", "step": 32, "throughput": 11.95, "steady_sentences": 0,
            "steady_time_s": 0.0},
           {"type": "summary", "step": 32}]  # resumed once more, with nothing to train
  assert report.summarize(parts)["throughput"] == 104.0
  assert "steady-state average 104.00" in report.format_summary(report.summarize(parts))[3]
  # A run of warm-up updates alone says its figure has the overhead in, also after a part
  # of a log that did not record its steady time; a log that trained nothing, nothing.
  for log in (parts[1:], [{"type": "summary", "step": 30, "throughput": 104.0}] + parts[1:]):
    assert report.format_summary(report.summarize(log))[3].endswith(
        "; average with overhead (no update past the warm-up) 11.95")
  assert report.format_summary(report.summarize([parts[2]]))[3].endswith(
      "; steady-state average n/a")
  # A log with a part written before the parts' steady sentences and time were: the
  # last figure, as then.
  assert report.summarize([{"type": "summary", "step": 30, "throughput": 104.0},
                           {"type": "summary", "step": 32, "throughput": 11.95}])[
                               "throughput"] == 11.95
  assert report.summarize([{"type": "summary", "step": 30, "throughput": 104.0},
                           dict(parts[0], step=40, throughput=93.0)])["throughput"] == 93.0


def _png_size(path):
  with open(path, "rb") as f:
    header = f.read(24)
  assert header[:8] == b"\x89PNG\r\n\x1a\n"
  return struct.unpack(">II", header[16:24])


def test_the_report_command_draws_the_picture_and_prints_the_summary(tmp_path):
  pytest.importorskip("matplotlib", reason="init_tf.sh installs matplotlib")
  _write_log(tmp_path / "dllog.json")
  result = run_report(str(tmp_path))
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert "report: updates: 30, training samples: 960, runs logged: 1" in out
  assert "report: warnings: 1" in out
  width, height = _png_size(str(tmp_path / "report.png"))
  assert (width, height) == (960, 640)


@pytest.mark.parametrize("buffered", [True, False])
def test_a_reader_gone_before_the_report_writes_ends_it_without_a_traceback(tmp_path,
                                                                             buffered):
  _write_log(tmp_path / "dllog.json")
  # `report DIR | true`: the pipe's reader is gone; buffered, the write fails at the flush.
  reader, writer = os.pipe()
  os.close(reader)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
  if not buffered:
    env["PYTHONUNBUFFERED"] = "1"
  result = subprocess.run([sys.executable, "-m", "bert_pretrain.training.report",
                           "--png_path=" + str(tmp_path / "r.png"), str(tmp_path)],
                          stdout=writer, stderr=subprocess.PIPE, universal_newlines=True,
                          env=dict(env, PYTHONPATH=ROOT))
  os.close(writer)
  assert (result.returncode, result.stderr) == (128 + signal.SIGPIPE, "")


def test_a_tool_that_fails_with_its_reader_gone_still_shows_its_error():
  failing = ("from bert_pretrain import errors\n"
             "def main(argv):\n"
             "  print('a line')\n"
             "  raise RuntimeError('the real failure')\n"
             "errors.run_main('tool', main)\n")
  reader, writer = os.pipe()
  os.close(reader)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # the line waits
  result = subprocess.run([sys.executable, "-c", failing], stdout=writer,
                          stderr=subprocess.PIPE, universal_newlines=True,
                          env=dict(env, PYTHONPATH=ROOT))
  os.close(writer)
  assert result.returncode != 128 + signal.SIGPIPE, result.stderr
  assert "RuntimeError: the real failure" in result.stderr, result.stderr


def test_a_missing_or_foreign_log_is_a_one_line_error(tmp_path):
  result = run_report(str(tmp_path))
  assert result.returncode == 2
  assert result.stderr.count("\n") == 1 and "dllog.json does not exist" in result.stderr
  (tmp_path / "dllog.json").write_text(json.dumps([1, 2]) + "\nnot json\n")
  result = run_report(str(tmp_path))
  assert result.returncode == 2 and "holds no log records" in result.stderr


def test_a_line_that_is_not_utf8_is_passed_over_with_a_note_naming_the_file_and_line(
    tmp_path):
  _write_log(tmp_path / "dllog.json")
  with open(str(tmp_path / "dllog.json"), "rb") as f:
    lines = f.read().splitlines(True)
  # A damaged block inside the second training record.
  lines[2] = lines[2][:20] + b"\xff\xfe" + lines[2][22:]
  with open(str(tmp_path / "dllog.json"), "wb") as f:
    f.write(b"".join(lines))
  result = run_report(str(tmp_path), "--png_path=" + str(tmp_path / "r.png"))
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines()[0] == (
      "report: note: %s: line 3 is not UTF-8 text (damaged?) and passed over; the other "
      "records are read" % (tmp_path / "dllog.json"))
  # Steps 10 and 30 of the three; the cut last line is passed over without a note.
  assert "report: updates: 30, training samples: 960, runs logged: 1" in result.stdout
  skipped = []
  records = report.read_records(str(tmp_path / "dllog.json"), skipped)
  assert [r["step"] for r in records if r["type"] == "train"] == [10, 30]
  assert skipped == [(3, report.NOT_TEXT), (len(lines), report.CUT_SHORT)]


def test_every_run_ends_with_its_report(pretraining_data, tmp_path):
  pytest.importorskip("matplotlib", reason="init_tf.sh installs matplotlib")
  from conftest import base_flags, run_pretraining
  out = tmp_path / "out"
  flags = base_flags(pretraining_data, out, num_train_steps=6, display_loss_steps=2,
                     eval_at_start=None)
  result = run_pretraining(*[f for f in flags if f != "--nodraw_report"])
  assert result.returncode == 0, result.stderr
  assert "report: updates: 6, training samples: 48, runs logged: 1" in result.stdout
  assert "no summary" not in result.stdout  # the report is drawn after the summary
  assert "report: %s" % (out / "report.png") in result.stdout
  assert _png_size(str(out / "report.png")) == (960, 640)
  records = report.read_records(str(out / "dllog.json"))
  train = [r for r in records if r["type"] == "train"]
  assert [(r["step"], r["samples"]) for r in train] == [(2, 16), (4, 32), (6, 48)]
  assert [r["samples"] for r in records if r["type"] == "eval"] == [0, 48]
  assert [(r["step"], r["samples"]) for r in records if r["type"] == "summary"] == [(6, 48)]


def test_a_resumed_runs_report_gives_the_steady_throughput_of_all_its_parts(pretraining_data,
                                                                            tmp_path):
  """A run of 8 updates, then the same command resumed to 10: the second part's 2 updates
  are all warm-up, so its figure has the overhead in; the report's steady-state average is
  still the first part's."""
  pytest.importorskip("matplotlib", reason="init_tf.sh installs matplotlib")
  from conftest import base_flags, run_pretraining
  out = tmp_path / "out"
  steady, saved = [], []
  for steps in (8, 10):
    flags = base_flags(pretraining_data, out, num_train_steps=steps, display_loss_steps=2,
                       fps_warmup_steps=2, nodo_eval=None)
    result = run_pretraining(*[f for f in flags if f != "--nodraw_report"])
    assert result.returncode == 0, result.stderr
    steady.append(float(re.search(r"^Throughput Average \(sentences/sec\) = ([\d.]+) ",
                                  result.stdout, re.M).group(1)))
    saved.append(float(re.search(r"checkpoint time: ([\d.]+) s", result.stdout).group(1)))
  assert "no update is left once the 2 warm-up steps" in result.stdout
  assert "report: updates: 10, training samples: 80, runs logged: 2" in result.stdout
  assert "no summary" not in result.stdout and "without a summary" not in result.stdout
  reported = float(re.search(r"steady-state average ([\d.]+)", result.stdout).group(1))
  assert reported == pytest.approx(steady[0], abs=0.01) and reported != steady[1], steady
  # Each part saved once, at its end (every 100 updates otherwise): that time is counted.
  assert all(seconds > 0 for seconds in saved), saved
