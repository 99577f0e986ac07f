"""TensorFlow's own engines beside Horovod, on the CPU: MirroredStrategy over two logical
CPU devices and MultiWorkerMirroredStrategy over two local processes train the weights
of one card with the same global batch, evaluate as one card does, resume, stop at
SIGTERM after an update that every replica makes, with a checkpoint, and a killed worker
ends the job."""

import errno
import inspect
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import processes
from bert_pretrain.distributed import launch as launch_plan
from bert_pretrain.distributed import ranks as ranks_lib
from bert_pretrain.distributed import stacks
from conftest import (RANKS_MODULE, ROOT, assert_same_weights, base_flags, final_weights,
                      ordered_flags, passing_ranks_path, rank_command, run_pretraining,
                      start_command)


def _accuracy(stdout):
  found = re.findall(r"masked_lm_accuracy = ([\d.]+)", stdout)
  assert len(found) == 1, stdout[-3000:]
  return float(found[0])


def start_workers(flags, logs, count=2, own_flags=None):
  """Starts `count` multi_worker_mirrored processes of one job on this host, each told
  its place by TF_CONFIG as a cluster manager would, each writing to logs/worker-N.log
  (files: a pipe nobody reads would stall its worker, and with it the job); returns
  the Popens. own_flags: {worker index: flags that follow (and override) flags}."""
  workers = ["localhost:%d" % port for port in processes.free_ports(count)]
  logs.mkdir()
  procs = []
  for index in range(count):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
               TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                     "task": {"type": "worker", "index": index}}))
    with open(str(logs / ("worker-%d.log" % index)), "w") as log:
      procs.append(subprocess.Popen(
          rank_command("--distribution=multi_worker_mirrored", *flags,
                       *(own_flags or {}).get(index, [])), stdout=log,
          stderr=subprocess.STDOUT, universal_newlines=True, env=env))
  return procs


@pytest.mark.parametrize("ephemeral, below", [("32768\t60999\n", 32768),
                                               ("15000 60999\n", 15000),
                                               ("1024 65535\n", 20000), (None, 32768)])
def test_ports_for_local_workers_are_free_distinct_and_below_the_ephemeral_range(
    ephemeral, below, tmp_path):
  """No outgoing connection takes a port below the ephemeral range before its worker
  binds it; a range starting below 11000 leaves 10000-19999, none readable Linux's
  default (from 32768)."""
  path = tmp_path / "ip_local_port_range"
  if ephemeral is not None:
    path.write_text(ephemeral)
  assert processes.free_ports(0, str(path)) == []
  ports = processes.free_ports(40, str(path))
  assert len(set(ports)) == 40 and all(10000 <= p < below for p in ports), ports
  for port in ports:
    with socket.socket() as s:
      s.bind(("", port))


def test_ports_that_cannot_be_bound_but_for_being_in_use_are_an_error_not_a_search(
    monkeypatch):
  def refused(unused_socket, unused_address):
    raise PermissionError(errno.EACCES, "Permission denied")
  monkeypatch.setattr(socket.socket, "bind", refused)
  with pytest.raises(PermissionError):
    processes.free_ports(2)


def test_each_replicas_graph_is_built_by_the_code_as_written_not_autographs_conversion():
  """TensorFlow 2 runs a replica's function through AutoGraph unless told not to, which
  took seconds of every mirrored or multi_worker_mirrored start converting the model."""
  files = []

  def replica():
    files.append(inspect.currentframe().f_code.co_filename)
    return tf.constant(1)
  with tf.Graph().as_default():
    ranks = ranks_lib.Ranks(distribution="mirrored", devices=["/cpu:0", "/cpu:1"])
    with ranks.strategy.scope():
      assert len(ranks.each_replica(replica)) == 2
  assert files == [__file__] * 2


def finish(procs, logs, timeout=300):
  """Waits for every worker; returns their (exit status, output)."""
  try:
    return [(p.wait(timeout=timeout), (logs / ("worker-%d.log" % i)).read_text())
            for i, p in enumerate(procs)]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()


