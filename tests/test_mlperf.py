"""MLPerf's rules as the run applies them: the evaluation interval and schedule, the load
check of the initial checkpoint, the reference convergence points (RCPs) and the
compliance and seed checkers on a run's log."""

import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import config
from bert_pretrain import demo
from bert_pretrain.training import checkpoints
from bert_pretrain.training import meters
from bert_pretrain.training import mlperf
from bert_pretrain.model import modeling
from conftest import TINY_CONFIG, base_flags, run_pretraining


@pytest.mark.parametrize("batch_size, interval", [
    # The reference README's table, then the demo's batch and a batch above every RCP.
    (256, 150000), (1024, 150000), (1536, 150000), (2048, 150000), (3072, 175000),
    (4096, 175000), (8192, 225000), (32, 150000), (16384, 325000)])
def test_the_evaluation_interval_follows_the_rule_for_the_global_batch(batch_size, interval):
  assert mlperf.eval_interval_samples(batch_size) == interval


class _Logger(object):
  def mlperf(self, *args, **kwargs):
    pass


def test_a_resumed_run_evaluates_at_the_same_multiples_of_the_interval():
  """Evaluations come after the update that reaches each multiple of the interval, also
  when the run resumes between two of them (not one interval after the resume)."""
  def due_steps(start_step, last_step, samples_start_eval=0):
    schedule = meters.EvalSchedule(_Logger(), object(), None, 32, 100, samples_start_eval,
                                   start_step, None)
    return [s for s in range(start_step + 1, last_step + 1) if schedule.due(s)]
  # 32 samples per update: 100, 200, 300, 400 are passed at steps 4, 7, 10 and 13.
  assert due_steps(0, 13) == [4, 7, 10, 13]
  assert due_steps(5, 13) == [7, 10, 13]
  # From samples_start_eval on: 250, 350, 450 (steps 8, 11, 15), resumed or not.
  assert due_steps(0, 15, samples_start_eval=250) == [8, 11, 15]
  assert due_steps(9, 15, samples_start_eval=250) == [11, 15]


def test_skipped_updates_move_the_schedule_by_the_samples_they_read():
  schedule = meters.EvalSchedule(_Logger(), object(), None, 8, 24, 0, 0, None)
  assert not schedule.due(1)  # 8 samples read
  schedule.skipped = 2  # two updates skipped: 24 read, the point not yet past
  assert schedule.due(2)  # 32 read: past 24
  assert meters.samples(2, 8, schedule.skipped) == 32


def test_whether_an_update_reached_a_point_is_known_exactly_after_skipped_updates():
  """From the samples read before and after the update (a checkpoint's update_samples):
  update 2 read from 8 to 32 (two skipped between), past the point at 24, which
  counting back one batch from 32 misses."""
  schedule = meters.EvalSchedule(_Logger(), object(), None, 8, 24, 0, 0, None)
  schedule.applied(1)
  assert not schedule.reached_by(1)
  schedule.skipped = 2
  schedule.applied(2)
  assert schedule.update_samples == (8, 32) and schedule.reached_by(2)
  assert not meters.reached_point(2, 8, 2, 0, 24)  # counted back
  assert meters.reached_point(2, 8, 2, 0, 24, update_samples=(8, 32))  # as a resumed run
  schedule.applied(3)  # 40 read
  assert not schedule.reached_by(3)
  # Without an evaluator no update reaches a point (nothing to evaluate there).
  assert not meters.EvalSchedule(_Logger(), None, None, 8, 24, 0, 2, None, skipped=2,
                                 update_samples=(8, 32)).reached_by(2)


def test_a_point_passed_by_updates_skipped_before_a_stop_is_the_next_applied_updates():
  """Update 2 read 8 to 16; one skipped update read to 24, then a stop saved update 2.
  Resumed, update 2 reached no point; update 3, the first applied next, reaches 24, as
  in the run that was not stopped."""
  resumed = meters.EvalSchedule(_Logger(), object(), None, 8, 24, 0, 2, None, skipped=1,
                                update_samples=(8, 16))
  assert not resumed.reached_by(2)
  resumed.applied(3)
  assert resumed.update_samples == (16, 32) and resumed.due(3)


