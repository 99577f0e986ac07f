"""Runs side by side: the loss, masked-LM accuracy, learning rate and throughput of
several runs in one picture and one table, read from their dllog.json.

  python3 -m bert_pretrain.compare RUN_DIR RUN_DIR ... [--png_path=compare.png] [--band=0.001]

The first run is the reference. For each run the table gives its compute type, updates
and samples, first and last total loss, last and best masked-LM accuracy, steady-state
sentences/s (or, marked, its average with the overhead when no update was past the
warm-up, or its median display window's when it has no summary) and its ratio to the
reference's, and the first step at which its total loss leaves the band around the
reference's.

The band is +-`band` x the reference's total loss at the same step (default 0.1%). It is
not derived from the loss's own noise between display steps (percents): runs of the
same seed and data train on the same batches, so that noise is common to both, and what
differs is only their weights. float32 and bfloat16 runs of the demo with one seed stayed
within a hundredth of a percent of each other for its 500 updates, while a run of
another seed is a few tenths of a percent off from its first step. So inside the band
the runs follow one trajectory; the step where a run leaves it is where they part (a
NaN is always outside), and how far off it is there tells rounding that has grown over
many updates from a run that trains worse. The comparison is made at the steps both
runs logged, and only for runs whose logged settings agree with the reference's
(samples per update, learning rate at each step); the seed and the training files are
read from each run's bert_pretrain_run.json and the last line names a run that differs,
the initial weights are assumed the same, and the table says so when the losses differ
from the first common step on. (TensorFlow 1.15 draws other dropout masks
in a graph of another compute type, seed or not: there only a dropout-free config keeps
float32 and mixed-precision runs on one trajectory.)

compare.png (--png_path: a .png, .svg or .pdf) has six panels against training samples:
total loss; its difference to the reference's, with the band; masked-LM accuracy at the
evaluations; sentences/s of each display window; the learning rate (and the float16 loss
scale); each run's sentences/s of the table with its ratio to the reference's. A run's
own report.png (python3 -m bert_pretrain.training.report) is not touched.
"""

import json
import logging
import math
import os

from absl import flags

from bert_pretrain import config
from bert_pretrain import errors
from bert_pretrain.training import report

flags.DEFINE_string("png_path", "compare.png", "The picture to write: .png, .svg or .pdf.")
flags.DEFINE_float("band", 0.001, "Half-width of the band around the reference's total "
                   "loss, as a fraction of it.")
FLAGS = flags.FLAGS

# What --png_path may end with: matplotlib writes more, but would add .png to a name
# without one of its endings, and refuse others only after the table was printed.
PICTURE_FORMATS = (".png", ".svg", ".pdf")
# Written into the picture's metadata: a file at --png_path without it is not written over.
PICTURE_CREATOR = "bert_pretrain.compare"


def settings_line(runs):
  """What the runs' records (the run marker beside their checkpoints) say of the seed and
  data the band assumes the reference's."""
  reference = runs[0]
  if not all(run.record for run in runs):
    return ("compare: the band assumes the same --seed, data and initial weights as the "
            "reference (%s); a run without its bert_pretrain_run.json does not say"
            % reference.name)
  other = []
  for run in runs[1:]:
    why = [("--seed=%s" % run.record.get("seed")) if run.record.get("seed") !=
           reference.record.get("seed") else None,
           "other training files" if run.record.get("train_files") !=
           reference.record.get("train_files") else None]
    if any(why):
      other.append("%s has %s" % (run.name, " and ".join(w for w in why if w)))
  if other:
    return ("compare: the band assumes the reference's --seed=%s and training files: %s"
            % (reference.record.get("seed"), "; ".join(other)))
  return ("compare: the runs have the reference's --seed=%s and training files (their "
          "bert_pretrain_run.json say); the band assumes the same initial weights too"
          % reference.record.get("seed"))