def engine_flags(data, out, batch, steps=3):
  """ordered_flags with 2 micro-batches per update and the evaluation at the end; --seed
  and a constant learning rate (--poly_power=0) let a run stopped after 2 updates resume
  to the same weights as one that made 3."""
  flags = [f for f in ordered_flags(data, out, batch, 2) if f != "--nodo_eval"]
  return flags + ["--eval_batch_size=5", "--seed=0", "--poly_power=0",
                  "--num_train_steps=%d" % steps]


@pytest.fixture(scope="module")
def one_card(equal_weight_data, tmp_path_factory):
  """One card, batch 8, 2 micro-batches per update, 3 updates, evaluated at the end."""
  out = tmp_path_factory.mktemp("one_card")
  one = run_pretraining(*engine_flags(equal_weight_data, out, 8))
  assert one.returncode == 0, one.stderr
  return out, _accuracy(one.stdout)


def test_mirrored_over_two_cpu_devices_trains_the_weights_of_one_card(
    equal_weight_data, one_card, tmp_path):
  out = tmp_path / "mirrored"
  two = run_pretraining(*engine_flags(equal_weight_data, out, 4) +
                        ["--distribution=mirrored", "--cpu_devices=2"])
  assert two.returncode == 0, two.stderr[-3000:]
  assert ("2 rank(s), batch 4 x 2 accumulation x 2 ranks = 16 sentences per update"
          in two.stdout)
  assert "2 logical devices (mirrored)" in two.stdout
  assert "Warning" not in two.stderr, two.stderr[-3000:]  # TensorFlow's, on the iterator
  # The replicas' sum, ordinary ops in one process, counts as the all-reduce.
  split = re.search(r"Update time \(update 3 traced, [\d.]+ s\): .*, all-reduce ([\d.]+)% "
                    r"\(another ([\d.]+)% overlapped", two.stdout)
  assert split and float(split.group(1)) + float(split.group(2)) > 0, two.stdout[-3000:]
  largest = assert_same_weights(one_card[0], out, equal_weight_data["init"])
  print("mirrored: largest weight difference to one card %.3g" % largest)
  # The evaluation of the trained weights equals one card's.
  assert _accuracy(two.stdout) == pytest.approx(one_card[1], abs=1e-9)


def test_mirrored_resumes_where_it_stopped(equal_weight_data, one_card, tmp_path):
  """2 updates, then the same command for 3: the data order goes on where the first run
  stopped (the 2 global batches skipped) and every replica starts from the checkpoint,
  so the weights are those of one card's 3 updates."""
  mirrored = ["--distribution=mirrored", "--cpu_devices=2"]
  first = run_pretraining(*engine_flags(equal_weight_data, tmp_path, 4, steps=2) + mirrored)
  assert first.returncode == 0, first.stderr[-3000:]
  second = run_pretraining(*engine_flags(equal_weight_data, tmp_path, 4) + mirrored)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "Resuming from" in second.stdout
  assert "Data: continuing at sample 32 of the data order" in second.stdout
  assert_same_weights(one_card[0], tmp_path, equal_weight_data["init"])


def test_mirrored_sums_the_replicas_gradients_as_the_reference_by_default(
    equal_weight_data, tmp_path):
  """Clipped on each replica, the gradients summed over 2 replicas are twice their mean,
  exactly: LAMB's update is then that of the mean with half the epsilon, and not that of
  the mean with the same epsilon (a large one, so that it shows)."""
  runs = {"summed": ["--epsilon=1e-2"],
          "averaged, half the epsilon": ["--cross_replica_gradients=mean", "--epsilon=5e-3"],
          "averaged": ["--cross_replica_gradients=mean", "--epsilon=1e-2"]}
  for name, extra in runs.items():
    out = tmp_path / name.replace(" ", "_").replace(",", "")
    flags = [f for f in engine_flags(equal_weight_data, out, 4)
             if not f.startswith("--cross_replica_gradients")]
    result = run_pretraining(*flags + extra + [
        "--distribution=mirrored", "--cpu_devices=2", "--gradient_clipping=per_micro_batch",
        "--nodo_eval"])
    assert result.returncode == 0, result.stderr[-3000:]
    runs[name] = out
    if name == "summed":
      assert "summed over the 2 ranks (MLPerf's reference)" in result.stdout
  same = assert_same_weights(runs["summed"], runs["averaged, half the epsilon"],
                             equal_weight_data["init"])
  _, summed = final_weights(runs["summed"])
  _, averaged = final_weights(runs["averaged"])
  other = max(float(np.abs(summed[n] - averaged[n]).max()) for n in summed)
  print("summed against averaged: %.3g with half the epsilon, %.3g with the same"
        % (same, other))
  assert other > 100 * max(same, 1e-7)


