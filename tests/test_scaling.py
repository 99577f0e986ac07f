"""bench/scaling.py: a tiny 1-rank and 2-rank run with each engine gives FPS and eval
times; the speed table by ranks, precision and batch; the search for the largest batch
that fits, with real out-of-memory failures and with fakes; the flags refused before any
work, the exit status of a run whose trainings failed, and what a stopped run cleans up."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import AMP_ON_THIS_CPU
from conftest import forking_env
from conftest import forking_server
from conftest import kill_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def scaling(tmp_path_factory):
  """One run of bench/scaling.py making its three tables on the tiny model: 1 and 2 ranks
  of each engine, the speed table (ranks x amp and fp32 at batch 4, whose fp32 runs are
  the engine table's Horovod ones), and the largest batch under a 0.04 GiB limit (the
  demo's data prepared once for the three).
  Returns (its output, scaling.json, scaling_card.json, the folder). It runs outside the
  checkout with a relative --out_dir, as a user may."""
  out_dir = str(tmp_path_factory.mktemp("scaling"))
  # The package importable as an install makes it, bench/ not: the script finds its own.
  site = tmp_path_factory.mktemp("site")
  os.symlink(os.path.join(ROOT, "bert_pretrain"), str(site / "bert_pretrain"))
  # Its trainings (this checkout first on their PYTHONPATH: card.run_env) fork from a server
  # of that PYTHONPATH.
  server_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                    PYTHONPATH=os.pathsep.join([ROOT, str(site)]))
  with forking_server(server_env) as path:
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "scaling.py"), "--models=tiny",
         "--train_batch_size=4", "--num_train_steps=4", "--fps_warmup_steps=1",
         "--noindependent",
         "--tables=engines,speed,max_batch", "--batch_sizes=4", "--precisions=amp,fp32",
         "--max_batch_seq_lengths=128", "--memory_limit_gib=0.04", "--max_batch_limit=256",
         "--out_dir=" + os.path.basename(out_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
        timeout=1800, env=forking_env(dict(os.environ, PYTHONPATH=str(site)),
                                      socket_path=path),
        cwd=os.path.dirname(out_dir))
  assert result.returncode == 0, result.stdout[-3000:]
  with open(os.path.join(out_dir, "scaling.json")) as f:
    results = json.load(f)
  with open(os.path.join(out_dir, "scaling_card.json")) as f:
    written = json.load(f)
  return result.stdout, results, written, out_dir


def test_scaling_table_gives_fps_and_eval_time_of_one_and_two_ranks_of_each_engine(scaling):
  out, results, written, out_dir = scaling
  (row,) = results["engines"]
  for run in ("1", "2", "2-mirrored", "2-multi_worker_mirrored"):
    assert row["runs"][run]["fps"] > 0, row
    assert row["runs"][run]["eval_s"] > 0, row
  assert ("| 2 mirrored sent/s | efficiency | 2 multi_worker_mirrored sent/s | efficiency | "
          "eval s 1 rank | eval s 2 ranks |") in out
  # Every run evaluated the whole eval set: the same number of samples.
  logs = [open(os.path.join(out_dir, "logs", "scaling-tiny-%s.log" % tag)).read()
          for tag in ("np1", "np2", "np2-mirrored", "np2-multi_worker_mirrored")]
  samples = [[line for line in log.splitlines() if "eval_samples = " in line][-1]
             for log in logs]
  assert len(set(line.split("=")[-1] for line in samples)) == 1, samples
  entries = [e for e in written["entries"] if " batch " not in e["name"]]
  assert sorted((e["config"]["ranks"], e["config"]["engine"]) for e in entries) == [
      (1, "horovod"), (2, "horovod"), (2, "mirrored"), (2, "multi_worker_mirrored")]
  assert all(e["config"]["compute"] == "float32" for e in entries)


def test_speed_table_gives_sentences_per_second_by_ranks_precision_and_batch(scaling):
  out, results, written, out_dir = scaling
  (row,) = results["speed"]
  assert sorted(row["runs"]) == ["1-amp-4", "1-fp32-4", "2-amp-4", "2-fp32-4"]
  assert all(run["fps"] > 0 for run in row["runs"].values()), row
  assert "| ranks | amp (batch 4) | fp32 (batch 4) |" in out
  rows = [l for l in out.splitlines() if l.startswith(("| 1 | ", "| 2 | "))]
  assert [r[:6] for r in rows] == ["| 1 | ", "| 2 | "], out
  # The amp runs computed what --amp does on this CPU (bfloat16 where it is faster), the
  # fp32 ones float32.
  logs = os.path.join(out_dir, "logs")
  assert AMP_ON_THIS_CPU in open(os.path.join(logs, "scaling-tiny-np2-amp-b4.log")).read()
  # The fp32 runs are the engine table's: run once, their result taken again.
  for ranks in (1, 2):
    assert row["runs"]["%d-fp32-4" % ranks] == results["engines"][0]["runs"][str(ranks)]
    assert ("tiny, np%d-fp32-b4: the same run as %s, its result taken"
            % (ranks, os.path.join(logs, "scaling-tiny-np%d.log" % ranks))) in out
    assert not os.path.exists(os.path.join(logs, "scaling-tiny-np%d-fp32-b4.log" % ranks))
  assert "compute float32" in open(row["runs"]["2-fp32-4"]["log"]).read()
  # The card: each run with what it computed in, its config hash and its environment.
  assert "scaling_card.json" in out
  assert written["tool"] == "bench.scaling" and written["flags"]["batch_sizes"] == ["4"]
  assert written["environment"]["versions"]["horovod"] == __import__("horovod").__version__
  entries = {e["name"]: e for e in written["entries"] if " batch " in e["name"]}
  assert sorted(entries) == ["tiny 1 ranks amp batch 4", "tiny 1 ranks fp32 batch 4",
                             "tiny 2 ranks amp batch 4", "tiny 2 ranks fp32 batch 4"]
  for name, entry in entries.items():
    ranks, precision = int(name.split()[1]), name.split()[3]
    assert entry["stats"]["values"] == [row["runs"]["%d-%s-4" % (ranks, precision)]["fps"]]
    assert (entry["config"]["ranks"], entry["devices"]) == (ranks, ranks)
    assert entry["config"]["compute"] == (AMP_ON_THIS_CPU.split()[1] if precision == "amp"
                                          else "float32")
    assert entry["config"]["model"]["layers"] == 2 and entry["published"] == []
  assert len({e["config_hash"] for e in entries.values()}) == 4


def test_largest_batch_search_catches_out_of_memory_in_real_trials_and_reports_it(scaling):
  out, results, _, out_dir = scaling
  (row,) = results["max_batch"]
  assert (row["model"], row["seq"], row["limit_gib"]) == ("tiny", 128, 0.04)
  assert "error" not in row and not row["capped"], row
  tried = {int(b): outcome for b, outcome in row["tried"].items()}
  assert 1 <= row["batch"] < 256 and tried[row["batch"]] == "fits", row
  assert all((outcome == "fits") == (b <= row["batch"]) for b, outcome in tried.items()), row
  assert min(b for b in tried if b > row["batch"]) - row["batch"] <= max(1, row["batch"] // 8)
  logs = os.path.join(out_dir, "logs")
  for b, outcome in tried.items():
    if outcome == "fits":
      continue
    with open(os.path.join(logs, "scaling-tiny-seq128-b%d.log" % b)) as f:
      text = f.read()
    if outcome == "out of memory":
      # TensorFlow raised ResourceExhaustedError inside the limit; run_pretraining said so.
      assert "run_pretraining: error: out of memory" in text, b
    else:
      # It crashed inside the limit and ran without it.
      assert outcome == "out of memory (crash)", (b, outcome)
      assert re.search(r"Fatal Python error: (Segmentation fault|Aborted)", text), (b, text)
      with open(os.path.join(logs, "scaling-tiny-seq128-b%d-nolimit.log" % b)) as f:
        assert "Throughput Average" in f.read(), b
  assert "| tiny | 128 | 0.04 GiB of tensors | %d |" % row["batch"] in out


def scaling_functions(code):
  """Runs `code` with bench/scaling.py imported as `scaling`, in an interpreter of its
  own: its flags share names with run_pretraining's. Returns what the code prints."""
  result = subprocess.run(
      [sys.executable, "-c", "from bench import scaling\n" + code],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      timeout=300, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.returncode == 0, result.stdout[-3000:]
  return json.loads(result.stdout.splitlines()[-1])


def test_the_runs_keep_the_callers_pythonpath_after_this_checkout():
  """A vendor's TensorFlow may be found through PYTHONPATH only (bench/card.py's run_env)."""
  path = scaling_functions(
      "import json, os\n"
      "os.environ['PYTHONPATH'] = '/opt/vendor/python'\n"
      "print(json.dumps(scaling.run_env()['PYTHONPATH']))")
  assert path == os.pathsep.join([ROOT, "/opt/vendor/python"])


def test_the_largest_batch_search_doubles_then_halves_the_gap_to_an_eighth():
  found = scaling_functions(
      "import json\n"
      "print(json.dumps(scaling.largest_batch(\n"
      "    lambda b: 'fits' if b <= 37 else 'out of memory', 4096)))")
  assert 33 <= found["batch"] <= 37 and not found["capped"], found
  tried = {int(b): outcome for b, outcome in found["tried"].items()}
  assert [b for b in (1, 2, 4, 8, 16, 32, 64) if tried[b] == "fits"] == [1, 2, 4, 8, 16, 32]
  assert tried[64] == "out of memory"
  # Every batch above the answer that was tried did not fit, every one below did.
  assert all((outcome == "fits") == (b <= found["batch"]) for b, outcome in tried.items())


def test_the_largest_batch_search_stops_at_a_failure_other_than_memory_and_at_its_cap():
  found = scaling_functions(
      "import json\n"
      "print(json.dumps([scaling.largest_batch(\n"
      "    lambda b: 'fits' if b < 8 else 'exit status 1, see x.log', 4096),\n"
      "    scaling.largest_batch(lambda b: 'fits', 16),\n"
      "    scaling.largest_batch(lambda b: 'out of memory', 16)]))")
  assert found[0]["batch"] == 4 and found[0]["error"] == "exit status 1, see x.log"
  assert found[1]["batch"] == 16 and found[1]["capped"]
  assert found[2]["batch"] == 0 and found[2]["tried"] == {"1": "out of memory"}


def test_a_gpu_device_file_leaves_the_trials_the_cards_memory_and_a_cpu_8_gib():
  limits = scaling_functions(
      "import json\n"
      "print(json.dumps([scaling.memory_limit_gib(-1, ['/dev/nvidia0']),\n"
      "                  scaling.memory_limit_gib(-1, []),\n"
      "                  scaling.memory_limit_gib(3.5, ['/dev/iluvatar0']),\n"
      "                  scaling.memory_limit_gib(0, [])]))")
  assert limits == [0, 8, 3.5, 0]


def test_repeated_runs_give_the_mean_and_every_run_or_the_first_error():
  found = scaling_functions(
      "import json, itertools\n"
      "scaling.FLAGS(['scaling', '--repeats=3'])\n"
      "fps = itertools.count(10, 2)\n"
      "good = scaling.repeated(lambda: {'fps': float(next(fps)), 'eval_s': 1.0,\n"
      "                                 'compute': 'float32'})\n"
      "runs = iter([{'fps': 1.0, 'eval_s': 1.0}, {'error': 'exit status 1, see x.log'},\n"
      "             {'fps': 1.0, 'eval_s': 1.0}])\n"
      "bad = scaling.repeated(lambda: next(runs))\n"
      "print(json.dumps([good, bad]))")
  assert found[0] == {"fps": 12.0, "eval_s": 1.0, "compute": "float32",
                      "fps_runs": [10.0, 12.0, 14.0]}
  assert found[1] == {"error": "exit status 1, see x.log"}


def run_scaling(*args, env=None, timeout=300):
  return subprocess.run([sys.executable, "-m", "bench.scaling"] + list(args),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        universal_newlines=True, cwd=ROOT, timeout=timeout,
                        env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})))