def test_updates_skipped_by_loss_scaling_count_in_mlperfs_samples(pretraining_data, tmp_path):
  """float16's loss scaling skips the updates whose gradients overflow (here the first,
  at a scale of 1e7); their batches were read and are not read again, so MLPerf's samples
  (train_samples, the evaluations' epoch_num, the schedule) count them, as the rules
  count the samples a run reads."""
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(pretraining_data, out, amp_dtype="float16",
                                       init_loss_scale=1e7, display_loss_steps=1,
                                       samples_start_eval=0, samples_between_eval=24))
  assert result.returncode == 0, result.stderr[-3000:]
  skipped = [int(n) for n in re.findall(r"skipped_steps: (\d+)", result.stdout)]
  assert len(skipped) == 4 and skipped[0] > 0, result.stdout[-3000:]
  log = [json.loads(line.split(":::MLLOG ", 1)[1])
         for line in (out / "mlperf.log").read_text().splitlines()]
  [train_samples] = [r["value"] for r in log if r["key"] == "train_samples"]
  assert train_samples == (4 + skipped[-1]) * 8
  # Each update's samples read, in the JSON-lines log too.
  train = [json.loads(line) for line in (out / "dllog.json").read_text().splitlines()]
  train = [r for r in train if r["type"] == "train"]
  assert [r["samples"] for r in train] == [(r["step"] + n) * 8
                                           for r, n in zip(train, skipped)]
  # An evaluation after the first update that reaches each multiple of 24 samples read;
  # the last, at the end, is left out of MLPerf's log unless it reached one too.
  read = [(step + n) * 8 for step, n in zip(range(1, 5), skipped)]
  due = [s for i, s in enumerate(read) if s // 24 > ((read[i - 1] if i else 0) // 24)]
  evaluated = [r["metadata"]["epoch_num"] for r in log if r["key"] == "eval_accuracy"]
  assert evaluated == due, (read, evaluated)
  blocks = [r["metadata"]["first_epoch_num"] for r in log if r["key"].startswith("block_")]
  assert blocks[::2] == blocks[1::2], blocks  # each block_stop as its block_start
  assert ("falls between MLPerf's evaluation points (every 24 samples)" in result.stdout) == (
      train_samples not in due)
  # Resumed, the schedule goes on from the samples read, the skipped updates' included.
  more = run_pretraining(*base_flags(pretraining_data, out, amp_dtype="float16",
                                     display_loss_steps=1, num_train_steps=7, eval_at_start=True,
                                     samples_start_eval=0, samples_between_eval=24))
  assert more.returncode == 0, more.stderr[-3000:]
  total = [int(n) for n in re.findall(r"skipped_steps: (\d+)", more.stdout)]
  read = [(step + n) * 8 for step, n in zip(range(5, 8), total)]
  start, first_due = train_samples, due
  due = [s for i, s in enumerate(read) if s // 24 > ((read[i - 1] if i else start) // 24)]
  log = [json.loads(line.split(":::MLLOG ", 1)[1])
         for line in (out / "mlperf.2.log").read_text().splitlines()]
  evaluated = [r["metadata"]["epoch_num"] for r in log if r["key"] == "eval_accuracy"]
  # --eval_at_start: the resumed run evaluates where it starts, then on the schedule; the
  # first is in MLPerf's log only at a point of the schedule, as the last. The checkpoint
  # says whether it is one: the samples counted back cannot tell after skipped updates.
  assert evaluated == ([start] if start in first_due else []) + due, (start, first_due, read,
                                                                     evaluated)
  # In dllog.json both are: the first run's last and the resumed run's first.
  records = [json.loads(line) for line in (out / "dllog.json").read_text().splitlines()]
  assert [r["samples"] for r in records if r["type"] == "eval"].count(start) == 2


def _evaluations_logged(out, name="mlperf.2.log"):
  log = [json.loads(line.split(":::MLLOG ", 1)[1])
         for line in (out / name).read_text().splitlines()]
  return [r["metadata"]["epoch_num"] for r in log if r["key"] == "eval_accuracy"]


def test_a_resumed_runs_first_evaluation_is_in_mlperfs_log_only_at_a_point(pretraining_data,
                                                                           tmp_path):
  """8 samples an update, a point every 24: update 3 reaches one, update 4 not. Each
  checkpoint records the samples read before and after its update; the run resumed from it
  evaluates at its start and logs that evaluation to MLPerf only at a point of its own
  schedule, as the last of a run ending between two."""
  flags = dict(samples_start_eval=0, samples_between_eval=24, save_checkpoints_steps=2)
  logged = {}
  for last in (3, 4):
    out = tmp_path / str(last)
    assert run_pretraining(*base_flags(pretraining_data, out, num_train_steps=last,
                                       **flags)).returncode == 0
    assert [tf.train.load_checkpoint(str(out / ("model.ckpt-%d" % step))).get_tensor(
        checkpoints.UPDATE_SAMPLES).tolist() for step in (2, last)] == [
            [8, 16], [8 * (last - 1), 8 * last]]
    resumed = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=6,
                                          eval_at_start=None, **flags))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logged[last] = _evaluations_logged(out)
  assert logged == {3: [24, 48], 4: [48]}
  # Another schedule on resuming is the one the point is judged by: 24 is not one of
  # every 32, and (16, 24] holds none of those.
  out = tmp_path / "other_interval"
  assert run_pretraining(*base_flags(pretraining_data, out, num_train_steps=3,
                                     **flags)).returncode == 0
  assert run_pretraining(*base_flags(pretraining_data, out, num_train_steps=6,
                                     eval_at_start=None, **dict(
                                         flags, samples_between_eval=32))).returncode == 0
  assert _evaluations_logged(out) == [32]
  # A first run without evaluation leaves its point to the resumed one, which evaluates
  # it first; a resumed run without evaluation has none to make.
  out = tmp_path / "no_eval_first"
  assert run_pretraining(*base_flags(pretraining_data, out, num_train_steps=3, do_eval="false",
                                     **flags)).returncode == 0
  resumed = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=6, **flags))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Update 3 reached an evaluation point: evaluating it first" in resumed.stdout
  assert _evaluations_logged(out) == [24, 48]
  out = tmp_path / "no_eval_resumed"
  assert run_pretraining(*base_flags(pretraining_data, out, num_train_steps=3,
                                     **flags)).returncode == 0
  resumed = run_pretraining(*base_flags(pretraining_data, out, num_train_steps=6,
                                        do_eval="false", **flags))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "evaluation point" not in resumed.stdout


