"""Several ranks with Horovod (Gloo and MPI) on the CPU: same weights as one card with
the same global batch, distributed evaluation, a killed rank, and the launcher script."""

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from bert_pretrain.distributed import horovodrun as horovodrun_lib
from bert_pretrain.distributed import launch as launch_plan
from bert_pretrain.training import logs
from conftest import (INSTALLED_PATH, ROOT, assert_same_weights, base_flags,
                      can_look_into_descriptors, forking_env, horovod_env,
                      kill_tree, launcher_env, ordered_flags, rank_command, rank_pid,
                      run_multi_card_script, run_pretraining, stuck_process_state)


def launch(launcher, flags, timeout=240, **env):
  """Runs the training module under `launcher` (a list: horovodrun ... or mpirun ...)."""
  return subprocess.run(launcher + rank_command("--horovod", *flags), stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, universal_newlines=True, env=horovod_env(**env),
                        timeout=timeout)


GLOO = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"]
HOROVODRUN_MPI = ["horovodrun", "-np", "2", "-H", "localhost:2", "--mpi"]
MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"]


@pytest.mark.parametrize("launcher,accumulation", [(GLOO, 1), (HOROVODRUN_MPI, 2)],
                         ids=["gloo", "mpi-accumulation"])
def test_two_ranks_match_one_card_with_twice_the_batch(equal_weight_data, tmp_path, launcher,
                                                       accumulation):
  one = run_pretraining(*ordered_flags(equal_weight_data, tmp_path / "one", 8, accumulation))
  assert one.returncode == 0, one.stderr
  two = launch(launcher, ordered_flags(equal_weight_data, tmp_path / "two", 4, accumulation),
               PYTHONUNBUFFERED="1")
  assert two.returncode == 0, two.stdout[-3000:]
  # mpirun tags each piece it reads: a line written in two pieces ends with a tag.
  assert not re.search(r"<std(out|err)>:$", two.stdout, re.M), two.stdout[-3000:]
  assert "2 rank(s), batch 4 x %d accumulation x 2 ranks = %d sentences" % (
      accumulation, 8 * accumulation) in two.stdout
  assert_same_weights(tmp_path / "one", tmp_path / "two", equal_weight_data["init"])
  # Only rank 0 writes: one checkpoint set, one log of 3 steps.
  assert len(re.findall(r"Step 3,", two.stdout)) == 1
  # Its traced update (the last: the run ends within its FPS warm-up) spent time inside
  # Horovod's all-reduce, exposed or overlapped by other ops; one card's has none.
  split = re.search(r"Update time \(update 3 traced, [\d.]+ s\): input ([\d.]+)%, compute "
                    r"([\d.]+)%, all-reduce ([\d.]+)% \(another ([\d.]+)% overlapped",
                    two.stdout)
  assert split and float(split.group(3)) + float(split.group(4)) > 0, two.stdout[-3000:]
  assert sum(float(part) for part in split.groups()[:3]) == pytest.approx(100, abs=0.2)
  assert not re.search(r"all-reduce|overlapped", re.search(r"Update time .*", one.stdout).group(0))


class _Writes(io.RawIOBase):
  """A raw stream that keeps each write it is given."""

  def __init__(self):
    super(_Writes, self).__init__()
    self.pieces = []

  def writable(self):
    return True

  def write(self, data):
    self.pieces.append(bytes(data))
    return len(data)


def test_each_console_line_is_written_in_one_piece_even_unbuffered(monkeypatch):
  """As under PYTHONUNBUFFERED=1: a text stream writing through to the file."""
  streams = {name: io.TextIOWrapper(_Writes(), write_through=True)
             for name in ("stdout", "stderr")}
  for name, stream in streams.items():
    monkeypatch.setattr(sys, name, stream)
  print("Step 50, total_loss: 7.1")
  assert streams["stdout"].buffer.pieces == [b"Step 50, total_loss: 7.1", b"\n"]
  logs.whole_lines()
  print("| 2 cards | acc 0.055584 | fps 947.94 | status no target |")
  print("error: one line", file=sys.stderr)
  assert streams["stdout"].buffer.pieces[2:] == [
      b"| 2 cards | acc 0.055584 | fps 947.94 | status no target |\n"]
  assert streams["stderr"].buffer.pieces == [b"error: one line\n"]


def test_two_ranks_sum_their_gradients_by_default_as_the_reference(equal_weight_data,
                                                                    tmp_path):
  """Clipped per micro-batch, 2 Horovod ranks' summed gradients (the default) update as
  TensorFlow's mirrored replicas averaging them with half the epsilon (LAMB)."""
  def flags(out, *extra):
    return [f for f in ordered_flags(equal_weight_data, out, 4, 1)
            if not f.startswith("--cross_replica_gradients")] + [
                "--gradient_clipping=per_micro_batch"] + list(extra)

  summed = launch(GLOO, flags(tmp_path / "summed", "--epsilon=1e-2"))
  assert summed.returncode == 0, summed.stdout[-3000:]
  assert "summed over the 2 ranks (MLPerf's reference)" in summed.stdout
  averaged = run_pretraining(*flags(tmp_path / "averaged", "--epsilon=5e-3",
                                    "--cross_replica_gradients=mean",
                                    "--distribution=mirrored", "--cpu_devices=2"))
  assert averaged.returncode == 0, averaged.stderr[-3000:]
  assert_same_weights(tmp_path / "summed", tmp_path / "averaged", equal_weight_data["init"])


def test_distributed_eval_equals_single_card_eval(equal_weight_data, tmp_path):
  flags = lambda out: base_flags(equal_weight_data, out, init_checkpoint=equal_weight_data["init"],
                                 bert_config_file=equal_weight_data["config"], nodo_train=None,
                                 eval_batch_size=5)
  one = run_pretraining(*flags(tmp_path / "one"))
  assert one.returncode == 0, one.stderr
  two = launch(MPIRUN, flags(tmp_path / "two"))
  assert two.returncode == 0, two.stdout[-3000:]
  pattern = r"masked_lm_accuracy = ([\d.]+)"
  acc_one = float(re.search(pattern, one.stdout).group(1))
  acc_two = [float(a) for a in re.findall(pattern, two.stdout)]
  assert len(acc_two) == 1  # rank 0 reports
  assert acc_two[0] == pytest.approx(acc_one, abs=1e-9)
  samples = lambda s: int(re.search(r"eval_samples = (\d+)", s).group(1))
  assert samples(two.stdout) == samples(one.stdout) > 0
  loss = lambda s: float(re.search(r"masked_lm_loss = ([\d.]+)", s).group(1))
  assert loss(two.stdout) == pytest.approx(loss(one.stdout), rel=1e-5)


