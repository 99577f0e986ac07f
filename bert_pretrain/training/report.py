"""The run report: report.png and a short summary, drawn from a run's dllog.json.

  python3 -m bert_pretrain.training.report OUTPUT_DIR

report.png has four panels against training samples: the losses (total, masked LM,
next sentence), masked-LM accuracy at each evaluation, sentences per second of each
display window, and the learning rate (with the float16 loss scale on a second axis
where it was used). Evaluations are marked by dotted lines in every panel, warnings by
red ones. Rank 0 of every run writes it at the end; it needs matplotlib (installed by
init_tf.sh), and without it the run says how to get the picture and goes on.

A resumed run appends to the same dllog.json: the report shows the whole history, a
step logged twice (redone after a resume) once, with its latest values, and the
steady-state throughput of all the parts together.
"""

import json
import logging
import os
import shlex
import statistics

from absl import flags

from bert_pretrain import errors
from bert_pretrain.training import timing

FLAGS = flags.FLAGS


# Why read_records passes a line over: a record cut short, or bytes that are no text.
CUT_SHORT = "cut short"
NOT_TEXT = "not UTF-8 text"


def read_records(path, skipped=None):
  """Returns the JSON records of a dllog.json, in order.

  A line cut short by a killed run is passed over, and so is one that is not UTF-8
  text (a damaged disk block, bytes some other program appended): like a cut line it
  holds no record, and the records around it still tell the run.

  Args:
    path: the dllog.json.
    skipped: (optional) list to which each line passed over is appended, as (its
      number, CUT_SHORT or NOT_TEXT).

  Raises:
    ValueError: the file does not exist or holds no record.
  """
  if not os.path.isfile(path):
    raise ValueError("%s does not exist; pass the --output_dir of a run (it holds "
                     "dllog.json) or --dllog_path" % path)
  skipped = [] if skipped is None else skipped
  records = []
  with open(path, "rb") as f:
    for number, line in enumerate(f, 1):
      try:
        record = json.loads(line.decode("utf-8"))
      except UnicodeDecodeError:
        skipped.append((number, NOT_TEXT))
        continue
      except ValueError:
        if line.strip():
          skipped.append((number, CUT_SHORT))
        continue
      if isinstance(record, dict) and "type" in record:
        records.append(record)
  if not records:
    raise ValueError("%s holds no log records; it is not a dllog.json of this recipe" % path)
  return records


def not_text_note(path, skipped):
  """The note on the lines of a log that are not UTF-8 text ("" when none): unlike a line
  cut by a kill, they mean damage worth a look, so the report and compare say so."""
  lines = [number for number, why in skipped if why == NOT_TEXT]
  if not lines:
    return ""
  return ("%s: %s not UTF-8 text (damaged?) and passed over; the other records are read"
          % (path, "line %d is" % lines[0] if len(lines) == 1 else
             "%d lines (the first: line %d) are" % (len(lines), lines[0])))


def _parts(records):
  """Each record with the part of the run it belongs to (each start writes a device
  record), and the parts that trained: [(part, record)], set of parts."""
  part, tagged, trained = -1, [], set()
  for record in records:
    if record.get("type") == "device":
      part += 1
    elif record.get("type") == "train" or (record.get("type") == "summary" and
                                           record.get("throughput") is not None):
      trained.add(part)  # (a part stopped before its first log line has a summary only)
    tagged.append((part, record))
  return tagged, trained


def _series(records, kind):
  """Records of one type, one per step (the last logged), ordered by step; a part that
  trained nothing (an evaluation of the run's checkpoint, maybe in another compute type)
  does not replace a training part's."""
  tagged, trained = _parts(records)
  by_step = {}
  for part, record in tagged:
    if record.get("type") == kind and "step" in record:
      earlier = by_step.get(record["step"])
      if earlier is None or part in trained or earlier[0] not in trained:
        by_step[record["step"]] = (part, record)
  return [by_step[step][1] for step in sorted(by_step)]