def test_the_initial_accuracy_is_checked_against_mlperfs_checkpoint():
  assert mlperf.expected_initial_accuracy("/data/phase1/model.ckpt-28252") == 0.34085
  assert mlperf.expected_initial_accuracy("/data/phase1/model.ckpt-28252/") == 0.34085
  assert mlperf.expected_initial_accuracy("/data/model.ckpt-1000") is None
  assert mlperf.initial_accuracy_warning(0.3401, 0.34085, 0.01) is None
  warning = mlperf.initial_accuracy_warning(0.0012, 0.34085, 0.01)
  assert "0.00120" in warning and "expected 0.34085 +- 0.01" in warning
  assert "--bert_config_file" in warning
  assert mlperf.initial_accuracy_warning(0.0012, None, 0.01) is None


def test_an_evaluation_of_another_set_than_eval_10k_is_said_not_comparable_with_the_target():
  assert mlperf.eval_set_warning(10000, 0.72, 0) is None
  assert mlperf.eval_set_warning(64, 0.0, 0) is None  # no target (the demo)
  subset = mlperf.eval_set_warning(2400, 0.72, 100)  # the anchor's --max_eval_steps=100
  assert subset.startswith("the evaluation read 2400 sequences, not the 10000 of MLPerf's "
                           "eval_10k")
  assert subset.endswith("--max_eval_steps=0 evaluates the whole set")
  assert mlperf.eval_set_warning(10001, 0.72, 0).endswith(
      "pass eval_10k's records as --eval_files_dir")