def test_mirrored_float16_skips_the_updates_that_overflow_on_every_replica(
    equal_weight_data, tmp_path):
  """An initial loss scale of 1e7 overflows: the replicas skip those updates together
  (without tf.cond, whose merge under a strategy broke the graph) until the scale fits."""
  result = run_pretraining(*engine_flags(equal_weight_data, tmp_path, 4, steps=2) + [
      "--distribution=mirrored", "--cpu_devices=2", "--amp_dtype=float16",
      "--init_loss_scale=1e7", "--display_loss_steps=1"])
  assert result.returncode == 0, result.stderr[-3000:]
  skipped = [int(n) for n in re.findall(r"skipped_steps: (\d+)", result.stdout)]
  assert len(skipped) == 2 and skipped[0] > 0, result.stdout[-3000:]
  step, weights = final_weights(tmp_path)
  assert step == 2 and all(np.isfinite(w).all() for w in weights.values())


def test_multi_worker_over_two_processes_trains_the_weights_of_one_card(
    equal_weight_data, one_card, tmp_path):
  out = tmp_path / "workers"
  flags = engine_flags(equal_weight_data, out, 4)
  results = finish(start_workers(flags, tmp_path / "logs"), tmp_path / "logs")
  for status, output in results:
    assert status == 0, output[-3000:]
  chief, other = results[0][1], results[1][1]
  assert "distribution multi_worker_mirrored" in chief
  # Only the chief logs and evaluates aloud; both take part.
  assert len(re.findall(r"Step 3,", chief)) == 1 and "Step 3," not in other
  largest = assert_same_weights(one_card[0], out, equal_weight_data["init"])
  print("multi_worker_mirrored: largest weight difference to one card %.3g" % largest)
  assert _accuracy(chief) == pytest.approx(one_card[1], abs=1e-9)


def test_a_killed_worker_ends_the_multi_worker_job(pretraining_data, tmp_path):
  # The stall timeout also bounds the workers' join: room for a loaded machine.
  stall = 30
  flags = base_flags(pretraining_data, tmp_path / "out", num_train_steps=10 ** 6,
                     display_loss_steps=5, nodo_eval=None, train_batch_size=4,
                     stall_timeout_s=stall)
  procs = start_workers(flags, tmp_path / "logs")
  chief_log = tmp_path / "logs" / "worker-0.log"
  try:
    deadline = time.time() + 120
    while ("Step 10," not in chief_log.read_text() and time.time() < deadline and
           all(p.poll() is None for p in procs)):
      time.sleep(0.5)
    assert "Step 10," in chief_log.read_text(), chief_log.read_text()[-3000:]
    killed_at = time.time()
    procs[1].send_signal(signal.SIGKILL)
    status = procs[0].wait(timeout=stall + 90)
    rest = chief_log.read_text()
    assert time.time() - killed_at < stall + 40
    assert status == 3, rest[-3000:]
    # The collectives fail when the peer's connection drops mid-call; when the survivor
    # waits for a message instead, the heartbeat watch names the silent worker.
    errors = [line for line in rest.splitlines() if line.startswith("run_pretraining: error:")]
    assert len(errors) == 1, rest[-3000:]
    assert ("TensorFlow's collective all-reduce stopped the job" in errors[0] or
            re.search(r"worker 1 \(localhost:\d+\) stalled: no sign of life for %d s" % stall,
                      errors[0])), errors[0]
    # No checkpoint yet (one every 100 updates): rerun, it starts over.
    assert ("no checkpoint was saved in %s yet: the same command run again starts over"
            % (tmp_path / "out")) in errors[0]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()