def training_device(records):
  """The device record of the last part that trained (else the last one; None without)."""
  tagged, trained = _parts(records)
  devices = [(part, r) for part, r in tagged if r.get("type") == "device"]
  chosen = [r for part, r in devices if part in trained] or [r for _, r in devices]
  return chosen[-1] if chosen else None


def _samples(record):
  """Training samples at a record: logged by the run, else its step."""
  return record.get("samples", record["step"])


def parts_finished(records):
  """For each part of the run (each start writes a device record, a resume too), whether
  it wrote its summary: one still running has not, nor one that ended early (an error
  after its start, kill -9, the OOM killer, a stop before training or at a second Ctrl-C,
  a stalled rank). Returns a list of True, or for a part without a summary, how it
  ended when it said (logs.end_open_runs), else False."""
  tagged, _ = _parts(records)
  finished = [False] * (tagged[-1][0] + 1 if tagged else 0)
  for part, record in tagged:
    if part >= 0 and record.get("type") in ("summary", "ended") and finished[part] is not True:
      finished[part] = True if record["type"] == "summary" else record.get("how") or False
  return finished


def summarize(records):
  """Returns a dict of the run's headline numbers (None where the log has none)."""
  train = _series(records, "train")
  evals = _series(records, "eval")
  summaries = [r for r in records if r.get("type") == "summary"]
  trained = [r for r in summaries if "throughput" in r]
  warnings = [r for r in records if r.get("type") == "warning"]
  accuracies = [r["masked_lm_accuracy"] for r in evals if "masked_lm_accuracy" in r]
  fps = [r["throughput_train"] for r in train if "throughput_train" in r]
  finished = parts_finished(records)
  throughput, steady = steady_throughput(trained)
  return {
      # A run stopped between log lines has its last step in its summary alone.
      "last_step": max([r["step"] for r in train + evals + summaries] or [0]),
      "samples": max([r["samples"] for r in train + evals + summaries if "samples" in r]
                     or [None]),
      "first_loss": train[0]["total_loss"] if train else None,
      "last_loss": train[-1]["total_loss"] if train else None,
      "first_accuracy": accuracies[0] if accuracies else None,
      "last_accuracy": accuracies[-1] if accuracies else None,
      "best_accuracy": max(accuracies) if accuracies else None,
      "evaluations": len(accuracies),
      "median_fps": statistics.median(fps) if fps else None,
      "min_fps": min(fps) if fps else None,
      "max_fps": max(fps) if fps else None,
      "throughput": throughput,
      "steady": steady,  # else the throughput has the overhead in
      "where": where_time_went(trained[-1]) if trained else None,
      "runs": len(summaries),
      "parts_ended_early": sum(part is not True for part in finished[:-1]),
      # How those said they ended (logs.end_open_runs), each once.
      "earlier_parts_ended": sorted(set(part for part in finished[:-1]
                                        if part not in (True, False))),
      "last_part_open": bool(finished) and finished[-1] is not True,
      # How the last part ended without its summary, when it said.
      "last_part_ended": finished[-1] if finished and finished[-1] not in (True, False)
                         else None,
      "warnings": [r.get("message", "") for r in warnings],
  }


def steady_throughput(summaries):
  """The steady-state sentences/s of a run from its summary records, one per part (a
  resumed run appends one each time; a part that trained nothing, a finished run resumed,
  has no throughput): the parts' steady sentences over their steady time, so a short
  last part does not stand for the whole run. Without a part long enough for a steady
  figure, or from a log in which a part lacks its sentences and time (written before
  they were): the last part's. Returns (the figure or None, whether it is steady: a
  part's with updates past the warm-up, or one of a log that does not say)."""
  measured = [r for r in summaries if "throughput" in r]
  steady = [r for r in measured if r.get("steady_time_s")]
  if steady and all("steady_time_s" in r for r in measured):
    return (sum(r["steady_sentences"] for r in steady) /
            sum(r["steady_time_s"] for r in steady)), True
  if not summaries:
    return None, True
  return summaries[-1]["throughput"], summaries[-1].get("steady_time_s", 1) > 0