def test_the_eval_set_is_checked_at_the_first_evaluation_even_off_the_schedule():
  """An evaluation-only run of a step-28252 checkpoint evaluates off MLPerf's schedule
  and can still report the target reached: its evaluation is checked too, once."""
  class Logger(_Logger):
    def __init__(self):
      self.warnings = []

    def eval_results(self, *args, **kwargs):
      pass

    def warning(self, step, message):
      self.warnings.append((step, message))

  evaluator = types.SimpleNamespace(evaluate=lambda sess: {
      "eval_samples": 2400, "masked_lm_accuracy": 0.73})
  monitor = types.SimpleNamespace(evaluation=lambda step, accuracy: [])
  logger = Logger()
  schedule = meters.EvalSchedule(logger, evaluator, monitor, 8, 24, 0, 28252, None,
                                 stop_threshold=0.72, max_eval_steps=100)
  schedule.evaluate(None, 28252, scheduled=False)
  schedule.evaluate(None, 28252, scheduled=False)
  assert [(step, message.split(":")[0]) for step, message in logger.warnings] == [
      (28252, "the evaluation read 2400 sequences, not the 10000 of MLPerf's eval_10k")]


def _rcp_file():
  with open(mlperf.rcp_file()) as f:
    return json.load(f)


def _olympic_mean(samples):
  return float(np.mean(sorted(samples)[1:-1]))


def test_a_batch_size_with_an_rcp_takes_its_hyperparameters_and_mean():
  raw = _rcp_file()["bert_ref_4096"]
  choice = mlperf.choose_rcp(4096, mlperf.load_rcps())
  assert choice.rcp.name == "bert_ref_4096"
  params = raw["Hyperparams"]
  assert choice.hyperparameters == {
      "learning_rate": params["opt_base_learning_rate"], "epsilon": params["opt_epsilon"],
      "num_train_steps": params["opt_learning_rate_training_steps"],
      "num_warmup_steps": params["num_warmup_steps"],
      "start_warmup_step": params["start_warmup_step"], "beta_1": params["opt_lamb_beta_1"],
      "beta_2": params["opt_lamb_beta_2"],
      "weight_decay_rate": params["opt_lamb_weight_decay_rate"]}
  assert choice.note == "RCP bert_ref_4096 (global batch 4096)"
  # The RCP checker leaves bert_ref_4096 out (it converges slower than the line from
  # bert_ref_448 to bert_ref_4608), so a run of 4096 is judged between those two.
  assert choice.judged_by == "bert_ref_448 and bert_ref_4608 interpolated"


def _checker_expects(batch_size):
  """(mean, stdev) of the samples to converge that mlperf-logging's RCP checker weighs a
  run of this global batch size against, as its check_directory picks the record from
  the pruned RCPs (above every RCP, where it judges nothing: the largest)."""
  from mlperf_logging.rcp_checker import rcp_checker
  checker = rcp_checker.RCP_Checker("training", mlperf.RULESET, "bert", False)
  record = checker._find_rcp(batch_size, "pruned_rcps")
  low = checker._find_top_min_rcp(batch_size, "pruned_rcps")
  high = checker._find_bottom_max_rcp(batch_size, "pruned_rcps")
  if record is None and low and high:
    record = checker._create_interp_rcp(batch_size, low, high)[1]
  elif record is None:
    record = checker._find_min_rcp("pruned_rcps") if high else low
  return record["RCP Mean"], record["RCP Stdev"]


@pytest.mark.parametrize("batch_size", [8, 256, 448, 1024, 2048, 4096, 5000, 6144, 8192,
                                        16384, 20000])
def test_the_samples_to_converge_are_those_mlperfs_rcp_checker_judges_the_batch_by(
    batch_size):
  choice = mlperf.choose_rcp(batch_size, mlperf.load_rcps())
  mean, stdev = _checker_expects(batch_size)
  assert choice.samples_mean == pytest.approx(mean)
  assert choice.samples_stdev == pytest.approx(stdev)


def test_a_batch_size_between_two_rcps_takes_the_one_below_and_interpolates_the_mean():
  raw = _rcp_file()
  low, high = raw["bert_ref_4608"], raw["bert_ref_6144"]
  choice = mlperf.choose_rcp(5000, mlperf.load_rcps())
  assert choice.rcp.name == "bert_ref_4608"
  assert choice.hyperparameters["learning_rate"] == low["Hyperparams"]["opt_base_learning_rate"]
  assert choice.hyperparameters["beta_2"] == low["Hyperparams"]["opt_lamb_beta_2"]
  # The schedule spans the RCP's samples: 700 updates of 4608 are 645 of 5000.
  assert choice.hyperparameters["num_train_steps"] == round(700 * 4608 / 5000.0) == 645
  want = np.interp(5000, [4608, 6144], [_olympic_mean(low["Epochs to converge"]),
                                        _olympic_mean(high["Epochs to converge"])])
  assert choice.samples_mean == pytest.approx(want)
  assert "nearest below" in choice.note
  assert choice.judged_by == "bert_ref_4608 and bert_ref_6144 interpolated"