def test_a_killed_rank_ends_the_job_quickly(pretraining_data, tmp_path):
  flags = base_flags(pretraining_data, tmp_path / "out", num_train_steps=10 ** 6,
                     display_loss_steps=5, nodo_eval=None)
  proc = subprocess.Popen(GLOO + rank_command("--horovod", *flags), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, env=horovod_env())
  try:
    deadline = time.time() + 120
    for line in proc.stdout:
      if "Step 5," in line or time.time() > deadline:
        break
    killed_at = time.time()
    os.kill(rank_pid(proc, 1), signal.SIGKILL)  # this job's rank 1, nobody else's
    proc.stdout.read()
    status = proc.wait(timeout=90)
    assert time.time() - killed_at < 60
    assert status != 0
  finally:
    if proc.poll() is None:
      proc.kill()


def test_multi_card_script_runs_the_demo_on_two_ranks(tmp_path):
  """With the installed horovodrun (the other tests answer its build check from the session's)."""
  result = subprocess.run(
      ["bash", os.path.join(ROOT, "run_multi_card_FPS.sh"), "--num_train_steps=4",
       "--display_loss_steps=2", "--samples_between_eval=128", "--max_eval_steps=2",
       "--demo_cache_dir=%s" % (tmp_path / "cache")],
      cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      universal_newlines=True, timeout=400,
      env=launcher_env(IX_NUM_CUDA_VISIBLE_DEVICES="2", PATH=INSTALLED_PATH))
  assert result.returncode == 0, result.stdout[-3000:]
  out = result.stdout
  assert "Launching 2 ranks on 1 host (2 per host): horovodrun -np 2 -H localhost:2 --gloo" in out
  assert "2 rank(s)" in out and "Step 4," in out
  # Before training, after update 2 (2 ranks x 32 x 2 = 128 samples; the ranks agree
  # first that no stop came) and after training.
  assert out.count("***** Eval results *****") == 3
  assert re.search(r"\| 2 cards \| acc [\d.]+ \| fps [\d.]+ \|", out)
  # One folder for the launch's ranks, and one rank told of the demo.
  demo_runs = os.listdir(str(tmp_path / "results"))
  assert len(demo_runs) == 1 and demo_runs[0].startswith("demo-")
  assert out.count("running the embedded demo") == 1
  assert "demo: fine-tuning" not in out  # the downstream step follows runs of one process


def _stop_as_kill(pid):
  os.kill(pid, signal.SIGTERM)


def _stop_as_timeout(pid):  # GNU timeout: the command's pid, then its own process group
  os.kill(pid, signal.SIGTERM)
  time.sleep(0.2)  # not at once: two signals pending together would be one
  os.killpg(pid, signal.SIGTERM)


def _stop_as_ctrl_c_twice(pid):  # the terminal: the foreground process group
  os.killpg(pid, signal.SIGINT)
  time.sleep(2)  # a user pressing it again
  os.killpg(pid, signal.SIGINT)


def _stop_as_sigkill(pid):  # the launcher killed (OOM, kill -9): the job stops all the same
  os.kill(pid, signal.SIGKILL)


def _stop_as_ctrl_c(pid):  # the terminal: the foreground process group
  os.killpg(pid, signal.SIGINT)


@pytest.mark.parametrize("stop,status", [(_stop_as_kill, 143), (_stop_as_timeout, 143),
                                         (_stop_as_ctrl_c, 130),
                                         (_stop_as_sigkill, -signal.SIGKILL)],
                         ids=["kill", "timeout", "ctrl-c", "sigkill"])
def test_a_signal_to_the_script_of_an_mpi_job_stops_its_ranks_with_a_checkpoint(
    pretraining_data, tmp_path, stop, status):
  """horovodrun --mpi hands over to `sh -c "mpirun ..."`: a shell that dies alone, and an
  mpirun that leaves its ranks running at a second signal. The launcher signals the ranks
  itself; its end is a SIGTERM to mpirun, which passes it on to them."""
  out = tmp_path / "out"
  # A line every 200 updates: a killed launcher's mpirun sleeps through its
  # odls_base_sigkill_timeout before passing SIGTERM on and reads no output meanwhile, and
  # a rank that fills its terminal's buffer in that time blocks (the tiny model on a fast
  # CPU, a line every 5 updates, did within 10 s).
  flags = base_flags(pretraining_data, out, num_train_steps=10 ** 6, display_loss_steps=200,
                     save_checkpoints_steps=10 ** 6, nodo_eval=None)
  run_args = "--mpi --mpi-args=--oversubscribe"  # the launcher's odls_base_sigkill_timeout
  proc = subprocess.Popen(
      ["bash", os.path.join(ROOT, "run_multi_card_FPS.sh")] + flags, cwd=str(tmp_path),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      start_new_session=True,  # a process group of its own to signal
      env=launcher_env(IX_NUM_CUDA_VISIBLE_DEVICES="2", HOROVOD_RUN_ARGS=run_args,
                       PATH=INSTALLED_PATH))
  ranks = lambda: subprocess.run(["pgrep", "-f", "^[^ ]*python[0-9.]* -m bert_pretrain"
                                  ".run_pretraining .*" + str(out)],
                                 stdout=subprocess.PIPE).stdout.split()
  end_job = lambda: subprocess.run(["pkill", "-KILL", "-f", "run_pretraining .*" + str(out)])
  watchdog = threading.Timer(400, end_job)  # a job printing nothing ends the reading
  watchdog.start()
  try:
    seen = []
    for line in proc.stdout:
      seen.append(line)
      if "Step 200," in line:
        break
    assert len(ranks()) == 2, "".join(seen[-30:])
    stop(proc.pid)
    stopped = None  # when rank 0 said it stops
    for line in proc.stdout:
      seen.append(line)
      if re.search(r"SIG[A-Z]+: rank 0 stops after step", line):
        stopped = time.time()
    proc.wait(timeout=120)
    ended = time.time()
    text = "".join(seen)
    assert proc.returncode == status, text[-4000:]  # 128 + the signal passed on to mpirun
    stop_step = int(re.search(r"SIG[A-Z]+: rank 0 stops after step (\d+)", text).group(1))
    assert os.path.exists(str(out / ("model.ckpt-%d.index" % stop_step))), text[-4000:]
    assert not ranks(), text[-4000:]
    if stop is not _stop_as_sigkill:
      # Rank 0's last line came through all the same.
      assert "report: not drawn after SIG" in text, text[-4000:]
      # The launcher ends mpirun once the ranks have: it would sleep through its
      # odls_base_sigkill_timeout once a rank.
      if can_look_into_descriptors():
        assert ended - stopped < launch_plan.MPI_SIGKILL_TIMEOUT_S, text[-4000:]
  finally:  # the job's processes, whichever the script left
    watchdog.cancel()
    end_job()