def where_time_went(record):
  """A summary record's padding share, update time split and MFU as one line ("" when
  the run logged none of them)."""
  parts = []
  if record.get("padding_share") is not None:
    parts.append("padding %.1f%% of the positions" % (100 * record["padding_share"]))
  if record.get("time_input_share") is not None:
    shares = {part: record.get("time_%s_share" % part) for part in timing.SHARES}
    parts.append("update time: " + timing.format_shares(shares, record.get("ranks", 1)))
  if record.get("mfu") is not None:
    parts.append("MFU %.1f%% of %.3g TFLOPS a card" % (100 * record["mfu"],
                                                      record["peak_tflops"]))
  return "; ".join(parts)


def format_summary(summary):
  """The summary as a few lines of text."""
  number = lambda v, fmt: "n/a" if v is None else fmt % v
  lines = [
      "updates: %d, training samples: %s, runs logged: %d"
      % (summary["last_step"], number(summary["samples"], "%d"), summary["runs"]),
      "total loss: %s -> %s" % (number(summary["first_loss"], "%.4f"),
                                number(summary["last_loss"], "%.4f")),
      "masked-LM accuracy: %s -> %s (best %s, %d evaluation%s)"
      % (number(summary["first_accuracy"], "%.4f"), number(summary["last_accuracy"], "%.4f"),
         number(summary["best_accuracy"], "%.4f"), summary["evaluations"],
         "" if summary["evaluations"] == 1 else "s"),
      "sentences/s per window: median %s (min %s, max %s); %s %s"
      % (number(summary["median_fps"], "%.2f"), number(summary["min_fps"], "%.2f"),
         number(summary["max_fps"], "%.2f"),
         "steady-state average" if summary.get("steady", True) else
         "average with overhead (no update past the warm-up)",
         number(summary["throughput"], "%.2f")),
  ]
  if summary.get("last_part_ended"):
    lines.append("the last part ended without a summary: %s"
                 % summary["last_part_ended"])
  elif summary.get("last_part_open"):
    lines.append("the last part has no summary: it is still running, or it ended early (an "
                 "error: see its console output; the OOM killer: see dmesg; or kill -9); "
                 "the figures above are from its lines so far")
  if summary.get("parts_ended_early"):
    hows = summary.get("earlier_parts_ended")
    lines.append("%d earlier part%s ended early, without a summary%s: not in the "
                 "steady-state average" % (
                     summary["parts_ended_early"],
                     "" if summary["parts_ended_early"] == 1 else "s",
                     " (%s)" % "; ".join(hows) if hows else ""))
  if summary.get("where"):
    lines.append("where the time went: " + summary["where"])
  lines.append("warnings: %d" % len(summary["warnings"]))
  lines.extend("  " + message for message in summary["warnings"])
  return lines