def test_a_batch_size_outside_the_rcps_takes_the_nearest_end_and_says_so():
  rcps = mlperf.load_rcps()
  small = mlperf.choose_rcp(32, rcps)
  assert small.rcp.name == "bert_ref_256"
  # Judged by the smallest RCP the checker keeps: bert_ref_448 converges in fewer samples.
  assert small.judged_by == "bert_ref_448"
  assert small.hyperparameters["num_train_steps"] == 13700 * 8
  assert "below every RCP" in small.note
  large = mlperf.choose_rcp(20000, rcps)
  assert large.rcp.name == "bert_ref_16384"
  assert large.hyperparameters["start_warmup_step"] == round(-100 * 16384 / 20000.0)
  assert "above every RCP" in large.note and "cannot judge" not in large.note
  assert "has none to judge" in large.note


def test_the_projected_time_adds_mlperfs_evaluations_at_the_rules_interval():
  total, evaluations, eval_seconds = mlperf.projected_time_to_train(
      3000000, 1000.0, 256, 0.001)
  assert evaluations == 20  # every 150,000 samples
  assert eval_seconds == pytest.approx(20 * 10000 * 0.001)
  assert total == pytest.approx(3000.0 + 200.0)
  assert mlperf.projected_time_to_train(3000000, 1000.0, 256, None) == (3000.0, 20, None)
  assert mlperf.format_duration(3725) == "1 h 02 min"
  assert mlperf.format_duration(75) == "1 min 15 s"


def test_clear_cache_syncs_and_writes_3_where_the_kernel_reads_it(tmp_path):
  knob = tmp_path / "drop_caches"
  knob.write_text("")
  mlperf.check_clear_cache(str(knob))
  mlperf.clear_cache(str(knob))
  assert knob.read_text() == "3\n"
  with pytest.raises(ValueError, match=r"^--clear_cache cannot write %s on this host \(it "
                     r"needs root.*leave --clear_cache out \(mlperf.log then says cache_clear "
                     r"false\)$" % re.escape(str(tmp_path / "none" / "knob"))):
    mlperf.check_clear_cache(str(tmp_path / "none" / "knob"))


def test_a_run_with_clear_cache_drops_the_page_cache_and_logs_it_or_refuses_at_once(
    pretraining_data, tmp_path):
  """--clear_cache drops the page cache before the run starts and logs cache_clear true;
  where this process cannot (not root, /proc/sys read-only) the run refuses before it
  builds anything. Without the flag the log says false."""
  def cache_clear(out):
    [value] = [json.loads(line.split(":::MLLOG ", 1)[1])["value"]
               for line in (out / "mlperf.log").read_text().splitlines()
               if '"key": "cache_clear"' in line]
    return value
  result = run_pretraining(*base_flags(pretraining_data, tmp_path / "plain", nodo_eval=None,
                                       num_train_steps=1))
  assert result.returncode == 0, result.stderr[-3000:]
  assert cache_clear(tmp_path / "plain") is False
  out = tmp_path / "cleared"
  result = run_pretraining(*base_flags(pretraining_data, out, nodo_eval=None,
                                       num_train_steps=1, clear_cache=None))
  if os.access(mlperf.DROP_CACHES, os.W_OK):
    assert result.returncode == 0, result.stderr[-3000:]
    assert cache_clear(out) is True
  else:
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "run_pretraining: error: --clear_cache cannot write /proc/sys/vm/drop_caches")
    assert not out.exists() or not os.listdir(str(out))


def _compliance_problems(mllog_path, cwd):
  """The lines of mlperf-logging's compliance checker (BERT's last round) that report a
  problem, but the one that says the target accuracy was not reached."""
  out = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker",
                        "--usage", "training", "--ruleset", mlperf.RULESET, mllog_path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, cwd=str(cwd))
  lines = out.stdout.splitlines()
  assert any("closed_bert.yaml" in line for line in lines), out.stdout
  target = [line for line in lines if "Failed checks for eval_accuracy" in line]
  assert target and ">= 0.720" in target[0], out.stdout
  return [line for line in lines if re.search(r"WARNING|ERROR|Traceback", line)
          and line not in target and not line.endswith("ERROR - FAILED")]