class Run(object):
  """One run's log: its folder, name, records (report.read_records), its training and
  evaluation series (one record per step), device and settings.

  Raises:
    ValueError: the folder has no dllog.json, or the log has no training step.
  """

  def __init__(self, folder, name):
    self.folder = folder
    self.name = name
    path = os.path.join(folder, "dllog.json")
    if not os.path.isdir(folder):
      raise ValueError("%s is not a folder; pass the --output_dir of each run" % folder)
    self.skipped = []
    self.records = report.read_records(path, self.skipped)
    self.cut_lines = [number for number, why in self.skipped if why == report.CUT_SHORT]
    # report's one-record-per-step series: a resumed run's redone steps count once.
    self.train = [r for r in report._series(self.records, "train")  # pylint: disable=protected-access
                  if "total_loss" in r]
    if not self.train:
      raise ValueError("%s holds no training step%s; pass runs that logged at least one "
                       "display step (--display_loss_steps)" % (
                           path, " (it is cut short at line %d)" % self.cut_lines[0]
                           if self.cut_lines else ""))
    self.evals = [r for r in report._series(self.records, "eval")  # pylint: disable=protected-access
                  if "masked_lm_accuracy" in r]
    self.summary = report.summarize(self.records)
    try:  # Plain JSON: this tool runs without TensorFlow.
      with open(os.path.join(folder, config.RUN_MARKER), encoding="utf-8") as f:
        self.record = json.load(f)
    except (EnvironmentError, ValueError):  # none or damaged: the settings are unknown
      self.record = {}
    if not isinstance(self.record, dict):
      self.record = {}
    device = report.training_device(self.records)
    self.compute = device.get("compute_type", "?") if device else "?"

  def samples(self, record):
    return report._samples(record)  # pylint: disable=protected-access

  def samples_per_step(self):
    """(training samples per update, within what): from the last logged samples, which a
    packed run rounds to a whole number (its updates count a fraction) and which count
    the updates float16's loss scaling skipped too (their batches were read); None if
    none."""
    rows = [r for r in self.train if "samples" in r and r["step"] > 0]
    if not rows:
      return None
    updates = rows[-1]["step"] + rows[-1].get("skipped_steps", 0)
    return rows[-1]["samples"] / updates, 0.5 / updates

  def throughput(self):
    """(sentences/s, what else it is than steady-state: "" or a note): the run's
    steady-state figure; without updates past the warm-up its average with the overhead
    in; without a summary (a run still going, or killed) its median display window's."""
    if self.summary["throughput"]:
      return self.summary["throughput"], "" if self.summary["steady"] else "with overhead"
    if self.summary["median_fps"]:
      return self.summary["median_fps"], "median window"
    return None, ""


def settings_differ(run, reference):
  """Why two runs cannot be compared step by step ("" when their logged settings agree):
  samples per update, the learning rate at the steps both logged."""
  ours, theirs = run.samples_per_step(), reference.samples_per_step()
  if (ours is None) != (theirs is None) or (
      ours and abs(ours[0] - theirs[0]) > ours[1] + theirs[1]):
    return "samples per update %s vs %s" % tuple(
        "%.4g" % per_step[0] if per_step else None for per_step in (ours, theirs))
  rates = {r["step"]: r["learning_rate"] for r in reference.train if "learning_rate" in r}
  for r in run.train:
    other = rates.get(r["step"])
    if other is not None and "learning_rate" in r and not math.isclose(
        r["learning_rate"], other, rel_tol=1e-5):
      return "learning rate %.3g vs %.3g at step %d" % (r["learning_rate"], other, r["step"])
  return ""


def band_exit(run, reference, band):
  """The first step both runs logged at which the run's total loss is outside
  +-band x the reference's (NaN is outside).

  Returns:
    (step or None, the last common step or None, the largest |difference| / reference's
    loss up to and with that step, or over all common steps).
  """
  losses = {r["step"]: r["total_loss"] for r in reference.train}
  last, largest = None, 0.0
  for r in run.train:
    if r["step"] not in losses:
      continue
    last = r["step"]
    share = abs(r["total_loss"] - losses[r["step"]]) / abs(losses[r["step"]])
    largest = share if math.isnan(share) else max(largest, share)
    if not share <= band:  # NaN too
      return r["step"], last, largest
  return None, last, largest


def compare_runs(runs, band):
  """The table's rows: list of dicts, one per run (the first the reference)."""
  reference = runs[0]
  rows = []
  for run in runs:
    row = {"run": run.name, "compute": run.compute, "updates": run.summary["last_step"],
           "samples": run.summary["samples"], "first_loss": run.summary["first_loss"],
           "last_loss": run.summary["last_loss"],
           "last_accuracy": run.summary["last_accuracy"],
           "best_accuracy": run.summary["best_accuracy"], "throughput": run.throughput()[0],
           "throughput_note": run.throughput()[1], "ratio": None, "left_band": None,
           "why_not": ""}
    if row["throughput"] and reference.throughput()[0]:
      row["ratio"] = row["throughput"] / reference.throughput()[0]
    if run is not reference:
      row["why_not"] = settings_differ(run, reference)
      if not row["why_not"]:
        step, last, share = band_exit(run, reference, band)
        row.update(left_band=step, last_common=last, share=share,
                   first_step=step is not None and step == min(
                       r["step"] for r in run.train if r["step"] in
                       set(x["step"] for x in reference.train)))
        if last is None:
          row["why_not"] = "no step logged by both"
    rows.append(row)
  return rows