# A rank that stops as run_pretraining does: its first SIGTERM takes SAVE_S to "save", a
# later one a second or more after it ends it at once; with SAVE_S "never" it never ends by
# itself and ignores later ones. As run_pretraining's last barrier, each rank waits (30 s
# at most) for both ranks' saves before it exits: the launcher ends the job at a rank's
# exit, and under load one rank can take the signal a moment later than the other.
_FAKE_RANK = """
import os, signal, sys, time
out, save_s = sys.argv[1], sys.argv[2]
rank = os.environ.get("HOROVOD_RANK") or os.environ["OMPI_COMM_WORLD_RANK"]

def now(unused_signum, unused_frame):  # a second signal a second or more after the first
  if time.time() - first[0] >= 1:
    os._exit(143)

def stop(unused_signum, unused_frame):
  first.append(time.time())
  signal.signal(signal.SIGTERM, signal.SIG_IGN if save_s == "never" else now)
  sys.stderr.write("rank: SIGTERM received: finishing the current update\\n")
  sys.stderr.flush()
  while save_s == "never":
    time.sleep(1)
  time.sleep(float(save_s))
  open(os.path.join(out, "saved-" + rank), "w").close()
  if rank == "0":
    print("report: not drawn after SIGTERM; python3 -m bert_pretrain.training.report o "
          "draws it", flush=True)
  waited = time.time()
  while (not all(os.path.exists(os.path.join(out, "saved-%d" % r)) for r in (0, 1)) and
         time.time() - waited < 30):
    time.sleep(0.05)
  sys.exit(143)

first = []

signal.signal(signal.SIGTERM, stop)
open(os.path.join(out, "ready-" + rank), "w").close()
while True:
  time.sleep(0.1)
"""
HOROVODRUN_MPI_OVERSUBSCRIBED = HOROVODRUN_MPI + ["--mpi-args=--oversubscribe"]


def _signal_job(tmp_path, save_s, stop, grace_s=launch_plan.STOP_GRACE_S, horovodrun=GLOO,
                sigint="SIG_DFL"):
  """Runs 2 _FAKE_RANKs under the script's launcher (launch.py run horovodrun ...),
  stop(pid)s it once both are ready; returns (exit status, seconds from the signal to the
  end, the ranks that saved, the output). sigint="SIG_IGN" starts the launcher as a
  script's background job (`&`) starts it."""
  (tmp_path / "rank.py").write_text(_FAKE_RANK)
  # SIGHUP as from a terminal: a suite run under nohup would hand it on ignored.
  launcher = ("import signal, sys\n"
              "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
              "signal.signal(signal.SIGINT, signal.%s)\n"
              "from bert_pretrain.distributed import launch\n"
              "launch.STOP_GRACE_S = %r\n"
              "sys.exit(launch.run(sys.argv[1:]))\n" % (sigint, grace_s))
  proc = subprocess.Popen(
      [sys.executable, "-c", launcher] + horovodrun + [
          sys.executable, str(tmp_path / "rank.py"), str(tmp_path), str(save_s)],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      cwd=str(tmp_path), env=horovod_env(), start_new_session=True)
  try:
    deadline = time.time() + 120
    while not all((tmp_path / ("ready-%d" % rank)).exists() for rank in (0, 1)):
      if proc.poll() is not None or time.time() > deadline:
        # What each process of the launch is doing (the launcher's stacks go to the
        # output); horovodrun --mpi's child has a process group of its own.
        state = stuck_process_state(proc) if proc.poll() is None else ""
        kill_tree(proc.pid)
        pytest.fail("the ranks did not start: %s\n%s" % (
            state, proc.communicate(timeout=60)[0][-6000:]))
      time.sleep(0.1)
    signalled = time.time()
    stop(proc.pid)
    output = proc.communicate(timeout=grace_s + 120)[0]
    seconds = time.time() - signalled
  finally:
    if proc.poll() is None:
      kill_tree(proc.pid)
    subprocess.run(["pkill", "-KILL", "-f", str(tmp_path / "rank.py")])
  saved = sorted(int(name.split("-")[1]) for name in os.listdir(str(tmp_path))
                 if name.startswith("saved-"))
  return proc.returncode, seconds, saved, output


def _stop_as_hangup(pid):  # the terminal or ssh session that started the script closed
  os.kill(pid, signal.SIGHUP)


def _stop_as_a_scheduler(pid):  # Slurm's scancel or time limit: every process of the job
  import psutil  # pylint: disable=g-import-not-at-top  (Horovod's dependency)
  launcher = psutil.Process(pid)
  for process in [launcher] + launcher.children(recursive=True):
    try:
      process.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
      pass


_CONTROLLERS = {"gloo": GLOO, "mpi": HOROVODRUN_MPI_OVERSUBSCRIBED}


@pytest.mark.parametrize("controller,stop", [
    ("gloo", _stop_as_kill), ("gloo", _stop_as_timeout), ("gloo", _stop_as_hangup),
    ("gloo", _stop_as_a_scheduler), ("mpi", _stop_as_kill), ("mpi", _stop_as_a_scheduler)],
                         ids=["gloo-kill", "gloo-timeout", "gloo-hangup", "gloo-scheduler",
                              "mpi-kill", "mpi-scheduler"])
def test_a_signal_to_the_launcher_or_to_every_process_leaves_the_ranks_time_to_save(
    tmp_path, controller, stop):
  """horovodrun --gloo alone kills its ranks 5 s after passing a signal on, mpirun after
  its odls_base_sigkill_timeout (10 s), or at once at a second signal; through the
  launcher the ranks get the signal and end by themselves, here after 8 s (3 s when
  mpirun got the signal too: it still kills them 10 s later)."""
  save_s = 3 if stop is _stop_as_a_scheduler else 8
  status, seconds, saved, output = _signal_job(tmp_path, save_s, stop,
                                               horovodrun=_CONTROLLERS[controller])
  # 128 + the signal the launcher got; the ranks got SIGTERM.
  assert (status, saved) == (129 if stop is _stop_as_hangup else 143, [0, 1]), output[-3000:]
  assert seconds >= save_s, output[-3000:]
  assert output.count("rank: SIGTERM received") == 2, output[-3000:]
  if controller == "gloo":
    assert output.strip().splitlines()[-1].endswith(
        "after the job's %s; run the same command again to resume from its last "
        "checkpoint" % ("SIGHUP (passed on to the ranks as SIGTERM)"
                        if stop is _stop_as_hangup else "SIGTERM")), output[-3000:]