def test_a_worker_whose_peer_never_comes_ends_within_the_stall_timeout_naming_it(
    pretraining_data, tmp_path):
  flags = base_flags(pretraining_data, tmp_path / "out", nodo_eval=None, train_batch_size=4,
                     stall_timeout_s=20)
  workers = ["localhost:%d" % port for port in processes.free_ports(2)]
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
             TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                   "task": {"type": "worker", "index": 0}}))
  started = time.time()
  lone = subprocess.run(rank_command("--distribution=multi_worker_mirrored", *flags),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        universal_newlines=True, env=env, timeout=300)
  assert lone.returncode == 3, lone.stderr[-3000:]
  errors = [l for l in lone.stderr.splitlines() if l.startswith("run_pretraining: error:")]
  assert errors == [
      "run_pretraining: error: worker 1 (%s) did not join the job within "
      "--stall_timeout_s=20 (no heartbeat from it in %s); start every process of the job "
      "(2) with the same settings, or check its host and address; nothing was trained"
      % (workers[1], tmp_path / "out" / ".ranks")], lone.stderr[-3000:]
  assert "Step 1," not in lone.stdout
  print("a lone multi_worker_mirrored worker (--stall_timeout_s=20) ended after %.1f s "
        "with: %s" % (time.time() - started, errors[0]))


def test_workers_that_disagree_on_the_schedule_are_all_refused_at_start(pretraining_data,
                                                                         tmp_path):
  """--num_train_steps 6 and 12 made the workers wait before step 1 for ever."""
  started = time.time()
  procs = []
  logs = tmp_path / "logs"
  logs.mkdir()
  workers = ["localhost:%d" % port for port in processes.free_ports(2)]
  for index, steps in enumerate((6, 12)):
    flags = base_flags(pretraining_data, tmp_path / "out", nodo_eval=None,
                       train_batch_size=4, num_train_steps=steps, stall_timeout_s=60)
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
               TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                     "task": {"type": "worker", "index": index}}))
    with open(str(logs / ("worker-%d.log" % index)), "w") as log:
      procs.append(subprocess.Popen(
          rank_command("--distribution=multi_worker_mirrored", *flags), stdout=log,
          stderr=subprocess.STDOUT, env=env))
  results = finish(procs, logs, timeout=300)
  line = ("run_pretraining: error: the job's processes disagree on --num_train_steps "
          "(worker 0 (%s): 6, worker 1 (%s): 12); start every process with the same "
          "settings (nothing was trained)" % tuple(workers))
  for status, output in results:
    assert status == 2, output[-3000:]
    errors = [l for l in output.splitlines() if l.startswith("run_pretraining: error:")]
    assert errors == [line], output[-3000:]
  assert not os.path.exists(str(tmp_path / "out" / "model.ckpt-6.index"))
  print("multi_worker_mirrored workers with --num_train_steps 6 and 12 ended after %.1f s "
        "with: %s" % (time.time() - started, line))


PARTING_HANGS = """
import threading
from bert_pretrain.distributed import ranks as ranks_lib
ranks_lib.PARTING_TIMEOUT_S = 2
ranks = ranks_lib.Ranks("none")
ranks._workers, ranks.size = ["localhost:1", "localhost:2"], 2
calls = []
def gather(values, config):
  calls.append(values)
  if len(calls) == 1:
    return [values, [12.0]]
  threading.Event().wait()  # the parting collective, after the peer left: for ever
ranks._gather = gather
ranks.agree({"--num_train_steps": 6}, None)
print("agree returned")
"""


def test_a_worker_whose_parting_collective_hangs_still_ends_with_the_disagreement():
  """TensorFlow 1.15 could hang a worker in the collective after the settings' gather when
  its peer had passed it and exited: worker 0 then waited until the stall check called
  worker 1 stalled."""
  started = time.time()
  result = subprocess.run([sys.executable, "-c", PARTING_HANGS], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if "error" in l]
  assert errors == [
      "run_pretraining: error: the job's processes disagree on --num_train_steps (worker 0 "
      "(localhost:1): 6, worker 1 (localhost:2): 12); start every process with the same "
      "settings (nothing was trained)"], result.stderr[-3000:]
  assert "agree returned" not in result.stdout
  print("the hung parting collective ended after %.1f s" % (time.time() - started))