def format_rows(rows, band):
  """The table as lines of text."""
  number = lambda v, fmt: "n/a" if v is None else fmt % v
  header = ("run", "compute", "updates", "samples", "total loss", "mlm acc last (best)",
            "sent/s", "vs ref", "left the %g%% band at" % (100 * band))
  cells = []
  for row in rows:
    if row is rows[0]:
      band_cell = "(reference)"
    elif row["why_not"]:
      band_cell = "not compared: " + row["why_not"]
    elif row["left_band"] is None:
      band_cell = "never, to step %d (at most %.3f%% off)" % (row["last_common"],
                                                              100 * row["share"])
    else:
      band_cell = "step %d (%s off)%s" % (
          row["left_band"], "NaN" if math.isnan(row["share"]) else "%.2f%%" % (
              100 * row["share"]),
          "; from the first step: not the same seed and data?" if row["first_step"] else "")
    cells.append((row["run"], row["compute"], str(row["updates"]),
                  number(row["samples"], "%d"),
                  "%s -> %s" % (number(row["first_loss"], "%.4f"),
                                number(row["last_loss"], "%.4f")),
                  "%s (%s)" % (number(row["last_accuracy"], "%.4f"),
                               number(row["best_accuracy"], "%.4f")),
                  number(row["throughput"], "%.2f") + (
                      " (%s)" % row["throughput_note"] if row["throughput_note"] else ""),
                  number(row["ratio"], "%.3fx"), band_cell))
  widths = [max(len(c[i]) for c in cells + [header]) for i in range(len(header))]
  line = lambda c: "  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip()
  return [line(header)] + [line(c) for c in cells]


def draw(runs, rows, png_path, band):
  """Draws the six panels (the module docstring) into png_path.

  Raises:
    ImportError: matplotlib is not installed.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  logging.getLogger("matplotlib").setLevel(logging.WARNING)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  figure, axes = plt.subplots(2, 3, figsize=(16, 8))
  (loss_ax, diff_ax, acc_ax), (fps_ax, lr_ax, bar_ax) = axes
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  reference = runs[0]
  reference_loss = {r["step"]: r["total_loss"] for r in reference.train}
  scale_ax = None
  for k, (run, row) in enumerate(zip(runs, rows)):
    color = colors[k % len(colors)]
    label = "%s (%s)" % (run.name, run.compute)
    x = lambda records: [run.samples(r) for r in records]  # pylint: disable=cell-var-from-loop
    loss_ax.plot(x(run.train), [r["total_loss"] for r in run.train], "-", color=color,
                 label=label)
    common = [r for r in run.train if r["step"] in reference_loss]
    if run is not reference and not row["why_not"]:
      diff_ax.plot(x(common), [r["total_loss"] - reference_loss[r["step"]] for r in common],
                   ".-", color=color, label=label)
      if row["left_band"] is not None:
        at = [run.samples(r) for r in run.train if r["step"] == row["left_band"]][0]
        diff_ax.axvline(at, color=color, linestyle="--", linewidth=1)
    acc_ax.plot(x(run.evals), [r["masked_lm_accuracy"] for r in run.evals], "o-",
                color=color, label=label)
    windows = [r for r in run.train if "throughput_train" in r]
    fps_ax.plot(x(windows), [r["throughput_train"] for r in windows], ".-", color=color,
                label=label)
    rates = [r for r in run.train if "learning_rate" in r]
    lr_ax.plot(x(rates), [r["learning_rate"] for r in rates], "-", color=color, label=label,
               linewidth=2.5 if k == 0 else 1.2)
    scaled = [r for r in run.train if "loss_scale" in r]
    if scaled:
      scale_ax = scale_ax or lr_ax.twinx()
      scale_ax.plot(x(scaled), [r["loss_scale"] for r in scaled], ":", color=color)
    bar_ax.bar(k, row["throughput"] or 0, color=color)
    if row["throughput"]:
      bar_ax.annotate("%.1f%s\n%s" % (
          row["throughput"], " (%s)" % row["throughput_note"] if row["throughput_note"]
          else "", "reference" if k == 0 else "%.3fx" % row["ratio"]),
                      (k, row["throughput"]), textcoords="offset points", xytext=(0, 3),
                      ha="center", fontsize=8)
  ref_x = [reference.samples(r) for r in reference.train]
  ref_band = [band * abs(r["total_loss"]) for r in reference.train]
  diff_ax.fill_between(ref_x, [-b for b in ref_band], ref_band, color="grey", alpha=0.2,
                       label="band: +-%g%% of the reference's loss" % (100 * band))
  diff_ax.axhline(0, color="grey", linewidth=0.8)
  if scale_ax is not None:
    scale_ax.set_yscale("log", base=2)
    scale_ax.set_ylabel("loss scale (dotted)")
  bar_ax.set_xticks(range(len(runs)))
  bar_ax.set_xticklabels([run.name for run in runs], fontsize=8, rotation=15)
  bar_ax.set_ylim(top=1.2 * max([row["throughput"] or 0 for row in rows] + [1e-9]))
  fps_ax.set_ylim(bottom=0)
  titles = ((loss_ax, "total loss"), (diff_ax, "total loss - the reference's (%s)"
                                      % reference.name),
            (acc_ax, "masked-LM accuracy (evaluations)"),
            (fps_ax, "sentences per second (each display window)"),
            (lr_ax, "learning rate" + (" and loss scale" if scale_ax else "")),
            (bar_ax, "sentences per second (steady-state unless marked)"))
  for ax, title in titles:
    ax.set_title(title, fontsize=10)
    if ax is not bar_ax:
      ax.set_xlabel("training samples")
    if ax is not bar_ax and ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  figure.suptitle("runs side by side: " + ", ".join(run.name for run in runs))
  figure.tight_layout()
  figure.savefig(png_path, dpi=80, metadata={"Creator": PICTURE_CREATOR})
  plt.close(figure)


def picture_path_problem(path):
  """Why --png_path cannot be written ("" when it can): its ending, its folder, or a file
  there that compare did not draw (a run's report.png, a picture of the user's)."""
  if not path:
    return "--png_path is empty; pass the picture's path, e.g. --png_path=compare.png"
  folder, name = os.path.split(path)
  stem, ending = os.path.splitext(name)
  if ending.lower() not in PICTURE_FORMATS:
    return ("--png_path=%s does not end with %s; pass e.g. --png_path=%s.png"
            % (path, ", ".join(PICTURE_FORMATS[:-1]) + " or " + PICTURE_FORMATS[-1],
               os.path.join(folder, stem if stem.lower() not in PICTURE_FORMATS + ("",)
                            else "compare")))
  if folder and not os.path.isdir(folder):
    return ("--png_path=%s: %s %s; pass a path in a folder that exists" % (
        path, folder, "is a file, not a folder" if os.path.exists(folder) else
        "does not exist"))
  if os.path.isfile(path) and not _drawn_by_compare(path):
    return ("--png_path=%s exists without compare's mark (a run's report.png, a picture of "
            "yours, or one an older version drew); pass another path, or remove it first"
            % path)
  return ""


def _drawn_by_compare(path):
  """Whether the picture at path holds PICTURE_CREATOR: a PNG or SVG near its start, a
  PDF near its end (its Info dictionary); read within 1 MB of either."""
  mark, window = PICTURE_CREATOR.encode(), 1 << 20
  try:
    with open(path, "rb") as f:
      head = f.read(window)
      f.seek(max(os.fstat(f.fileno()).st_size - window, 0))
      return mark in head or mark in f.read()
  except OSError:
    return False


def run_names(folders):
  """Each folder's name; the whole path where two names are the same."""
  names = [os.path.basename(os.path.normpath(f)) for f in folders]
  return [n if names.count(n) == 1 else os.path.normpath(f) for n, f in zip(names, folders)]