def test_sigusr2_to_the_launcher_writes_its_stacks_and_the_job_goes_on(tmp_path):
  def stacks_then_stop(pid):
    os.kill(pid, signal.SIGUSR2)
    time.sleep(2)
    os.kill(pid, signal.SIGTERM)

  status, _, saved, output = _signal_job(tmp_path, 1, stacks_then_stop,
                                         horovodrun=HOROVODRUN_MPI_OVERSUBSCRIBED)
  assert (status, saved) == (143, [0, 1]), output[-3000:]
  # The launcher waits for its child, which became mpirun.
  assert re.search(r'File ".*launch\.py", line [0-9]+ in run_mpirun_in_child', output), output


def _stop_as_kill_int(pid):
  os.kill(pid, signal.SIGINT)


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_kill_int_stops_a_job_started_in_the_background_of_a_script(tmp_path, controller):
  """A script's `&` starts its job with SIGINT ignored; a single run takes it all the same
  (signals.py), and so does the launcher: kill -INT is meant."""
  status, _, saved, output = _signal_job(tmp_path, 3, _stop_as_kill_int, sigint="SIG_IGN",
                                         horovodrun=_CONTROLLERS[controller])
  assert (status, saved) == (130, [0, 1]), output[-3000:]
  assert output.count("rank: SIGTERM received") == 2, output[-3000:]
  if controller == "gloo":
    assert output.strip().splitlines()[-1].endswith(
        "after the job's SIGINT (passed on to the ranks as SIGTERM); run the same command "
        "again to resume from its last checkpoint"), output[-3000:]


def _catches(pid, signum):
  """Whether process `pid` has a handler of `signum` (SigCgt in /proc/PID/status)."""
  try:
    with open("/proc/%d/status" % pid) as f:
      caught = [line for line in f if line.startswith("SigCgt:")][0]
  except (OSError, IndexError):
    return False
  return bool(int(caught.split()[1], 16) >> (signum - 1) & 1)


def test_kill_int_while_the_launcher_checks_ends_it_in_one_line(pretraining_data, tmp_path):
  # Started as a script's `&` starts it; the signal comes as it checks the flags and inputs
  # (a rank's --check_only, a second or more), before any rank: once it catches SIGINT,
  # which it does right before (a fixed delay on a loaded machine came before, ignored).
  command = [sys.executable, "-m", "bert_pretrain.distributed.launch", "run", "horovodrun",
             "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m",
             "bert_pretrain.run_pretraining", "--horovod"] + base_flags(pretraining_data,
                                                                        tmp_path / "out")
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=horovod_env(), start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
  try:
    deadline = time.time() + 60
    while not _catches(proc.pid, signal.SIGINT) and time.time() < deadline:
      assert proc.poll() is None
      time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 130, out[-2000:] + err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("model.ckpt-*"))


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_the_launcher_ends_ranks_that_do_not_stop_after_its_grace(tmp_path, controller):
  # horovodrun alone ends such ranks in about 10 s (5 s for its SIGTERM, 5 for SIGSTOP,
  # SIGTERM and then SIGKILL), mpirun 10 s after passing the signal on: after the grace
  # they do the same.
  status, seconds, saved, output = _signal_job(tmp_path, "never", _stop_as_kill, grace_s=20,
                                               horovodrun=_CONTROLLERS[controller])
  assert status != 0 and saved == [], output[-3000:]
  assert 20 <= seconds < 90, output[-3000:]


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_second_signal_a_second_after_the_first_ends_the_job_at_once(tmp_path, controller):
  status, seconds, saved, output = _signal_job(tmp_path, 100, _stop_as_ctrl_c_twice,
                                               horovodrun=_CONTROLLERS[controller])
  assert status != 0 and saved == [], output[-3000:]
  assert seconds < 60, output[-3000:]


@pytest.mark.parametrize("run_args,given,timeout", [
    (["--mpi"], None, str(launch_plan.MPI_SIGKILL_TIMEOUT_S)),
    (["--mpi"], "60", "60"),
    (["--gloo"], None, None)])
def test_mpirun_gives_the_ranks_time_to_save_unless_told_otherwise(run_args, given, timeout,
                                                                   monkeypatch, tmp_path):
  """mpirun's own 1 s between passing a signal on and killing the ranks is too short."""
  import types  # pylint: disable=g-import-not-at-top
  seen = tmp_path / "seen.json"  # written in the launcher's child under --mpi
  fake = types.ModuleType("horovod.runner.launch")
  fake.run_commandline = lambda: seen.write_text(json.dumps(
      os.environ.get("OMPI_MCA_odls_base_sigkill_timeout")))
  monkeypatch.setitem(sys.modules, "horovod.runner.launch", fake)
  monkeypatch.setenv(launch_plan.LAUNCH_ID_VARIABLE, "")
  monkeypatch.setenv("OMPI_MCA_odls_base_sigkill_timeout", given or "")
  if given is None:
    monkeypatch.delenv("OMPI_MCA_odls_base_sigkill_timeout")
  assert launch_plan.run(["horovodrun", "-np", "2"] + run_args + ["python3", "x.py"]) == 0
  assert json.loads(seen.read_text()) == timeout


def test_a_failed_job_ends_with_the_ranks_error_and_its_exit_status(pretraining_data, tmp_path):
  """horovodrun --gloo itself would end with its RuntimeError's traceback. The ranks fail
  where the launcher's check does not look: the evaluation file's last record is cut,
  which only reading it whole (on MLPerf's clock, in each rank) finds."""
  evaluation = tmp_path / "eval"
  shutil.copytree(pretraining_data["eval"], str(evaluation))
  name = sorted(os.listdir(str(evaluation)))[0]
  blob = (evaluation / name).read_bytes()
  (evaluation / name).write_bytes(blob[:-3])
  flags = base_flags(pretraining_data, tmp_path / "out", eval_files_dir=str(evaluation))
  result = subprocess.run(["bash", os.path.join(ROOT, "run_multi_card_FPS.sh")] + flags,
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300,
                          env=forking_env(launcher_env(IX_NUM_CUDA_VISIBLE_DEVICES="2"),
                                          script=True))
  assert result.returncode == 2, result.stdout[-3000:]
  error = "run_pretraining: error: corrupt TFRecord file %s" % (evaluation / name)
  # Both ranks find it; the job ends with the first to exit.
  last = result.stdout.strip().splitlines()[-1]
  assert re.match(r"rank [01] exited with status 2: %s" % re.escape(error), last), last
  assert "[%s]<stderr>:%s" % (last[5], error) in result.stdout
  assert "Traceback" not in result.stdout