PARTING_AT_THE_END = """
import sys, threading
from bert_pretrain.distributed import ranks as ranks_lib
ranks_lib.PARTING_TIMEOUT_S = 1
ranks = ranks_lib.Ranks("none")
ranks._workers, ranks.size = ["localhost:1", "localhost:2", "localhost:3"], 3
ranks._folder = sys.argv[1]
ranks._gather = lambda values, config: threading.Event().wait()  # hangs, its peers gone
print("parting", flush=True)
ranks.part(5)
print("part returned")
"""


def start_parting(folder):
  """Worker 0 of 3 (the heartbeats in `folder`), at its run's end (status 5), in a parting
  collective that never returns; returns once it is in it."""
  proc = subprocess.Popen([sys.executable, "-c", PARTING_AT_THE_END, str(folder)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True,
                          env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"))
  assert proc.stdout.readline() == "parting\n", proc.communicate()[1][-3000:]
  return proc


def beat(folder, rank, doing):
  stacks.write_heartbeat(str(folder), rank, stacks.heartbeat_text(os.getpid(), 1, doing))


@pytest.mark.parametrize("peers", [
    ("done", "done"), ("ended", "parting"), ("parting", "parting"), ("stale", "none")])
def test_a_worker_whose_parting_collective_hangs_once_no_peer_is_busy_ends_with_its_status(
    peers, tmp_path):
  """TensorFlow 1.15 can hang a worker in a collective that its peer passed and exited
  after: at the end of a run, worker 0 waited for ever (its peer's heartbeat said done).
  Peers in the parting collective themselves, or whose heartbeat stopped, are not busy."""
  proc = start_parting(tmp_path)
  try:
    for rank, state in enumerate(peers, 1):
      if state == "done":
        stacks.write_heartbeat(str(tmp_path), rank, "done\n")
      elif state == "ended":
        stacks.write_heartbeat(str(tmp_path), rank, ranks_lib.ENDED + "a bad record\n")
      elif state == "stale":
        beat(tmp_path, rank, "drawing the report")
        os.utime(str(tmp_path / ("rank-%d" % rank)), (time.time() - 60,) * 2)
    deadline = time.time() + 60
    while proc.poll() is None and time.time() < deadline:  # the peers' heartbeats go on
      for rank, state in enumerate(peers, 1):
        if state == "parting":
          beat(tmp_path, rank, ranks_lib.PARTING)
      time.sleep(0.3)
    out, err = proc.communicate(timeout=1)
  finally:
    proc.kill()
  assert proc.returncode == 5, err[-3000:]
  assert "part returned" not in out
  assert "error" not in err, err[-3000:]
  assert (tmp_path / "rank-0").read_text() == "done\n"


def test_a_worker_in_its_parting_collective_waits_for_a_peer_still_busy(tmp_path):
  """The chief may still draw its report while its peers wait to part: they stay while its
  heartbeat says it works, and end once it says done."""
  proc = start_parting(tmp_path)
  try:
    stacks.write_heartbeat(str(tmp_path), 2, "done\n")
    for _ in range(20):  # 6 s; the parting's timeout is 1 s
      beat(tmp_path, 1, "drawing the report")
      time.sleep(0.3)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    stacks.write_heartbeat(str(tmp_path), 1, "done\n")
    out, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 5, err[-3000:]
  assert "part returned" not in out


WATCHING = """
import sys
from bert_pretrain.distributed import ranks as ranks_lib
ranks = ranks_lib.Ranks("none")
ranks.size, ranks.stall_timeout_s, ranks._folder = 3, 2, sys.argv[1]
if sys.argv[2] == "multi_worker_mirrored":
  ranks._workers = ["localhost:1", "localhost:2", "localhost:3"]
print("watching", flush=True)
ranks._watch()
"""


@pytest.mark.parametrize("engine, named", [
    ("multi_worker_mirrored", "worker 1 (localhost:2), worker 2 (localhost:3)"),
    ("horovod", "rank 1, 2")])
def test_the_stall_line_names_silent_peers_as_the_engine_knows_them(engine, named, tmp_path):
  """A multi_worker_mirrored user starts workers by host:port, not by rank."""
  folder = tmp_path / "out" / ".ranks"
  folder.mkdir(parents=True)
  proc = subprocess.Popen([sys.executable, "-c", WATCHING, str(folder), engine],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True,
                          env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"))
  try:
    assert proc.stdout.readline() == "watching\n", proc.communicate()[1][-3000:]
    for rank in (1, 2):  # one sign of life each, then none
      beat(folder, rank, "update 7: the gradients' all-reduce")
    err = proc.communicate(timeout=60)[1]
  finally:
    proc.kill()
  assert proc.returncode == 3, err[-3000:]
  errors = [line for line in err.splitlines() if line.startswith("run_pretraining: error:")]
  assert len(errors) == 1 and errors[0].startswith(
      "run_pretraining: error: %s stalled: no sign of life for 2 s" % named), err[-3000:]
  assert "update 7: the gradients' all-reduce" in (tmp_path / "out" /
                                                   "stall-rank-1.txt").read_text()


def test_a_bad_record_a_peers_collective_passed_on_is_the_jobs_error_not_this_workers():
  """TensorFlow 1.15 passed worker 1's DataLossError on to worker 0, which named its own
  (good) records as bad; now it names the peer and its error line."""
  ranks = ranks_lib.Ranks("none")
  from_peer = tf.errors.DataLossError(None, None, (
      '[_Derived_]corrupted record at 23480\nAdditional GRPC error information:\n'
      '{"description":"Error received from peer","grpc_status":15}'))
  own = tf.errors.DataLossError(None, None, "corrupted record at 23480")
  assert not ranks.is_job_error(from_peer)  # one process: no peer
  ranks.size = 2
  assert ranks.is_job_error(from_peer) and not ranks.is_job_error(own)


def _wait_for(path, text, procs, timeout=180):
  """Waits until the file at `path` contains `text`; fails if a process ended first."""
  deadline = time.time() + timeout
  while text not in (path.read_text() if path.exists() else ""):
    assert all(p.poll() is None for p in procs), path.read_text()[-3000:]
    assert time.time() < deadline, "no %r in %s" % (text, path)
    time.sleep(0.05)


def _stop_step(output):
  found = re.search(r"SIGTERM: rank \d+ stops after step (\d+)", output)
  assert found, output[-3000:]
  return int(found.group(1))


def _assert_latest_checkpoint(output_dir, step):
  latest = tf.train.latest_checkpoint(str(output_dir))
  assert latest and latest.endswith("model.ckpt-%d" % step), latest


def _logged(step, output):
  """Whether `output` has the chief's line of training step `step`."""
  return re.search(r"^Step %d," % step, output, re.M) is not None


def test_mirrored_stops_at_sigterm_with_a_checkpoint_and_the_rerun_continues(
    pretraining_data, tmp_path):
  flags = base_flags(pretraining_data, tmp_path / "out", num_train_steps=10 ** 6,
                     display_loss_steps=1, nodo_eval=None, train_batch_size=4,
                     distribution="mirrored", cpu_devices=2)
  log = tmp_path / "run.log"
  proc = start_command(RANKS_MODULE, *flags, stdout=log, stderr=log)
  try:
    _wait_for(log, "Step 3,", [proc])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, log.read_text()[-3000:]
  finally:
    if proc.poll() is None:
      proc.kill()
  stopped = log.read_text()
  step = _stop_step(stopped)
  assert step >= 3 and _logged(step, stopped) and not _logged(step + 1, stopped), stopped[-3000:]
  _assert_latest_checkpoint(tmp_path / "out", step)
  rerun = run_pretraining(*[f for f in flags if not f.startswith("--num_train_steps")] +
                          ["--num_train_steps=%d" % (step + 2)])
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "Resuming from %s at step %d" % (tmp_path / "out" / ("model.ckpt-%d" % step),
                                          step) in rerun.stdout
  assert _logged(step + 2, rerun.stdout) and not _logged(step, rerun.stdout), rerun.stdout[-3000:]
  _assert_latest_checkpoint(tmp_path / "out", step + 2)


def test_a_signalled_worker_stops_the_multi_worker_job_at_one_step_with_a_checkpoint(
    pretraining_data, tmp_path):
  """SIGTERM reaches one worker only (the other is not the chief): the workers agree in
  the update's all-reduce and both stop after the same step; the chief saves it, and the
  job started again resumes there."""
  out = tmp_path / "out"
  flags = base_flags(pretraining_data, out, num_train_steps=10 ** 6, display_loss_steps=1,
                     nodo_eval=None, train_batch_size=4)
  procs = start_workers(flags, tmp_path / "logs")
  try:
    _wait_for(tmp_path / "logs" / "worker-0.log", "Step 3,", procs)
    procs[1].send_signal(signal.SIGTERM)
    results = finish(procs, tmp_path / "logs", timeout=120)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for status, output in results:
    assert status == 143, output[-3000:]
  chief, other = results[0][1], results[1][1]
  step = _stop_step(chief)
  assert _stop_step(other) == step >= 3
  assert _logged(step, chief) and not _logged(step + 1, chief), chief[-3000:]
  _assert_latest_checkpoint(out, step)

  again = [f for f in flags if not f.startswith("--num_train_steps")] + [
      "--num_train_steps=%d" % (step + 2)]
  results = finish(start_workers(again, tmp_path / "logs_again"), tmp_path / "logs_again")
  for status, output in results:
    assert status == 0, output[-3000:]
  assert "Resuming from %s at step %d" % (out / ("model.ckpt-%d" % step), step) in results[0][1]
  assert _logged(step + 2, results[0][1]) and not _logged(step, results[0][1]), (
      results[0][1][-3000:])
  _assert_latest_checkpoint(out, step + 2)


@pytest.mark.parametrize("tf_config,message", [
    ("{not json", "TF_CONFIG is not a cluster of workers"),
    ('{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}}',
     "TF_CONFIG names jobs ['chief', 'worker']; --distribution=multi_worker_mirrored runs "
     "workers only"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}',
     "TF_CONFIG's task {\"type\": \"worker\", \"index\": 2} is not one of its 2 workers"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}}',
     "TF_CONFIG's task (none, and no launcher rank) is not one of its 2 workers"),
])
def test_a_tf_config_that_cannot_work_is_named(tf_config, message, monkeypatch):
  monkeypatch.setenv("TF_CONFIG", tf_config)
  for name in ranks_lib.RANK_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  with pytest.raises(ValueError, match=re.escape(message)) as error:
    ranks_lib.multi_worker_config()
  assert "set TF_CONFIG=" in str(error.value) and "\n" not in str(error.value)