@pytest.mark.parametrize("args, line", [
    (["--models=tiny", "--num_train_steps=11"],
     "scaling: error: --num_train_steps: tiny's runs train 11 steps, which leaves no update "
     "after the 10 warm-up steps (--fps_warmup_steps) and the traced one; pass "
     "--num_train_steps=12 or more, or --fps_warmup_steps=9 or fewer (0 is tiny's 10)"),
    (["--models=medium", "--tables=speed", "--fps_warmup_steps=30"],
     "scaling: error: --num_train_steps: medium's runs train 24 steps, which leaves no update "
     "after the 30 warm-up steps (--fps_warmup_steps) and the traced one; pass "
     "--num_train_steps=32 or more, or --fps_warmup_steps=22 or fewer (0 is medium's 6)"),
    (["--models=tiny", "--num_train_steps=2", "--fps_warmup_steps=1"],
     "scaling: error: --num_train_steps: tiny's runs train 2 steps, which leaves no update "
     "after the 1 warm-up steps (--fps_warmup_steps) and the traced one; pass "
     "--num_train_steps=3 or more"),
    (["--horovod_args=--gloo --bogus"],
     "scaling: error: --horovod_args: --bogus is no option of horovodrun; pass its options "
     "(horovodrun --help lists them), e.g. --horovod_args=--gloo"),
    (["--train_batch_size=-4"],
     "scaling: error: --train_batch_size=-4; pass 0 (the model's own) or more"),
    (["--inter_op_threads=-1"],
     "scaling: error: --inter_op_threads=-1; pass 0 (chosen for the host) or more"),
    (["--repeats=0"],
     "scaling: error: flag --repeats=0: 0 is not a positive integer; --helpfull lists the "
     "flags"),
    (["--max_batch_limit=0"],
     "scaling: error: flag --max_batch_limit=0: 0 is not a positive integer; --helpfull "
     "lists the flags"),
    (["--horovod_args=--gloo -p"],
     "scaling: error: --horovod_args: horovodrun's -p takes a value; pass it after the "
     "option, e.g. --horovod_args='--gloo -p VALUE'"),
])
def test_a_run_that_could_not_measure_what_it_says_is_refused_in_one_line_before_any_work(
    tmp_path, args, line):
  out_dir = tmp_path / "out"
  result = run_scaling(*(args + ["--out_dir=" + str(out_dir)]))
  assert (result.returncode, result.stdout.splitlines()) == (2, [line])
  assert not out_dir.exists()