@pytest.mark.parametrize("words,message", [
    (["--mpi"], "--mpi is horovodrun's, not run_pretraining's: pass it in HOROVOD_RUN_ARGS, "
     "e.g. HOROVOD_RUN_ARGS=--mpi"),
    (["-H", "h1:8,h2:8", "--amp"], "-H is horovodrun's, not run_pretraining's: pass it in "
     "HOROVOD_RUN_ARGS, e.g. HOROVOD_RUN_ARGS='-H h1:8,h2:8'"),
    (["--lerning_rate=1e-4"], "run_pretraining has no flag --lerning_rate; did you mean "
     "--learning_rate?"),
    (["--network-interface", "eth0"], "--network-interface is horovodrun's, not "
     "run_pretraining's: pass it in HOROVOD_RUN_ARGS, e.g. HOROVOD_RUN_ARGS='--network-"
     "interface eth0'"),
    (["--mpi-args", "-x FOO", "--amp"], "--mpi-args is horovodrun's, not run_pretraining's: "
     "pass it in HOROVOD_RUN_ARGS, e.g. HOROVOD_RUN_ARGS=\"--mpi-args '-x FOO'\""),
    (["--zzz"], "run_pretraining has no flag --zzz; --helpfull lists its flags"),
    (["--op_conversion_fallback_to_while_loop"], None),  # TensorFlow's: a rank has it too
    (["--amp", "false"], "unexpected arguments: false; pass everything as --flags: "
     "--name=value, and a true/false flag as --name or --noname (e.g. --noamp)"),
    (["--train_batch_size=six"], "flag --train_batch_size=six: invalid literal for int() "
     "with base 10: 'six'; pass a value of the flag's type (run_pretraining --helpfull lists "
     "them)"),
    (["--distribution=mirrored"], "--distribution=mirrored runs one process, but the script "
     "starts Horovod ranks; set DISTRIBUTION=mirrored instead of passing --distribution"),
    (["--v=1", "--pdb", "--noamp", "--preset=one_card"], None),
    (["--helpfull", "--zzz"], None),  # the ranks print the help
    (["-helpshort"], None),
    (["--flagfile=/on/the/hosts/only", "--amp", "false"], None),  # read where ranks run
], ids=["horovodrun-flag", "horovodrun-option", "misspelt", "horovodrun-other-option",
        "horovodrun-option-dash-value", "unknown", "tensorflows-flag", "stray-word",
        "bad-value", "distribution", "absl-flags", "help", "help-one-dash", "flagfile"])
def test_the_training_flags_are_checked_once_before_the_ranks_start(words, message):
  command = ["horovodrun", "-np", "2", "python3", "-m", "bert_pretrain.run_pretraining"]
  if message is None:
    launch_plan.check_training_flags(command + words)
    return
  with pytest.raises(launch_plan.LaunchError) as raised:
    launch_plan.check_training_flags(command + words)
  assert str(raised.value) == message


def test_the_scripts_own_distribution_for_several_hosts_passes_the_check(tmp_path):
  # multi_worker_mirrored on two hosts: horovodrun starts one process a host, with
  # TF_CONFIG, and the script passes --distribution itself.
  result = run_multi_card_script(tmp_path, "--input_files_dir=/data", DRY_RUN="1",
                                 IX_NUM_CUDA_VISIBLE_DEVICES="8",
                                 DISTRIBUTION="multi_worker_mirrored",
                                 HOROVOD_RUN_ARGS="--gloo -H host1:8,host2:8")
  assert result.returncode == 0, result.stderr
  assert "horovodrun -np 2 -H host1:1,host2:1" in result.stdout
  assert "--distribution=multi_worker_mirrored" in result.stdout


def test_every_flag_a_rank_knows_passes_the_launchers_check():
  # A rank's flags: those of a process that imported run_pretraining alone, each with its
  # default as the command line gives it.
  listed = subprocess.run(
      [sys.executable, "-c", "import json\nfrom absl import flags\n"
       "from bert_pretrain import run_pretraining\n"
       "print(json.dumps([flag.serialize().splitlines() for module_flags in "
       "flags.FLAGS.flags_by_module_dict().values() for flag in module_flags if flag.name "
       "not in ('help', 'helpshort', 'helpfull', 'helpxml', 'flagfile')]))"],
      stdout=subprocess.PIPE, universal_newlines=True, cwd=ROOT, timeout=300,
      env=dict(os.environ, PYTHONPATH=ROOT))
  command = ["horovodrun", "-np", "2", "python3", "-m", "bert_pretrain.run_pretraining"]
  checked = 0
  for words in json.loads(listed.stdout.splitlines()[-1]):
    if words:
      launch_plan.check_training_flags(command + words)
      checked += 1
  assert checked > 50


def test_the_launchers_check_neither_knows_flags_a_rank_lacks_nor_sets_this_processs():
  """A process that also defined bench/'s flags (--windows) checks as a rank would; --pdb,
  an alias of absl's, leaves this process's own flag as it was."""
  script = (
      "from absl import flags\n"
      "from bench import benchmark\n"
      "from bert_pretrain.distributed import launch\n"
      "command = ['horovodrun', '-np', '2', 'python3', '-m', 'bert_pretrain.run_pretraining']\n"
      "launch.check_training_flags(command + ['--pdb', '--noamp'])\n"
      "print(flags.FLAGS['pdb_post_mortem'].value, flags.FLAGS['pdb'].present)\n"
      "try:\n"
      "  launch.check_training_flags(command + ['--windows=3'])\n"
      "except launch.LaunchError as e:\n"
      "  print(e)\n")
  result = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, cwd=ROOT,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.stdout.splitlines()[-2:] == [
      "False 0", "run_pretraining has no flag --windows; --helpfull lists its flags"], \
      result.stdout[-3000:]