def test_a_launcher_rank_places_a_worker_that_tf_config_leaves_open(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["h1:2222", "h2:2222"]}}')
  monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
  assert ranks_lib.multi_worker_config() == (["h1:2222", "h2:2222"], 1)


def test_the_plan_starts_one_multi_worker_process_per_host_named_by_tf_config():
  job = launch_plan.plan(["--gloo", "-H", "h1:8,h2:8"], per_host=8,
                         distribution="multi_worker_mirrored")
  assert launch_plan.launcher(job, "multi_worker_mirrored", port=2222) == [
      "env", 'TF_CONFIG={"cluster":{"worker":["h1:2222","h2:2222"]}}', "horovodrun",
      "-np", "2", "-H", "h1:1,h2:1", "--gloo"]
  assert launch_plan.summary(job, "multi_worker_mirrored") == (
      "Launching 2 processes on 2 hosts, each driving 8 cards (multi_worker_mirrored)")
  one_host = launch_plan.plan(["--gloo"], per_host=4, distribution="multi_worker_mirrored")
  assert launch_plan.launcher(one_host, "multi_worker_mirrored") == []
  # On a host without cards the process's replica is its CPU, whatever the count per host.
  assert launch_plan.summary(one_host, "multi_worker_mirrored", cpu=True) == (
      "Launching 1 process, one replica on this host's CPU (multi_worker_mirrored)")
  assert launch_plan.summary(one_host, "multi_worker_mirrored") == (
      "Launching 1 process driving 4 cards (multi_worker_mirrored)")