def test_a_second_ctrl_c_while_the_runs_are_ended_does_not_cut_the_ending_short(tmp_path):
  """A child that outlives SIGTERM holds the ending for STOP_SECONDS: the user presses
  Ctrl-C again meanwhile."""
  script = (
      "import subprocess, sys\n"
      "from absl import app\n"
      "from bench import scaling\n"
      "scaling.STOP_SECONDS = 3\n"
      "def measure():\n"
      "  print(scaling.temporary_folder('stubborn-'), flush=True)\n"
      "  scaling.start_child(['sh', '-c', 'trap \"\" TERM; echo $$; exec sleep 60'])\n"
      "  scaling.wait_child(scaling._CHILDREN[-1])\n"
      "scaling.measure = measure\n"
      "app.run(scaling.main, argv=['scaling', '--tables=engines', '--out_dir=%s'])\n"
      % (tmp_path / "out"))
  process = subprocess.Popen(
      [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      universal_newlines=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
  (folder, child) = (process.stdout.readline().strip(), process.stdout.readline().strip())
  assert os.path.isdir(folder) and child.isdigit(), (folder, child)
  process.send_signal(signal.SIGINT)
  time.sleep(1)
  process.send_signal(signal.SIGINT)
  out = process.communicate(timeout=60)[0]
  assert process.returncode == 130, out
  assert out.splitlines()[-1].startswith("scaling: interrupted; its training runs are ended")
  assert "Traceback" not in out
  assert not os.path.exists(folder) and not os.path.exists("/proc/" + child)


HOROVODRUN_USAGES = [
    "--gloo", "--gloo -np 2 -H localhost:2", "--gloo --log-level DEBUG",
    "--gloo --blacklist-cooldown-range 60 100", "--gloo --start-timeout=60",
    "--mpi --mpi-args=--bind-to=none", "--gloo -p 2222 --verbose"]


def test_horovodrun_usages_of_its_help_pass_the_check_of_horovod_args():
  passed = scaling_functions(
      "import json\n"
      "from bert_pretrain.distributed import launch\n"
      "options = launch.horovodrun_options()\n"
      "assert '--gloo' in options and options['-np']\n"
      "for args in %r:\n"
      "  scaling.check_horovod_args(args.split(), options)  # no SystemExit\n"
      "print(json.dumps(%r))\n" % (HOROVODRUN_USAGES, HOROVODRUN_USAGES))
  assert passed == HOROVODRUN_USAGES


def test_an_out_dir_under_a_file_is_said_in_one_line_before_any_work(tmp_path):
  (tmp_path / "a-file").write_text("")
  out_dir = str(tmp_path / "a-file" / "out")
  result = run_scaling("--out_dir=" + out_dir)
  assert (result.returncode, result.stdout.splitlines()) == (2, [
      "scaling: error: --out_dir=%s: cannot write %s (Not a directory); pass a folder you "
      "can write to" % (out_dir, out_dir)])


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory):
  """An --out_dir whose scaling_demo/ holds the demo's data."""
  out_dir = tmp_path_factory.mktemp("scaling-demo")
  subprocess.run([sys.executable, "-m", "bert_pretrain.demo",
                  "--demo_cache_dir=" + str(out_dir / "scaling_demo")], check=True,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, timeout=600,
                 env=dict(os.environ, PYTHONPATH=ROOT))
  return out_dir


ONE_HOROVOD_ROW = ["--models=tiny", "--tables=engines", "--engines=horovod", "--noindependent",
                   "--train_batch_size=4"]


def test_a_run_whose_trainings_failed_writes_its_table_and_exits_1(demo_out, tmp_path):
  out_dir = tmp_path / "out"
  shutil.copytree(str(demo_out), str(out_dir))
  for name in os.listdir(str(out_dir / "scaling_demo" / "train")):
    (out_dir / "scaling_demo" / "train" / name).write_text("not a TFRecord")
  result = run_scaling(*(ONE_HOROVOD_ROW + ["--num_train_steps=12", "--out_dir=" + str(out_dir)]),
                       timeout=600)
  assert result.returncode == 1, result.stdout[-3000:]
  assert result.stdout.splitlines()[-1] == (
      "scaling: error: 2 of 2 measurements failed; their cells say why and name their logs "
      "in %s" % (out_dir / "logs"))
  assert (out_dir / "scaling.md").read_text().count("failed: exit status") == 2


@pytest.mark.parametrize("stop, status, line", [
    (signal.SIGTERM, 143, "scaling: terminated (SIGTERM); "),
    (signal.SIGINT, 130, "scaling: interrupted; ")])
def test_a_stopped_run_ends_its_training_and_removes_its_folders(demo_out, tmp_path, stop,
                                                                 status, line):
  temporary = tmp_path / "tmp"
  temporary.mkdir()
  process = subprocess.Popen(
      [sys.executable, "-m", "bench.scaling"] + ONE_HOROVOD_ROW + [
          "--num_train_steps=100000", "--out_dir=" + str(demo_out)],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=ROOT, TMPDIR=str(temporary)))
  training = lambda: subprocess.run(["pgrep", "-f", "run_pretraining.*" + str(temporary)],
                                    stdout=subprocess.PIPE).stdout.split()
  try:
    deadline = time.time() + 300
    while not training() and process.poll() is None and time.time() < deadline:
      time.sleep(0.5)
    assert os.listdir(str(temporary)) and training()
    process.send_signal(stop)
    out = process.communicate(timeout=120)[0]
    assert process.returncode == status, out[-3000:]
    assert out.splitlines()[-1].startswith(line + "its training runs are ended"), out[-3000:]
    deadline = time.time() + 60  # a rank Horovod SIGKILLed ends when next scheduled
    while training() and time.time() < deadline:
      time.sleep(0.5)
    assert not os.listdir(str(temporary)) and not training()
  finally:  # what a failure left running would slow the rest of the suite down
    if process.poll() is None:  # not reaped: the pid is still its own
      kill_tree(process.pid)
    subprocess.run(["pkill", "-KILL", "-f", "run_pretraining.*" + str(temporary)])