def draw(records, png_path, title=None):
  """Draws the report's four panels into png_path.

  Raises:
    ImportError: matplotlib is not installed.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  logging.getLogger("matplotlib").setLevel(logging.WARNING)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  train = _series(records, "train")
  evals = [r for r in _series(records, "eval") if "masked_lm_accuracy" in r]
  warnings = [r for r in records if r.get("type") == "warning" and "step" in r]
  x_label = "training samples" if any("samples" in r for r in train + evals) else "step"
  x = lambda rows: [_samples(r) for r in rows]

  figure, axes = plt.subplots(2, 2, figsize=(12, 8))
  (loss_ax, acc_ax), (fps_ax, lr_ax) = axes
  for name, style in (("total_loss", "-"), ("mlm_loss", "--"), ("nsp_loss", ":")):
    rows = [r for r in train if name in r]
    if rows:
      loss_ax.plot(x(rows), [r[name] for r in rows], style, label=name)
  loss_ax.set_title("training loss")
  acc_ax.plot(x(evals), [r["masked_lm_accuracy"] for r in evals], "o-", color="tab:green")
  for r in evals:
    acc_ax.annotate("%.3f" % r["masked_lm_accuracy"], (_samples(r), r["masked_lm_accuracy"]),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
  acc_ax.set_title("masked-LM accuracy (evaluations)")
  rows = [r for r in train if "throughput_train" in r]
  fps_ax.plot(x(rows), [r["throughput_train"] for r in rows], ".-", color="tab:purple")
  if rows:
    median = statistics.median(r["throughput_train"] for r in rows)
    fps_ax.axhline(median, color="grey", linewidth=0.8, label="median %.2f" % median)
  fps_ax.set_title("sentences per second (each display window, all cards)")
  fps_ax.set_ylim(bottom=0)
  rows = [r for r in train if "learning_rate" in r]
  lr_ax.plot(x(rows), [r["learning_rate"] for r in rows], color="tab:orange",
             label="learning rate")
  lr_ax.set_title("learning rate")
  scaled = [r for r in train if "loss_scale" in r]
  if scaled:
    scale_ax = lr_ax.twinx()
    scale_ax.plot(x(scaled), [r["loss_scale"] for r in scaled], color="tab:red",
                  label="loss scale")
    scale_ax.set_yscale("log", base=2)
    scale_ax.set_ylabel("loss scale")
    lr_ax.set_title("learning rate and loss scale")
  for ax in (loss_ax, acc_ax, fps_ax, lr_ax):
    for r in evals:
      ax.axvline(_samples(r), color="grey", linestyle=":", linewidth=0.6)
    for r in warnings:
      ax.axvline(_samples(r), color="red", linestyle="--", linewidth=0.8)
    ax.set_xlabel(x_label)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  where = summarize(records)["where"]
  figure.suptitle((title or "BERT pretraining run") + ("\n" + where if where else ""))
  figure.tight_layout()
  figure.savefig(png_path, dpi=80)
  plt.close(figure)


def write_report(output_dir, dllog_path=None, png_path=None, log=print, picture=True):
  """Prints the summary and draws report.png; what the end of every run calls.

  Args:
    picture: False prints the summary only (matplotlib's import and the drawing take
      about 1.5 s).

  Returns:
    The path of the picture, or None when not drawn: picture=False, or matplotlib is
    missing (the log says how to get it and how to draw the picture later).
  """
  dllog_path = dllog_path or os.path.join(output_dir, "dllog.json")
  png_path = png_path or os.path.join(output_dir, "report.png")
  skipped = []
  records = read_records(dllog_path, skipped)
  note = not_text_note(dllog_path, skipped)
  if note:
    log("report: note: " + note)
  for line in format_summary(summarize(records)):
    log("report: " + line)
  if not picture:
    log("report: no picture (--nodraw_report); python3 -m bert_pretrain.training.report %s draws it"
        % shlex.quote(output_dir))
    return None
  try:
    draw(records, png_path, title=os.path.basename(os.path.abspath(output_dir)))
  except ImportError:
    log("report: matplotlib is not installed, so no report.png; pip install matplotlib (or "
        "bash init_tf.sh), then python3 -m bert_pretrain.training.report %s"
        % shlex.quote(output_dir))
    return None
  log("report: %s" % png_path)
  return png_path


def main(argv):
  if len(argv) != 2:
    errors.usage_error("report", "give one run folder: python3 -m "
                       "bert_pretrain.training.report OUTPUT_DIR")
  try:
    write_report(argv[1], FLAGS.dllog_path, FLAGS.png_path)
  except ValueError as e:
    errors.print_error("report", e)
    return 2
  return 0


if __name__ == "__main__":
  # Defined here, not on import: run_pretraining imports this module and has a
  # --dllog_path of its own.
  flags.DEFINE_string("dllog_path", None, "dllog.json to read (default: "
                      "OUTPUT_DIR/dllog.json).")
  flags.DEFINE_string("png_path", None, "Picture to write (default: OUTPUT_DIR/report.png).")
  errors.run_main("report", main)