def main(argv):
  folders = argv[1:]
  if len(folders) < 2:
    errors.print_error("compare",
                       "give two run folders or more: python3 -m bert_pretrain.compare "
                       "RUN_DIR RUN_DIR ...")
    return 2
  if not 0 < FLAGS.band < 1:
    errors.print_error("compare", "--band=%g must be between 0 and 1 (a fraction of the "
                       "loss, e.g. 0.001)" % FLAGS.band)
    return 2
  problem = picture_path_problem(FLAGS.png_path)
  if problem:
    errors.print_error("compare", problem)
    return 2
  try:
    runs = [Run(folder, name) for folder, name in zip(folders, run_names(folders))]
  except ValueError as e:
    errors.print_error("compare", e)
    return 2
  for run in runs:
    if run.cut_lines:
      print("compare: note: %s: line %d of its dllog.json is cut short (a killed run?); "
            "its other records are compared" % (run.name, run.cut_lines[0]))
    note = report.not_text_note(os.path.join(run.folder, "dllog.json"), run.skipped)
    if note:
      print("compare: note: " + note)
  rows = compare_runs(runs, FLAGS.band)
  for line in format_rows(rows, FLAGS.band):
    print(line)
  if len(runs) > 1:
    print(settings_line(runs))
  try:
    draw(runs, rows, FLAGS.png_path, FLAGS.band)
  except ImportError:
    print("compare: matplotlib is not installed, so no picture; pip install matplotlib "
          "(or bash init_tf.sh)")
    return 0
  except EnvironmentError as e:  # a read-only folder, a folder of the picture's name...
    errors.print_error("compare", errors.os_error_message(e))
    return 2
  print("compare: %s" % FLAGS.png_path)
  return 0


if __name__ == "__main__":
  errors.run_main("compare", main)