def test_a_horovodrun_flag_given_to_the_script_is_one_line_before_any_rank_starts(tmp_path):
  result = run_multi_card_script(tmp_path, "--mpi", "--num_train_steps=2",
                                 IX_NUM_CUDA_VISIBLE_DEVICES="2")
  assert result.returncode == 2, result.stdout + result.stderr
  assert result.stderr.strip().splitlines() == [
      "run_multi_card_FPS: error: --mpi is horovodrun's, not run_pretraining's: pass it in "
      "HOROVOD_RUN_ARGS, e.g. HOROVOD_RUN_ARGS=--mpi"]
  assert os.listdir(str(tmp_path)) == []
  # A dry run checks the flags as the run would.
  dry = run_multi_card_script(tmp_path, "--num_train_step=2", DRY_RUN="1",
                              IX_NUM_CUDA_VISIBLE_DEVICES="2")
  assert dry.returncode == 2, dry.stdout + dry.stderr
  assert dry.stderr.strip().splitlines() == [
      "run_multi_card_FPS: error: run_pretraining has no flag --num_train_step; did you "
      "mean --num_train_steps?"]


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm", "kill-9"])
def test_a_stop_during_the_check_before_the_ranks_ends_it_in_the_launchers_one_line(
    pretraining_data, tmp_path, stop):
  """The check runs in a session of its own (a Ctrl-C in TensorFlow's import would print a
  traceback): the launcher says a Ctrl-C or a SIGTERM to the group (a scheduler's,
  `timeout`'s) in one line and ends the check; a killed launcher takes the check with it,
  which says nothing (here checks that would take minutes, as on many record files of a
  slow disk, and would speak at a SIGTERM)."""
  import psutil  # pylint: disable=g-import-not-at-top  (Horovod's dependency)
  python = sys.executable
  if stop != "ctrl-c":
    python = str(tmp_path / "slow_python")
    with open(python, "w") as f:
      f.write("#!%s\nimport signal, sys, time\n"
              "def said(*_):\n  sys.stderr.write('check: SIGTERM\\n')\n  sys.exit(143)\n"
              "signal.signal(signal.SIGTERM, said)\ntime.sleep(600)\n" % sys.executable)
    os.chmod(python, 0o755)
  command = [sys.executable, "-m", "bert_pretrain.distributed.launch", "run", "horovodrun",
             "-np", "2", "-H", "localhost:2", "--gloo", python, "-m",
             "bert_pretrain.run_pretraining", "--horovod"] + base_flags(pretraining_data,
                                                                        tmp_path / "out")
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=horovod_env(), start_new_session=True)
  try:
    deadline = time.time() + 120
    checks = []
    while not checks:  # the terminal's Ctrl-C reaches its foreground group, once the check runs
      assert proc.poll() is None and time.time() < deadline, proc.communicate()
      try:
        checks = [p for p in psutil.Process(proc.pid).children()
                  if "--check_only" in p.cmdline()]
      except psutil.Error:  # a child that ended as it was listed
        pass
      time.sleep(0.05)
    if stop == "kill-9":
      time.sleep(1)  # the check's handler is in place
      proc.kill()
    else:
      os.killpg(proc.pid, signal.SIGINT if stop == "ctrl-c" else signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    checks[0].wait(timeout=60)  # psutil.TimeoutExpired if the check outlives the launcher
  finally:
    if proc.poll() is None:
      kill_tree(proc.pid)
    for check in checks:
      if check.is_running():
        check.kill()
  assert "Traceback" not in err and "check: SIGTERM" not in err, err[-3000:]
  if stop == "kill-9":
    assert proc.returncode == -signal.SIGKILL, out[-2000:] + err[-3000:]
  else:
    assert (proc.returncode, err.strip().splitlines()[-1]) == (
        (130, "run_multi_card_FPS: interrupted; run the same command again") if stop == "ctrl-c"
        else (143, "run_multi_card_FPS: terminated (SIGTERM); run the same command again")), (
            out[-2000:] + err[-3000:])
  assert not (tmp_path / "out").exists()


def test_the_rank_errors_stream_keeps_each_ranks_last_error_line():
  import io  # pylint: disable=g-import-not-at-top
  stream = io.StringIO()
  errors = horovodrun_lib.RankErrors(stream)
  errors.write("[1]<stderr>:run_pretraining: error: first\n")
  errors.write("[0]<stdout>:Step 1, error: not on stderr\n[1]<stderr>:Traceback (most "
               "recent call last):\n")
  errors.write("[1]<stderr>:run_pretraining: error: second\n")
  assert errors.errors == {1: "run_pretraining: error: second"}
  assert stream.getvalue().count("\n") == 4  # Everything passed on.


def test_a_job_its_ranks_stopped_at_sigterm_ends_with_143_though_horovodrun_returned(capsys):
  def stopped():  # as horovodrun does when it lost the status of the ranks it killed
    sys.stderr.write("[1]<stderr>:run_pretraining: SIGTERM received: finishing the current "
                     "update, then saving a checkpoint (send SIGTERM again to exit at "
                     "once)\n")

  def finished():
    sys.stderr.write("[1]<stderr>:run_pretraining: warning: a line\n")
  assert horovodrun_lib.run_horovodrun(["-np", "2"], stopped) == 143
  assert horovodrun_lib.run_horovodrun(["-np", "2"], finished) == 0
  assert "[1]<stderr>:run_pretraining: SIGTERM received" in capsys.readouterr().err


@pytest.mark.parametrize("signum,child_status,status,to_launcher", [
    (signal.SIGTERM, 1, 143, True), (signal.SIGINT, 1, 130, True),
    (signal.SIGTERM, 1, 143, False), (signal.SIGTERM, 0, 0, True), (None, 3, 3, True)],
    ids=["sigterm", "sigint", "sigterm-to-another-thread", "succeeded-anyway",
         "failed-alone"])
def test_a_job_under_mpirun_a_signal_stopped_ends_with_128_plus_that_signal(
    signum, child_status, status, to_launcher, tmp_path, monkeypatch):
  """mpirun exits with 1 after passing a signal on; the launcher, which passed it to
  mpirun, ends with 128 + the signal, as a job under horovodrun --gloo does; so it does
  when the signal reaches a thread other than the launcher's, which then does not
  interrupt the launcher's wait for mpirun."""
  # This job has no ranks. A rank another test left below this process would make the
  # launcher wait out its grace (120 s) before passing the signal on.
  monkeypatch.setattr(launch_plan, "ranks_of_this_host", lambda: [])
  ready = tmp_path / "ready"

  def mpirun():  # a stand-in: exits with child_status at the signal, or without one
    # Waited for blocked, not with a handler, which could run only after a sleep.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    ready.write_text("")
    if signum is None:
      return child_status
    return child_status if signal.sigtimedwait({signal.SIGTERM, signal.SIGINT}, 60) else 9

  launcher = threading.get_ident()

  def send_when_ready():  # the child waits for it, so the launcher's handler is still set
    while not ready.exists():
      time.sleep(0.01)
    # To this thread, the case: its C-level handler only sets a flag, which the launcher's
    # thread acts on when it next runs Python (no longer only once the child has ended).
    signal.pthread_kill(launcher if to_launcher else threading.get_ident(), signum)

  if signum is not None:
    threading.Thread(target=send_when_ready, daemon=True).start()
  started = time.time()
  assert launch_plan.run_mpirun_in_child(mpirun) == status
  assert time.time() - started < 30


_SAVED = "report: not drawn after SIGTERM; python3 -m bert_pretrain.training.report o draws it"
_STOPS = ("SIGTERM: rank 0 stops after step 3; to resume, run the same command with "
          "--output_dir=results/demo-20261206-1")


def _stopped_job(lines, rank, status):
  """A stand-in for horovodrun's run_commandline: rank 0's lines after its SIGTERM line
  (on stderr, or on stdout when they are _SAVED), then horovodrun's error naming the first
  rank to exit non-zero."""
  def run():
    sys.stderr.write("[0]<stderr>:run_pretraining: SIGTERM received: finishing the current "
                     "update, then saving a checkpoint\n")
    for line in lines:
      stream = "stdout" if line in (_SAVED, _STOPS) else "stderr"
      getattr(sys, stream).write("[0]<%s>:%s\n" % (stream, line))
    raise RuntimeError("Horovod detected that one or more processes exited with non-zero "
                       "status, thus causing the job to be terminated. The first process "
                       "to do so was:\nProcess name: %d\nExit code: %d\n" % (rank, status))
  return run


@pytest.mark.parametrize("lines,rank,status,exit_status,last_line", [
    # Rank 1 on another host: its ssh session ended; rank 0 had saved.
    (["SIGTERM: rank 0: other ranks ended before the last barrier (Horovod has been shut "
      "down.); run the same command again to resume from the last checkpoint"], 1, 255, 143,
     "rank 1 exited with status 255 after the job's SIGTERM; run the same command again to "
     "resume from its last checkpoint"),
    # A rank's own error is the job's end, also when a peer left first.
    (["run_pretraining: error: the disk is full"], 0, 2, 2,
     "rank 0 exited with status 2: run_pretraining: error: the disk is full"),
    (["run_pretraining: error: the disk is full"], 1, 143, 1,
     "rank 1 exited with status 143; rank 0: run_pretraining: error: the disk is full"),
    # Killed (kill -9, the OOM killer; 137 from its shell under Gloo): its peer's error,
    # Horovod's at its exit, follows from it.
    (["run_pretraining: error: Horovod stopped the job (Horovod has been shut down)"], 1, 137,
     137, "rank 1 was ended by SIGKILL (the OOM killer or kill -9: dmesg says which); its "
     "lines are above"),
    # A crash is the rank's own end too; a SIGTERM a peer's error can have brought is not.
    (["run_pretraining: error: Horovod stopped the job (Horovod has been shut down)"], 1, -11,
     139, "rank 1 was ended by SIGSEGV; its lines are above"),
    (["run_pretraining: error: the disk is full"], 1, -15, 1,
     "rank 1 was ended by SIGTERM; rank 0: run_pretraining: error: the disk is full"),
    # Killed while saving, no line of its own: not a clean stop.
    ([], 0, -9, 137, "rank 0 was ended by SIGKILL (the OOM killer or kill -9: dmesg says "
     "which); its lines are above"),
    # Rank 0 saved and ended its stop; the others exit after it (loop.last_barrier).
    ([_SAVED], 1, 143, 143, "rank 1 exited with status 143 after the job's SIGTERM; run the "
     "same command again to resume from its last checkpoint"),
    # Its middleman ended by the SIGTERM too, as a scheduler signals every process.
    ([_SAVED], 1, -15, 143, "rank 1 exited with status -15 after the job's SIGTERM; run the "
     "same command again to resume from its last checkpoint"),
    # Without rank 0's line after its save, the stop is not known to have saved.
    ([], 1, -15, 1, "rank 1 was ended by SIGTERM; its lines are above"),
    ([], 1, 143, 143, "rank 1 exited with status 143; its lines are above"),
], ids=["peer-lost-after-the-save", "rank-error", "rank-error-peer-first", "killed-137",
        "crashed", "peer-error-then-sigterm", "killed",
        "saved", "saved-middleman-signalled", "not-saved-middleman-signalled",
        "not-saved"])
def test_a_job_stopped_at_a_signal_ends_stopped_only_when_rank_0_saved_and_none_failed(
    capsys, lines, rank, status, exit_status, last_line):
  assert horovodrun_lib.run_horovodrun(["-np", "2"], _stopped_job(lines, rank, status)) == (
      exit_status)
  assert capsys.readouterr().err.endswith(last_line + "\n")


def test_a_stopped_demo_job_names_the_folder_its_resume_needs(capsys):
  # The demo's folder is the launch's: the same command would make another.
  assert horovodrun_lib.run_horovodrun(["-np", "2", "python3"],
                                    _stopped_job([_STOPS, _SAVED], 1, 143)) == 143
  assert capsys.readouterr().err.endswith(
      "rank 1 exited with status 143 after the job's SIGTERM; run the same command again "
      "with --output_dir=results/demo-20261206-1 to resume from its last checkpoint\n")
  # A command that names its folder resumes as it is.
  assert horovodrun_lib.run_horovodrun(
      ["-np", "2", "python3", "--output_dir=results/demo-20261206-1"],
      _stopped_job([_STOPS, _SAVED], 1, 143)) == 143
  assert capsys.readouterr().err.endswith(
      "rank 1 exited with status 143 after the job's SIGTERM; run the same command again "
      "to resume from its last checkpoint\n")


def test_a_job_stopped_by_ctrl_c_to_the_launcher_names_it_and_exits_130(capsys):
  """The launcher passes its SIGINT on to the ranks as SIGTERM (StopRanksFirst)."""
  assert horovodrun_lib.run_horovodrun(["-np", "2"], _stopped_job([_SAVED], 1, 143),
                                    lambda: signal.SIGINT) == 130
  assert capsys.readouterr().err.endswith(
      "rank 1 exited with status 143 after the job's SIGINT (passed on to the ranks as "
      "SIGTERM); run the same command again to resume from its last checkpoint\n")


def test_a_horovodrun_failure_without_a_rank_is_one_line(capsys):
  def fails():
    assert sys.argv == ["horovodrun", "-np", "2"]  # horovodrun's parser reads it
    raise RuntimeError("ssh: connect to host h2 port 22: Connection refused\nmore")
  argv = list(sys.argv)
  assert horovodrun_lib.run_horovodrun(["-np", "2"], fails) == 1
  assert sys.argv == argv
  assert capsys.readouterr().err == (
      "horovodrun: error: ssh: connect to host h2 port 22: Connection refused\n")


def test_arguments_horovodrun_refuses_are_one_line_and_exit_2(capsys):
  def refuses():  # as horovodrun does for a --network-interface this host lacks
    raise ValueError("No interface is found for address 127.0.0.1.")
  assert horovodrun_lib.run_horovodrun(["-np", "2"], refuses) == 2
  assert capsys.readouterr().err == (
      "horovodrun: error: No interface is found for address 127.0.0.1; check "
      "HOROVOD_RUN_ARGS (its --network-interface: ip -brief address lists this host's)\n")


def test_the_launchers_check_for_other_hosts_leaves_what_depends_on_the_host_to_them(
    monkeypatch):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from bert_pretrain import config  # pylint: disable=g-import-not-at-top
  from bert_pretrain.training import inputs  # pylint: disable=g-import-not-at-top
  from bert_pretrain.training import mlperf  # pylint: disable=g-import-not-at-top

  def parsed(*argv):
    values = flags.FlagValues()
    config.define_pretraining_flags(values)
    values(["run_pretraining", "--input_files_dir=/data/train"] + list(argv))
    return values

  def cannot_drop():
    raise ValueError("--clear_cache cannot write /proc/sys/vm/drop_caches on this host")

  # This host may not drop its page cache, nor have the workers' TF_CONFIG: the ranks'.
  monkeypatch.setattr(mlperf, "check_clear_cache", cannot_drop)
  monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["h1:1", "h2:1"]}}))
  for argv in (["--clear_cache"], ["--distribution=multi_worker_mirrored"]):
    launch_plan.check_settings_here(parsed(*argv))
    with pytest.raises(ValueError):
      inputs.check_settings(config.settings_from_flags(parsed(*argv)))
  with pytest.raises(launch_plan.LaunchError, match="--train_batch_size=0 must be at least 1"):
    launch_plan.check_settings_here(parsed("--train_batch_size=0"))


