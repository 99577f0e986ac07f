"""Surviving what clusters do to a run: SIGTERM and SIGINT stop it after the current
update with a checkpoint, a run killed at any step and started again with the same
command continues the loss curve of an uninterrupted run, bit for bit (with dropout
too), and a run resumed on another layout trains on the records the uninterrupted run
would have."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain.training import report
from bert_pretrain.training import resume as resume_lib
from bert_pretrain.training import signals
from conftest import (ROOT, TINY_CONFIG, base_flags, horovod_env, rank_command, rank_pid,
                      run_pretraining, start_command)

MODULE = [sys.executable, "-m", "bert_pretrain.run_pretraining"]
GLOO = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"]
MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"]
STEPS = 40
SAVE_STEPS = 4


@pytest.fixture(scope="module")
def dropout_free(pretraining_data, tmp_path_factory):
  """The fixture data with a config without dropout, for the tests of stopping (the
  tests of dropout below use the fixture's config)."""
  root = tmp_path_factory.mktemp("dropout_free")
  config = dict(TINY_CONFIG, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  (root / "bert_config.json").write_text(json.dumps(config))
  return dict(pretraining_data, config=str(root / "bert_config.json"))


def _flags(data, out, without=(), **overrides):
  """The flags of the runs below; `without`: names of flags to leave out."""
  values = dict(bert_config_file=data["config"], num_train_steps=STEPS, display_loss_steps=1,
                save_checkpoints_steps=SAVE_STEPS, nodo_eval=None, seed=7,
                dllog_path=str(out / "dllog.json"))
  values.update(overrides)
  return [f for f in base_flags(data, out, **values)
          if f.split("=")[0][2:] not in without]


def _losses(dllog_path):
  """step -> (total_loss, mlm_loss, nsp_loss) of the train records of a dllog.json; the
  records of several runs appended to one file must agree where they overlap."""
  curve = {}
  for line in open(str(dllog_path)):
    record = json.loads(line)
    if record["type"] == "train" and "total_loss" in record:
      losses = (record["total_loss"], record["mlm_loss"], record["nsp_loss"])
      assert curve.setdefault(record["step"], losses) == losses, record["step"]
  return curve


def _logged_step(dllog_path):
  """The last training step in a dllog.json (0: none yet, or a line still being written)."""
  try:
    return max(_losses(dllog_path), default=0)
  except (OSError, ValueError):
    return 0


def _run_and_signal(command, out, at_step, target=None, sig=signal.SIGTERM, dllog=None):
  """Starts `command`, and once it has logged step `at_step` sends `sig` to the process
  `target(proc)` returns (default: the command's own process). Returns (exit status,
  stdout, stderr, the last step logged).

  With `dllog` (rank 0's dllog.json, which it writes and flushes itself), the step is
  looked for there too: a launcher forwards the ranks' output late on a loaded machine,
  once so late that the job had ended before the signal was sent. A job whose dllog.json
  shows its last step logged before the signal was sent (a starved test process), or
  that logged its last step and exited 0 (the signal came in that update, after it had
  read the stop flag), runs again in an emptied folder: the signal reached no update of
  it. A job that ignores the signal fails all three times."""
  for attempt in range(3):
    result, sent = _run_and_signal_once(command, out, at_step, target, sig, dllog)
    logged = lambda moment: _logged_last_step_before(out / "dllog.json", moment)
    if sent == float("inf") and not (result[0] == 0 and logged(sent)):
      raise AssertionError("the job ended by itself before the signal (status %d): %s"
                           % (result[0], result[1][-3000:]))
    if not (logged(sent) or (result[0] == 0 and logged(float("inf")))):
      return result
    print("attempt %d: the job logged step %d; the signal reached no update; again"
          % (attempt, STEPS))
    shutil.rmtree(str(out))
  raise AssertionError("the signal reached no update 3 times (or the job ignores it): %s"
                       % result[1][-3000:])


def _logged_last_step_before(dllog_path, moment):
  """Whether the dllog.json at `dllog_path` has step STEPS's train record from before the
  time.time() `moment` (float("inf"): at all)."""
  if not dllog_path.exists():
    return False
  records = [json.loads(line) for line in open(str(dllog_path))]
  return any(r["type"] == "train" and r.get("step") == STEPS and r["timestamp"] < moment
             for r in records)


def _run_and_signal_once(command, out, at_step, target, sig, dllog):
  """One run of _run_and_signal; returns its result and the time the signal was sent.
  A run of the module alone starts as conftest.start_command starts it."""
  out.mkdir(parents=True, exist_ok=True)
  stdout_path, stderr_path = (out.parent / (out.name + ".stdout"),
                              out.parent / (out.name + ".stderr"))
  if command[:len(MODULE)] == MODULE:
    proc = start_command(MODULE[2], *command[len(MODULE):], stdout=stdout_path,
                         stderr=stderr_path)
  else:
    with open(str(stdout_path), "w") as stdout, open(str(stderr_path), "w") as stderr:
      proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=horovod_env())
  try:
    step_line = re.compile(r"Step %d," % at_step)
    seen = lambda: (step_line.search(stdout_path.read_text()) or
                    (dllog is not None and _logged_step(dllog) >= at_step))
    while not seen():
      if proc.poll() is not None:
        assert seen(), stdout_path.read_text()  # it ended before that step
        break
      time.sleep(0.01)
    sent = float("inf")  # the job ended before the signal (a starved test)
    if proc.poll() is None:
      try:
        pid = target(proc) if target else proc.pid
      except AssertionError:  # its ranks have just ended
        pid = None
      if pid is not None:
        sent = time.time()
        with contextlib.suppress(ProcessLookupError):  # it has just ended
          os.kill(pid, sig)
    status = proc.wait(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  stdout = stdout_path.read_text()
  steps = [int(s) for s in re.findall(r"Step (\d+),", stdout)]
  return (status, stdout, stderr_path.read_text(), max(steps)), sent


def _resumed_step(stdout):
  return int(re.search(r"Resuming from \S+ at step (\d+)", stdout).group(1))


def _mlperf_log(out, name="mlperf.log"):
  return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(str(out / name))]


@pytest.fixture(scope="module")
def reference_curves(dropout_free, tmp_path_factory):
  """Uninterrupted runs' loss curves, by (launcher, accumulation), made when first used."""
  curves = {}

  def get(launcher, accumulation):
    if (launcher, accumulation) not in curves:
      out = tmp_path_factory.mktemp("reference")
      flags = _flags(dropout_free, out, num_accumulation_steps=accumulation)
      if launcher == "gloo":
        result = subprocess.run(GLOO + rank_command("--horovod", *flags),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                universal_newlines=True, env=horovod_env(), timeout=400)
        assert result.returncode == 0, result.stdout[-3000:]
      else:
        result = run_pretraining(*flags)
        assert result.returncode == 0, result.stderr[-3000:]
      curves[launcher, accumulation] = _losses(out / "dllog.json")
      assert sorted(curves[launcher, accumulation]) == list(range(1, STEPS + 1))
    return curves[launcher, accumulation]
  return get


def _assert_same_curve(curve, reference, first_step):
  steps = [s for s in sorted(curve) if s >= first_step]
  assert steps == list(range(first_step, STEPS + 1))
  for step in steps:
    # Bit-identical: the same data in the same order on the same weights.
    assert curve[step] == reference[step], step
  print("loss curve of steps %d..%d: largest difference to the uninterrupted run %g"
        % (first_step, STEPS, max(abs(a - b) for s in steps
                                  for a, b in zip(curve[s], reference[s]))))


def test_sigterm_stops_at_the_step_reached_with_a_checkpoint_and_the_rerun_continues(
    dropout_free, reference_curves, tmp_path):
  out = tmp_path / "out"
  command = MODULE + _flags(dropout_free, out, without=("nodraw_report",))
  status, stdout, stderr, last_step = _run_and_signal(command, out, at_step=3)
  assert status == 143, stderr[-3000:]
  assert "SIGTERM received: finishing the current update" in stderr
  stop_step = int(re.search(r"SIGTERM: rank 0 stops after step (\d+)", stdout).group(1))
  assert 3 <= stop_step == last_step < STEPS
  assert tf.train.latest_checkpoint(str(out)).endswith("model.ckpt-%d" % stop_step)
  mllog = _mlperf_log(out)
  assert mllog[-1]["key"] == "run_stop" and mllog[-1]["metadata"]["status"] == "aborted"
  assert re.search(r"^\| 1 card \| acc n/a \| fps [\d.]+ \| status aborted \|$", stdout, re.M)
  assert "Throughput Average (sentences/sec) = " in stdout
  # The picture is left for later: a launcher may end the job seconds after a signal.
  assert ("report: not drawn after SIGTERM; python3 -m bert_pretrain.training.report %s draws it"
          % out) in stdout
  assert not (out / "report.png").exists()

  rerun = run_pretraining(*command[3:])
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert _resumed_step(rerun.stdout) == stop_step
  print("SIGTERM after step 3 was logged: stopped after step %d, rerun resumed at step %d"
        % (stop_step, _resumed_step(rerun.stdout)))
  assert ("Data: continuing at sample %d of the data order, the records the run consumed "
          "up to step %d" % (stop_step * 8, stop_step)) in rerun.stdout
  assert re.search(r"^Step %d," % (stop_step + 1), rerun.stdout, re.M)
  assert not re.search(r"^Step %d," % stop_step, rerun.stdout, re.M)  # nothing redone
  _assert_same_curve(_losses(out / "dllog.json"), reference_curves("local", 1), 1)


def test_a_run_stopped_after_an_evaluation_at_the_start_that_met_the_target_is_no_success(
    dropout_free, tmp_path):
  """The evaluation before training (step 0, no point of the schedule to stop at) meets a
  tiny --stop_threshold; the run trains on and a signal stops it: its status is that of
  the weights it ends with, unevaluated, not that first evaluation's."""
  out = tmp_path / "out"
  command = MODULE + _flags(dropout_free, out, without=("nodo_eval",), eval_at_start=True,
                            stop_threshold=1e-9, expected_initial_accuracy=0)
  status, stdout, stderr, _ = _run_and_signal(command, out, at_step=3)
  assert status == 143, stderr[-3000:]
  start = float(re.search(r"^masked_lm_accuracy before training: ([\d.]+)$", stdout,
                          re.M).group(1))
  assert start >= 1e-9  # met the target
  assert re.search(r"^\| 1 card \| acc [\d.]+ \| fps [\d.]+ \| status aborted \|$", stdout,
                   re.M), stdout[-3000:]
  mllog = _mlperf_log(out)
  assert mllog[-1]["key"] == "run_stop" and mllog[-1]["metadata"]["status"] == "aborted"
  assert "reached_target" not in json.loads((out / "bert_pretrain_run.json").read_text())


def test_sigint_stops_like_sigterm_without_a_traceback(dropout_free, tmp_path):
  # Without --seed: the run draws one, and the rerun continues with it.
  out = tmp_path / "out"
  command = MODULE + _flags(dropout_free, out, without=("seed",))
  status, stdout, stderr, last_step = _run_and_signal(command, out, at_step=2,
                                                      sig=signal.SIGINT)
  assert status == 130, stderr[-3000:]
  assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
  stop_step = int(re.search(r"SIGINT: rank 0 stops after step (\d+)", stdout).group(1))
  assert stop_step == last_step
  assert tf.train.latest_checkpoint(str(out)).endswith("model.ckpt-%d" % stop_step)
  assert _mlperf_log(out)[-1]["metadata"]["status"] == "aborted"
  rerun = run_pretraining(*command[3:])
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert _resumed_step(rerun.stdout) == stop_step
  drawn = int(re.search(r"Seed: no --seed; drew (\d+) for the data order", stdout).group(1))
  assert ("Seed: no --seed; the run's seed %d from bert_pretrain_run.json" % drawn
          in rerun.stdout)
  assert "Data: continuing at sample %d of the data order" % (stop_step * 8) in rerun.stdout


def test_sigusr2_prints_a_one_card_runs_stacks_and_the_run_trains_on_to_its_last_step(
    dropout_free, reference_curves, tmp_path):
  """What `kill -USR2` shows of a run that seems stuck, without ending it (it ended one
  with 140 when only a job's ranks with --stall_timeout_s were armed)."""
  out = tmp_path / "out"
  command = MODULE + _flags(dropout_free, out)
  (status, stdout, stderr, last_step), sent = _run_and_signal_once(
      command, out, 3, None, signal.SIGUSR2, None)
  assert sent < float("inf"), "the run ended before the signal: %s" % stdout[-3000:]
  assert status == 0, stderr[-3000:]
  assert last_step == STEPS
  # faulthandler's dump: every thread, the main one inside the training loop.
  assert re.search(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$",
                   stderr, re.M), stderr[-3000:]
  assert re.search(r'File ".*bert_pretrain/training/loop\.py", line \d+ in ', stderr)
  assert "Traceback" not in stderr
  _assert_same_curve(_losses(out / "dllog.json"), reference_curves("local", 1), 1)


def test_sigkilled_run_with_accumulation_resumes_the_loss_curve_bit_identically(
    dropout_free, reference_curves, tmp_path):
  out = tmp_path / "out"
  command = MODULE + _flags(dropout_free, out, num_accumulation_steps=2)
  status, _, _, last_step = _run_and_signal(command, out, at_step=10, sig=signal.SIGKILL)
  assert status == -signal.SIGKILL
  killed = report.format_summary(report.summarize(report.read_records(
      str(out / "dllog.json"))))
  assert any(line.startswith("the last part has no summary") for line in killed), killed
  rerun = run_pretraining(*command[3:])
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert ("report: 1 earlier part ended early, without a summary: not in the steady-state "
          "average" in rerun.stdout)
  resumed = _resumed_step(rerun.stdout)
  assert resumed % SAVE_STEPS == 0 and last_step - resumed <= SAVE_STEPS
  print("SIGKILL after step %d was logged, rerun resumed at step %d" % (last_step, resumed))
  assert "Data: continuing at sample %d of the data order" % (2 * 8 * resumed) in rerun.stdout
  # The rerun's dllog records (steps resumed+1..) were appended to the first run's.
  reference = reference_curves("local", 2)
  _assert_same_curve(_losses(out / "dllog.json"), reference, 1)
  rerun_steps = [int(s) for s in re.findall(r"^Step (\d+),", rerun.stdout, re.M)]
  assert rerun_steps == list(range(resumed + 1, STEPS + 1))


def _rank_1(proc):
  """The process of rank 1 among the descendants of the launcher `proc`."""
  return rank_pid(proc, 1)


@pytest.mark.parametrize("launcher,target", [(GLOO, "one_rank"), (GLOO, "horovodrun"),
                                             (MPIRUN, "one_rank")],
                         ids=["gloo-one-rank", "gloo-horovodrun", "mpi-one-rank"])
def test_two_ranks_signalled_stop_at_the_same_step_and_resume(dropout_free, reference_curves,
                                                              tmp_path, launcher, target):
  out = tmp_path / "out"
  flags = _flags(dropout_free, out)
  # One rank only (as when a scheduler's signal reaches the ranks at different
  # moments), or horovodrun, which forwards SIGTERM to every rank.
  pick = _rank_1 if target == "one_rank" else None
  # horovodrun signalled runs as the script runs it (launch.py run): the launcher passes
  # the signal to the ranks and leaves them time to save, where horovodrun alone kills
  # them 5 s later.
  script = [sys.executable, "-m", "bert_pretrain.distributed.launch", "run"] \
      if target == "horovodrun" else []
  status, stdout, stderr, _ = _run_and_signal(
      script + launcher + rank_command("--horovod", *flags), out, at_step=3, target=pick,
      dllog=out / "dllog.json")
  assert status != 0, stdout[-3000:] + stderr[-3000:]
  if script:
    assert status == 143, (status, stdout[-3000:] + stderr[-3000:])
  elif launcher == GLOO:
    assert re.search(r"exit with status code 1(43|37)\.", stdout + stderr), stdout[-3000:]
  else:
    assert status == 143, stdout[-3000:]
  stops = re.findall(r"SIGTERM: rank (\d) stops after step (\d+)", stdout)
  assert sorted(rank for rank, _ in stops) == ["0", "1"], stdout[-3000:]
  assert len(set(step for _, step in stops)) == 1
  stop_step = int(stops[0][1])
  print("%s %s signalled: both ranks stopped after step %d" % (launcher[0], target, stop_step))
  checkpoints = sorted(n for n in os.listdir(str(out)) if n.endswith(".index"))
  assert tf.train.latest_checkpoint(str(out)).endswith("model.ckpt-%d" % stop_step)
  assert len(checkpoints) == len(set(checkpoints))
  assert _mlperf_log(out)[-1]["metadata"]["status"] == "aborted"
  if launcher == GLOO and target == "one_rank":
    # This variant adds the agreement on the stop step; the rerun from such a
    # checkpoint is tested by the two others.
    return

  rerun = subprocess.run(launcher + rank_command("--horovod", *flags),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, env=horovod_env(),
                         timeout=400)
  assert rerun.returncode == 0, rerun.stdout[-3000:]
  assert _resumed_step(rerun.stdout) == stop_step
  _assert_same_curve(_losses(out / "dllog.json"), reference_curves("gloo", 1), 1)


# Exact resume with dropout: the masks are a function of the seed, the dropout site and
# the place of the micro-batch in the data order (dropout.DropoutSeeds), so a rerun
# draws the uninterrupted run's masks.

@pytest.fixture(scope="module")
def dropout_curves(pretraining_data, tmp_path_factory):
  """Uninterrupted runs' loss curves with dropout (the fixture config's 0.1), by
  (launcher, accumulation, compute type), made when first used (when a kill left no step
  for the resumed run to repeat)."""
  curves = {}

  def get(launcher, accumulation, dtype):
    key = (launcher, accumulation, dtype)
    if key not in curves:
      out = tmp_path_factory.mktemp("dropout_reference")
      flags = _flags(pretraining_data, out, num_accumulation_steps=accumulation,
                     **({} if dtype == "float32" else {"amp_dtype": dtype}))
      if launcher == "gloo":
        result = subprocess.run(GLOO + rank_command("--horovod", *flags),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                universal_newlines=True, env=horovod_env(), timeout=600)
        assert result.returncode == 0, result.stdout[-3000:]
      else:
        result = run_pretraining(*flags, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
      curves[key] = _losses(out / "dllog.json")
      assert sorted(curves[key]) == list(range(1, STEPS + 1))
    return curves[key]
  return get


@pytest.mark.parametrize("launcher,accumulation,dtype", [
    ("local", 1, "float32"), ("local", 2, "bfloat16"), ("gloo", 2, "float32"),
    ("gloo", 1, "bfloat16")])
def test_a_sigkilled_run_with_dropout_resumes_the_loss_curve_bit_identically(
    pretraining_data, dropout_curves, tmp_path, launcher, accumulation, dtype):
  out = tmp_path / "out"
  flags = _flags(pretraining_data, out, num_accumulation_steps=accumulation,
                 **({} if dtype == "float32" else {"amp_dtype": dtype}))
  command = GLOO + rank_command("--horovod", *flags) if launcher == "gloo" else MODULE + flags
  status, _, _, last_step = _run_and_signal(
      command, out, at_step=10, sig=signal.SIGKILL, dllog=out / "dllog.json",
      target=_rank_1 if launcher == "gloo" else None)
  assert status != 0
  if launcher == "gloo":
    rerun = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, env=horovod_env(), timeout=600)
  else:
    rerun = run_pretraining(*flags, timeout=600)
  assert rerun.returncode == 0, rerun.stdout[-3000:] + (rerun.stderr or "")[-3000:]
  resumed = _resumed_step(rerun.stdout)
  assert 0 < resumed < STEPS and resumed % SAVE_STEPS == 0
  print("%s, %d rank(s), accumulation %d: SIGKILL after step %d was logged, rerun resumed "
        "at step %d" % (dtype, 2 if launcher == "gloo" else 1, accumulation, last_step,
                        resumed))
  # Both runs append to one dllog.json, and _losses asserts that the steps logged twice
  # (by the killed run up to its kill, and again after the resume) are bit-identical: the
  # killed run is the uninterrupted one up to there. Only a kill right at a checkpoint
  # leaves no such step; then an uninterrupted run is the reference.
  curve = _losses(out / "dllog.json")
  assert sorted(curve) == list(range(1, STEPS + 1))
  if resumed >= last_step:
    _assert_same_curve(curve, dropout_curves(launcher, accumulation, dtype), 1)
  else:
    print("steps %d..%d logged by the killed run and the resumed one: bit-identical"
          % (resumed + 1, last_step))


# Resume on another layout: the data order is one for every layout, each update takes
# its next global batch, and the checkpoint holds the records consumed.

def _trained(out):
  """update -> sorted fingerprints of the records trained on in that update, over every
  process's output_dir/trained_records-rank-N.txt (--log_trained_records)."""
  updates = {}
  for name in sorted(os.listdir(str(out))):
    if name.startswith("trained_records-rank-"):
      for line in open(str(out / name)):
        update, _, *ids = line.split()
        updates.setdefault(int(update), []).extend(int(i) for i in ids)
  return {update: sorted(ids) for update, ids in updates.items()}


def _layout_flags(data, out, **overrides):
  values = dict(num_train_steps=8, train_batch_size=4, save_checkpoints_steps=100,
                log_trained_records=None)
  values.update(overrides)
  return _flags(data, out, **values)


@pytest.fixture(scope="module")
def uninterrupted_order(pretraining_data, tmp_path_factory):
  """The records of the first 8 updates of 4 of one uninterrupted run (one rank, seed
  7): update -> sorted fingerprints."""
  out = tmp_path_factory.mktemp("uninterrupted")
  result = run_pretraining(*_layout_flags(pretraining_data, out))
  assert result.returncode == 0, result.stderr[-3000:]
  order = _trained(out)
  assert sorted(order) == list(range(1, 9)) and all(len(r) == 4 for r in order.values())
  return order


def test_a_two_rank_run_resumed_on_one_rank_or_mirrored_trains_the_next_records_once(
    pretraining_data, uninterrupted_order, tmp_path):
  """2 Horovod ranks of batch 2 for 4 updates, then the same output_dir resumed on one
  rank of batch 4 and (a copy) on mirrored over 2 devices of batch 2, each to update 8:
  over both runs every update trains on the records of that update of the uninterrupted
  run, so they are its first 32 records, none left out, none repeated."""
  two = tmp_path / "two"
  first = subprocess.run(GLOO + rank_command("--horovod", *_layout_flags(
      pretraining_data, two, num_train_steps=4, train_batch_size=2)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, env=horovod_env(), timeout=600)
  assert first.returncode == 0, first.stdout[-3000:]
  assert _trained(two) == {u: uninterrupted_order[u] for u in range(1, 5)}
  was = "was horovod, 2 processes, 2 replicas x batch 2 x 1 accumulation = global batch 4"
  for name, layout, now, replicas in (
      ("one_rank", dict(train_batch_size=4),
       "1 process, 1 replica x batch 4 x 1 accumulation = global batch 4", "1 replica"),
      ("mirrored", dict(train_batch_size=2, distribution="mirrored", cpu_devices=2),
       "mirrored, 1 process, 2 replicas x batch 2 x 1 accumulation = global batch 4",
       "2 replicas")):
    out = tmp_path / name
    shutil.copytree(str(two), str(out))
    for log in os.listdir(str(out)):
      if log.startswith("trained_records-rank-"):
        os.remove(str(out / log))
    resumed = run_pretraining(*_layout_flags(pretraining_data, out, **layout))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = [l for l in resumed.stdout.splitlines() if l.startswith("Resuming on another")]
    assert lines == ["Resuming on another layout: %s (%s); the global batch stays 4, so the "
                     "run continues at sample 16 of the data order, re-sharded over %s (the "
                     "losses are not bit-identical to an uninterrupted run's)"
                     % (now, was, replicas)]
    assert _trained(out) == {u: uninterrupted_order[u] for u in range(5, 9)}
    print("2 ranks for 4 updates, then %s to update 8: the records trained are the first 32 "
          "of the uninterrupted order, update by update" % name.replace("_", " "))


def test_what_changes_the_data_order_is_refused_and_the_allowed_change_continues_it(
    pretraining_data, uninterrupted_order, tmp_path):
  """Another global batch, seed, shuffle buffer or TensorFlow version is refused with
  nothing written; a global batch allowed continues at the sample reached, and the
  lengthened schedule it brings is said."""
  out = tmp_path / "out"
  first = run_pretraining(*_layout_flags(pretraining_data, out, num_train_steps=4))
  assert first.returncode == 0, first.stderr[-3000:]
  before = sorted(os.listdir(str(out)))
  marker = out / "bert_pretrain_run.json"
  record = json.loads(marker.read_text())
  version = record["data_order"]["tensorflow"]
  assert version == ".".join(tf.__version__.split(".")[:2])
  renamed = tmp_path / "renamed"  # the same records, in files named otherwise
  renamed.mkdir()
  for index in range(2):
    shutil.copy(os.path.join(pretraining_data["train"], "part-%d" % index),
                str(renamed / ("part-%05d-of-00002" % index)))
  for change, overrides, message in (
      ("global_batch", dict(train_batch_size=8),
       "was trained with a global batch of 4 (1 process, 1 replica x batch 4 x 1 "
       "accumulation = global batch 4) and this run's is 8"),
      ("seed", dict(seed=8), "was trained with seed 7 and this run passes --seed=8"),
      ("shuffle_buffer", dict(shuffle_buffer=100),
       "was trained with --shuffle_buffer=10000 and this run passes 100"),
      ("tensorflow", {}, "was trained with TensorFlow 1.0 and this run has %s" % version),
      ("data", dict(input_files_dir=str(renamed)), "was trained on other data (part-0 is "
       "not among this run's training files)")):
    if change == "tensorflow":  # as a run of another TensorFlow records it
      record["data_order"]["tensorflow"] = "1.0"
      marker.write_text(json.dumps(record))
    refused = run_pretraining(*_layout_flags(pretraining_data, out, num_train_steps=6,
                                             **overrides))
    assert refused.returncode == 2
    errors = refused.stderr.strip().splitlines()
    assert errors[-1].startswith("run_pretraining: error: --output_dir=%s %s" % (out, message))
    assert "--allow_resume_change=%s" % change in errors[-1]
    assert sorted(os.listdir(str(out))) == before  # nothing written
  record["data_order"]["tensorflow"] = version
  marker.write_text(json.dumps(record))
  # The multi-card script says so before any rank starts, in a dry run too: 2 ranks of
  # its preset's 4 micro-batches of 4.
  for dry_run in ("1", "0"):
    script = subprocess.run(
        ["bash", os.path.join(ROOT, "run_multi_card_FPS.sh")] + _layout_flags(
            pretraining_data, out, num_train_steps=6),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
        env=horovod_env(DRY_RUN=dry_run, IX_NUM_CUDA_VISIBLE_DEVICES="2"), timeout=300)
    assert script.returncode == 2, script.stdout + script.stderr
    assert script.stderr.strip().splitlines()[-1].startswith(
        "run_pretraining: error: --output_dir=%s was trained with a global batch of 4 (1 "
        "process, 1 replica x batch 4 x 1 accumulation = global batch 4) and this run's is "
        "32 (horovod, 2 processes, 2 replicas x batch 4 x 4 accumulation = global batch 32)"
        % out), script.stderr
    assert "<stdout>" not in script.stdout + script.stderr  # no rank's line
    assert sorted(os.listdir(str(out))) == before
  allowed = run_pretraining(*_layout_flags(pretraining_data, out, num_train_steps=6,
                                           train_batch_size=8,
                                           allow_resume_change="global_batch"))
  assert allowed.returncode == 0, allowed.stderr[-3000:]
  assert ("Resuming with another global batch (--allow_resume_change=global_batch): 1 "
          "process, 1 replica x batch 8 x 1 accumulation = global batch 8 (was 1 "
          "process, 1 replica x batch 4 x 1 accumulation = global batch 4); the run continues "
          "at sample 16 of the data order in updates of 8") in allowed.stdout
  assert ("Learning rate: --num_train_steps was 4, now 6 since model.ckpt-4: the schedule "
          "is the new one from step 5 on") in allowed.stdout
  trained = _trained(out)
  assert {u: trained[u] for u in range(1, 5)} == {u: uninterrupted_order[u]
                                                  for u in range(1, 5)}
  # Updates 5 and 6 of 8 records: the uninterrupted run's updates 5 + 6 and 7 + 8.
  assert trained[5] == sorted(uninterrupted_order[5] + uninterrupted_order[6])
  assert trained[6] == sorted(uninterrupted_order[7] + uninterrupted_order[8])
  # The samples counted go on from the 16 read, in updates of 8, in every log.
  records = [json.loads(l) for l in open(str(out / "dllog.json"))]
  assert [(r["step"], r["samples"]) for r in records if r["type"] == "train"] == [
      (1, 4), (2, 8), (3, 12), (4, 16), (5, 24), (6, 32)]
  assert [r["samples"] for r in records if r["type"] == "summary"] == [16, 32]
  mllog = [json.loads(l.split(":::MLLOG ", 1)[1]) for l in open(str(out / "mlperf.2.log"))]
  assert [m["value"] for m in mllog if m["key"] == "train_samples"] == [32]
  # An evaluation of that checkpoint alone (batch 4) says so too.
  evaluated = run_pretraining(*_flags(pretraining_data, out, without=("nodo_eval",),
                                      nodo_train=None, train_batch_size=4))
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  records = [json.loads(l) for l in open(str(out / "dllog.json"))]
  assert [r["samples"] for r in records if r["type"] == "eval"][-1] == 32


def _plan(earlier, now, step=62, num_train_steps=400, allowed=(), replicas=1):
  """resume_plan of a run at `step` whose records were `earlier` and are `now` (the keys
  resume_plan reads; the layout the same, of `replicas` mirrored replicas; a key None in
  `earlier`: not recorded)."""
  layout = {"distribution": "mirrored" if replicas > 1 else "none", "processes": 1,
            "replicas": replicas, "train_batch_size": 4, "num_accumulation_steps": 1,
            "global_batch_size": 4 * replicas}
  record = dict(dict(layout=layout, seed=7, train_files=[["part-0", 100]], compute="float32",
                     update_rule=dict(resume_lib.UPDATE_RULE)), **now)
  cfg = types.SimpleNamespace(
      run=types.SimpleNamespace(do_train=True, output_dir="out", allow_resume_change=allowed,
                                seed=None),
      optimizer=types.SimpleNamespace(num_train_steps=num_train_steps))
  inputs = types.SimpleNamespace(
      resume_checkpoint="out/model.ckpt-%d" % step, resume_step=step, resume_position=4 * step,
      earlier_run={k: v for k, v in dict(record, **earlier).items() if v is not None},
      packing=types.SimpleNamespace(max_sequences=None))
  return resume_lib.resume_plan(cfg, inputs, record)


def test_a_resumed_run_says_how_its_learning_rate_and_data_order_changed():
  schedule = {k: 1 for k in resume_lib.SCHEDULE}
  order = {"shuffle_buffer": 10000, "tensorflow": "2.15"}
  same = _plan(dict(schedule=dict(schedule, peak=2e-3), data_order=order),
               dict(schedule=dict(schedule, peak=2e-3), data_order=order))
  assert same.lines == ["Data: continuing at sample 248 of the data order, the records the "
                        "run consumed up to step 62 (read, not parsed)"] and same.record_now
  # --scale_lr_by_ranks over another number of replicas: only the peak says it.
  peak = _plan(dict(schedule=dict(schedule, peak=2e-3), data_order=order),
               dict(schedule=dict(schedule, peak=1e-3), data_order=order))
  assert peak.lines[1:] == [
      "Learning rate: the peak (--learning_rate, x replicas with --scale_lr_by_ranks) was "
      "0.002, now 0.001 since model.ckpt-62: the schedule is the new one from step 63 on, so "
      "the learning rate there differs from the run's"]
  assert not peak.record_now  # the record follows at the first save
  # A changed flag is named once, not again as the peak it changes.
  flag = _plan(dict(schedule=dict(schedule, peak=2e-3), data_order=order),
               dict(schedule=dict(schedule, learning_rate=2, peak=4e-3), data_order=order))
  assert flag.lines[1].startswith("Learning rate: --learning_rate was 1, now 2 since ")
  # Nothing left to train: no schedule to speak of.
  done = _plan(dict(schedule=dict(schedule, num_train_steps=6), data_order=order),
               dict(schedule=dict(schedule, num_train_steps=4), data_order=order),
               step=6, num_train_steps=4)
  assert len(done.lines) == 1
  moved = _plan(dict(schedule=schedule, data_order=dict(order, tensorflow="1.15")),
                dict(schedule=schedule, data_order=order), allowed=("tensorflow",))
  assert moved.lines[1] == ("Data: tensorflow 1.15 -> 2.15 changed (--allow_resume_change): "
                            "continuing at sample 248 of the new data order")
  files = _plan(dict(schedule=schedule, data_order=order, train_files=[["part-9", 100]]),
                dict(schedule=schedule, data_order=order), allowed=("data",))
  assert files.lines[1].startswith("Data: the training files changed (")
  assert files.lines[1].endswith("; --allow_resume_change=data): continuing at sample 248 of "
                                 "their data order")
  # A record of an older version, without these keys: nothing to compare, nothing said.
  older = _plan({"schedule": None, "data_order": None}, dict(schedule=schedule,
                                                              data_order=order))
  assert len(older.lines) == 1


def test_a_resumed_run_says_how_the_ranks_gradients_combine_when_that_changed():
  def plan(was, now, replicas=2):
    rules = [dict(schedule={k: 1 for k in resume_lib.SCHEDULE},
                  data_order={"shuffle_buffer": 10000, "tensorflow": "2.15"},
                  update_rule={"cross_replica_gradients": rule, "lr_schedule_step": "update"})
             for rule in (was, now)]
    return _plan(*rules, replicas=replicas)

  changed = plan("sum", "mean")
  assert changed.lines[1:] == [
      "Gradients: averaged over the ranks since model.ckpt-62, were summed over 2 ranks "
      "(--cross_replica_gradients, the ranks)"]
  assert not changed.record_now
  assert plan("mean", "sum").lines[1:] == [
      "Gradients: summed over 2 ranks since model.ckpt-62, were averaged over the ranks "
      "(--cross_replica_gradients, the ranks)"]
  same = plan("mean", "mean")
  assert len(same.lines) == 1 and same.record_now
  # One replica's gradients are its own either way: nothing to say.
  assert len(plan("sum", "mean", replicas=1).lines) == 1


STOP_SCRIPT = """
import sys, time
from bert_pretrain.training import logs, signals
stop = signals.StopRequest()
stop.install()
if sys.argv[1] == "armed":
  stop.arm()
logger = logs.RunLogger(mllog_path=sys.argv[2], dllog_path=sys.argv[3])
logger.record("device", {"device": "CPU"})  # a part of the run starts
logger.mlperf("run_start", kind="start")
print("ready", flush=True)
while True:
  time.sleep(0.05)
  if stop.requested:
    print("requested", stop.signum, flush=True)
    break
while True:
  time.sleep(0.05)
"""


def _stop_script(mode, out):
  proc = subprocess.Popen([sys.executable, "-c", STOP_SCRIPT, mode, str(out / "mlperf.log"),
                           str(out / "dllog.json")],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=horovod_env())
  assert proc.stdout.readline() == "ready\n"
  return proc


def _report_lines(out):
  return report.format_summary(report.summarize(report.read_records(
      str(out / "dllog.json"))))


def _mlperf_keys(out):
  """The keys of out/mlperf.log's lines, with run_stop's status: ["run_start", ...]."""
  return [r["key"] + (":" + r["metadata"]["status"] if r["key"] == "run_stop" else "")
          for r in _mlperf_log(out)]


def test_a_second_signal_exits_at_once_and_a_quick_repeat_is_the_same_request(tmp_path):
  proc = _stop_script("armed", tmp_path)
  try:
    # Two signals within a second (in either order of arrival): one request.
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline() in ("requested 2\n", "requested 15\n")
    time.sleep(signals.REPEAT_WINDOW_S + 0.2)
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    stderr = proc.stderr.read()
    # The hint says a repeat counts only after the window.
    assert re.search(r"SIG(INT|TERM) received: finishing the current update, then saving a "
                     r"checkpoint \(send SIG(INT|TERM) again, 1 s or more later, to exit at "
                     r"once\)", stderr)
    assert "second SIGINT: exiting at once" in stderr
    assert "Traceback" not in stderr
    # The MLPerf log ends as a failed run's does, not cut short; the report says how.
    assert _mlperf_keys(tmp_path) == ["run_start", "run_stop:aborted"]
    assert ("the last part ended without a summary: second SIGINT: exiting at once; the run "
            "resumes from its last checkpoint") in _report_lines(tmp_path)
  finally:
    if proc.poll() is None:
      proc.kill()


def test_a_signal_before_training_starts_exits_at_once(tmp_path):
  proc = _stop_script("not-armed", tmp_path)
  try:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert "SIGTERM before training started: exiting (nothing to save)" in proc.stderr.read()
    assert _mlperf_keys(tmp_path) == ["run_start", "run_stop:aborted"]
    # Not taken for a run killed or failed.
    assert ("the last part ended without a summary: SIGTERM before training started: "
            "exiting (nothing to save)") in _report_lines(tmp_path)
  finally:
    if proc.poll() is None:
      proc.kill()