def test_mirrored_refuses_several_hosts():
  with pytest.raises(launch_plan.LaunchError,
                     match="DISTRIBUTION=mirrored drives the cards of one host but -H h1,h2 "
                     "names 2; use DISTRIBUTION=multi_worker_mirrored or horovod"):
    launch_plan.plan(["-H", "h1,h2"], per_host=8, distribution="mirrored")


def test_the_script_runs_mirrored_as_one_process_without_horovodrun(tmp_path):
  # The process's check of its inputs (DRY_RUN=1) passes: /data is not here.
  (tmp_path / "bin").mkdir()
  (tmp_path / "run").mkdir()
  env = dict(os.environ, DRY_RUN="1", DISTRIBUTION="mirrored", IX_NUM_CUDA_VISIBLE_DEVICES="2",
             PATH=passing_ranks_path(tmp_path / "bin"))
  env.pop("CUDA_VISIBLE_DEVICES", None)
  result = subprocess.run(["bash", os.path.join(ROOT, "run_multi_card_FPS.sh"),
                           "--input_files_dir=/data/train"], cwd=str(tmp_path / "run"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env, timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [
      "Launching 1 process driving 2 logical CPU devices (mirrored): python3 -m "
      "bert_pretrain.run_pretraining --preset=multi_card --distribution=mirrored "
      "--cpu_devices=2 --input_files_dir=/data/train",
      "DRY_RUN=1: the flags and run_pretraining --check_only on this host pass; nothing was "
      "started"]
  bad = subprocess.run(["bash", os.path.join(ROOT, "run_multi_card_FPS.sh")],
                       cwd=str(tmp_path / "run"), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True,
                       env=dict(env, DISTRIBUTION="nccl"), timeout=60)
  assert bad.returncode == 2
  assert ("run_multi_card_FPS: error: DISTRIBUTION=nccl is not one of horovod, mirrored, "
          "multi_worker_mirrored; unset it for Horovod") in bad.stderr
  assert os.listdir(str(tmp_path / "run")) == []


@pytest.mark.parametrize("distribution", ["none", "mirrored", "multi_worker_mirrored"])
def test_several_launched_processes_of_a_one_process_engine_are_refused(distribution,
                                                                        monkeypatch):
  monkeypatch.setenv("HOROVOD_SIZE", "2")
  monkeypatch.delenv("TF_CONFIG", raising=False)
  with pytest.raises(ValueError, match=re.escape(
      "the launcher started 2 processes (HOROVOD_SIZE) but --distribution=%s runs one "
      "process" % distribution)):
    ranks_lib.Ranks(distribution)


def test_the_script_trains_mirrored_on_a_cpu_host_with_its_count_per_host(pretraining_data,
                                                                          tmp_path):
  """DISTRIBUTION=mirrored IX_NUM_CUDA_VISIBLE_DEVICES=2 on a host without GPUs: no card
  list for TensorFlow to look for, two logical CPU devices instead."""
  env = dict(os.environ, DISTRIBUTION="mirrored", IX_NUM_CUDA_VISIBLE_DEVICES="2",
             TF_CPP_MIN_LOG_LEVEL="2",
             PATH="%s:%s" % (os.path.dirname(sys.executable), os.environ["PATH"]))
  env.pop("CUDA_VISIBLE_DEVICES", None)
  flags = base_flags(pretraining_data, tmp_path / "out", train_batch_size=4, num_train_steps=2,
                     num_accumulation_steps=1, nodo_eval=None)
  result = subprocess.run(["bash", os.path.join(ROOT, "run_multi_card_FPS.sh")] + flags,
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "CUDA_VISIBLE_DEVICES" not in result.stdout.splitlines()[0]
  assert "2 logical devices (mirrored)" in result.stdout
  assert "Step 2," in result.stdout