def test_a_launch_on_this_host_checks_the_inputs_as_a_rank_would_before_starting_one(
    pretraining_data, tmp_path):
  out = tmp_path / "out"
  flags = base_flags(pretraining_data, out)
  good = run_multi_card_script(tmp_path, *flags, DRY_RUN="1", IX_NUM_CUDA_VISIBLE_DEVICES="2")
  assert good.returncode == 0, good.stderr
  assert good.stdout.startswith("Launching 2 ranks on 1 host") and not out.exists()
  assert good.stdout.splitlines()[-1] == (
      "DRY_RUN=1: the flags and run_pretraining --check_only on this host pass; nothing was "
      "started")
  for wrong, message in (
      ("--input_files_dir=%s" % (tmp_path / "nope"), "--input_files_dir=%s does not exist"
       % (tmp_path / "nope")),
      ("--train_batch_size=0", "--train_batch_size=0 must be at least 1"),
      ("--output_dir=%s" % (tmp_path / "a_file" / "out"), "--output_dir=%s cannot be written"
       % (tmp_path / "a_file" / "out"))):
    (tmp_path / "a_file").write_text("")
    bad = run_multi_card_script(tmp_path, *(flags + [wrong]), DRY_RUN="1",
                                IX_NUM_CUDA_VISIBLE_DEVICES="2")
    assert bad.returncode == 2, bad.stderr
    lines = bad.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("run_pretraining: error: " + message), lines
    assert not out.exists()
  # A real launch checks the same before horovodrun starts a rank: one line, not one a rank.
  bad = run_multi_card_script(tmp_path, *(flags + ["--input_files_dir=%s" % (tmp_path / "nope")]),
                              IX_NUM_CUDA_VISIBLE_DEVICES="2")
  assert bad.returncode == 2, bad.stderr
  assert bad.stderr.splitlines() == ["run_pretraining: error: --input_files_dir=%s does not "
                                     "exist; pass the folder that holds the TFRecord files"
                                     % (tmp_path / "nope")], bad.stderr
  assert bad.stdout.splitlines()[0].startswith("Launching 2 ranks on 1 host")
  assert len(bad.stdout.splitlines()) == 1 and not out.exists(), bad.stdout