def test_a_run_with_the_reference_hyperparameters_checks_its_start_and_passes_the_checker(
    pretraining_data, tmp_path):
  """One short run: --reference_hyperparameters takes the RCP of its global batch (8:
  below every RCP, so bert_ref_256's) where the command line gives nothing; the evaluation
  at start checks the accuracy after loading --init_checkpoint against the expected one;
  the run prints a projected time to train; mlperf-logging's compliance checker finds
  nothing wrong in its MLPerf log but the target not reached, its seed checker nothing."""
  init = tmp_path / "init" / "model.ckpt-0"
  demo.write_fresh_checkpoint(modeling.BertConfig.from_dict(TINY_CONFIG), str(init))
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(
      pretraining_data, out, init_checkpoint=str(init), reference_hyperparameters=None,
      eval_at_start=True, expected_initial_accuracy=0.5, max_eval_steps=2,
      samples_start_eval=0))
  assert result.returncode == 0, result.stderr
  stdout = result.stdout
  # base_flags gives --learning_rate and --num_train_steps: they win.
  line = [l for l in stdout.splitlines() if l.startswith("--reference_hyperparameters: ")]
  assert len(line) == 1, stdout
  assert "below every RCP: those of the smallest, bert_ref_256" in line[0]
  assert "--beta_1=0.9, --beta_2=0.999, --epsilon=1e-06, --num_warmup_steps=0" in line[0]
  assert "--learning_rate" not in line[0] and "--num_train_steps" not in line[0]
  assert "optimizer: lamb, LayerNorm and bias without trust ratio (MLPerf's reference), " \
         "gradients clipped to norm 1.0 per micro-batch on each rank" in stdout
  assert "evaluation every 150000 samples (MLPerf's interval for a global batch of 8)" in stdout
  accuracy = float(re.search(r"masked_lm_accuracy after loading model.ckpt-0: ([\d.]+) "
                             r"\(expected 0.50000\)", stdout).group(1))
  assert accuracy < 0.1  # random weights
  assert "warning: masked_lm_accuracy right after loading --init_checkpoint is" in stdout
  projected = re.search(r"^projected time to train: .* \(([\d]+) samples, the mean of "
                        r"MLPerf's bert_ref_448, at [\d.]+ sentences/s, and (\d+) evaluations "
                        r"of 10000 samples: .*\)$", stdout, re.M)
  assert projected, stdout
  assert int(projected.group(2)) == int(projected.group(1)) // 150000
  records = [json.loads(l) for l in open(str(out / "dllog.json"))]
  warnings = [r["message"] for r in records if r["type"] == "warning"]
  assert any("right after loading --init_checkpoint" in w for w in warnings)
  optimizer = [r for r in records if r["type"] == "optimizer"][0]
  assert optimizer["gradient_clipping"] == "per_micro_batch"
  assert optimizer["lamb_adapt_layernorm_and_bias"] is False
  summary = [r for r in records if r["type"] == "summary"][0]
  assert summary["projected_time_to_train_s"] > 0
  mllog = {}
  for l in open(str(out / "mlperf.log")):
    record = json.loads(l.split(":::MLLOG ", 1)[1])
    mllog.setdefault(record["key"], record["value"])
  assert mllog["opt_lamb_beta_2"] == 0.999 and mllog["opt_base_learning_rate"] == 1e-3
  assert _compliance_problems(str(out / "mlperf.log"), tmp_path) == []
  # MLPerf's package checker refuses a run whose log holds no seed (rules v4.1 on).
  with open(str(out / config.RUN_MARKER)) as f:
    assert mllog["seed"] == json.load(f)["seed"]
  from mlperf_logging.package_checker.seed_checker import SeedChecker
  assert SeedChecker(mlperf.RULESET).check_seeds([str(out / "mlperf.log")])


def test_an_mlperf_logging_without_the_rounds_rcps_is_a_one_line_error():
  with pytest.raises(ValueError, match=r"has no BERT RCPs of training 0.1.0 .*; pip "
                                       r"install -U mlperf-logging$"):
    mlperf.rcp_file("0.1.0")