def test_ranks_that_disagree_on_the_schedule_are_all_refused_at_start(pretraining_data,
                                                                     tmp_path):
  """mpirun's MPMD form starts rank 0 with --num_train_steps=6 and rank 1 with 12, from
  a copy of bert_pretrain with one line more (a host with another checkout)."""
  flags = lambda steps: base_flags(pretraining_data, tmp_path / "out", nodo_eval=None,
                                   train_batch_size=4, num_train_steps=steps)
  copy = tmp_path / "other_checkout"
  shutil.copytree(os.path.join(ROOT, "bert_pretrain"), str(copy / "bert_pretrain"),
                  ignore=shutil.ignore_patterns("__pycache__", "*.so"))
  with open(str(copy / "bert_pretrain" / "errors.py"), "a") as f:
    f.write("# a line that is not in the other checkout\n")
  from_copy = [sys.executable, "-c", "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
               "runpy.run_module('bert_pretrain.run_pretraining', run_name='__main__', "
               "alter_sys=True)", str(copy), "--horovod"]
  # --tag-output: each line of a rank whole, after "[job,rank]<stderr>:".
  command = (MPIRUN[:1] + MPIRUN[3:] + ["--tag-output", "-x", "PYTHONPATH", "-x",
                                         "TF_CPP_MIN_LOG_LEVEL", "-np", "1"] +
             rank_command("--horovod", *flags(6)) +
             [":", "-np", "1"] + from_copy + flags(12))
  result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, env=horovod_env(), timeout=240)
  assert result.returncode == 2, result.stdout[-3000:]
  errors = sorted(re.findall(r"^\[\d+,(\d)\]<stderr>:(run_pretraining: error: .*)$",
                             result.stdout, re.M))
  digest = lambda rank: int(re.search(
      r"bert_pretrain's files \(a digest: one checkout on every host\) \(rank 0: (\d+), "
      r"rank 1: (\d+)\)", result.stdout).group(rank + 1))
  assert digest(0) != digest(1), result.stdout[-3000:]
  line = ("run_pretraining: error: the job's processes disagree on --num_train_steps (rank "
          "0: 6, rank 1: 12); bert_pretrain's files (a digest: one checkout on every host) "
          "(rank 0: %d, rank 1: %d); start every process with the same settings (nothing "
          "was trained)" % (digest(0), digest(1)))
  assert errors == [("0", line), ("1", line)], result.stdout[-3000:]
  assert "Step 1," not in result.stdout
