"""run_1card_FPS.sh and run_multi_card_FPS.sh, and the presets they choose.

The scripts only launch: a fake python3 on PATH prints the arguments run_pretraining would
get, which must be the script's --preset and the user's flags, untouched (the launch plan
comes from the real bert_pretrain.distributed.launch). How a preset, the demo and the
user's flags combine is config's (apply_presets, on flags parsed as the command line
parses them) and the demo's (set_up_run); the one-card demo then runs for real, through
its fine-tuning step, and is stopped by a signal once.
"""

import os
import re
import signal
import subprocess
import sys
import threading

from absl import flags
import pytest

from bert_pretrain import config
from bert_pretrain import demo
from bert_pretrain import pack_records
from bert_pretrain import run_pretraining
from bert_pretrain.distributed import launch
from bert_pretrain.training import checkpoints
from conftest import base_flags, forking_env, gone, passing_ranks_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = ["--input_files_dir=/data/train", "--eval_files_dir=/data/eval",
        "--bert_config_file=/data/bert_config.json"]


def script_args(tmp_path, script, *flags_given, **env):
  """The arguments `bash SCRIPT FLAGS` gives bert_pretrain.run_pretraining, as a list."""
  env = dict(os.environ, PATH=passing_ranks_path(tmp_path, print_args=True),
             IX_NUM_CUDA_VISIBLE_DEVICES="2", **env)
  env.pop("CUDA_VISIBLE_DEVICES", None)
  result = subprocess.run(["bash", os.path.join(ROOT, script)] + list(flags_given),
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env, timeout=120)
  assert result.returncode == 0, result.stderr
  if script == "run_1card_FPS.sh":
    return result.stdout.splitlines()
  line, checked = result.stdout.splitlines()
  assert " python3 -m bert_pretrain.run_pretraining " in line, line
  assert checked.startswith("DRY_RUN=1: the flags "), checked
  return line.split(" python3 -m bert_pretrain.run_pretraining ", 1)[1].split(" ")


@pytest.mark.parametrize("given", [DATA, [], ["--noamp", "--num_train_steps", "20"]])
def test_the_one_card_script_passes_its_preset_and_the_users_flags_untouched(tmp_path, given):
  assert script_args(tmp_path, "run_1card_FPS.sh", *given) == ["--preset=one_card"] + given


def test_the_multi_card_script_passes_its_preset_the_engine_and_the_users_flags(tmp_path):
  assert script_args(tmp_path, "run_multi_card_FPS.sh", *DATA, DRY_RUN="1") == [
      "--preset=multi_card"] + DATA
  assert script_args(tmp_path, "run_multi_card_FPS.sh", *DATA, DRY_RUN="1",
                     DISTRIBUTION="mirrored") == [
                         "--preset=multi_card", "--distribution=mirrored",
                         "--cpu_devices=2"] + DATA


def test_dry_run_0_runs_the_job_another_value_is_refused_and_the_help_is_printed_once(
    tmp_path):
  env = dict(os.environ, PATH=passing_ranks_path(tmp_path, print_args=True),
             IX_NUM_CUDA_VISIBLE_DEVICES="2")
  env.pop("CUDA_VISIBLE_DEVICES", None)

  def script(*words, **values):
    return subprocess.run(["bash", os.path.join(ROOT, "run_multi_card_FPS.sh")] + list(words),
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True,
                          env=forking_env(dict(env, **values), script=True), timeout=120)

  ran = script(*DATA, DRY_RUN="0")
  assert ran.returncode == 0, ran.stderr
  assert "nothing was started" not in ran.stdout
  # Each of the two ranks printed its arguments.
  assert ran.stdout.count("--preset=multi_card") == 1 + 2, ran.stdout
  refused = script(*DATA, DRY_RUN="yes")
  assert (refused.returncode, refused.stdout) == (2, "")
  assert refused.stderr == ("run_multi_card_FPS: error: DRY_RUN=yes; set DRY_RUN=1 to check "
                            "and print the plan only, or DRY_RUN=0 (or nothing) to run\n")
  for word in ("--help", "--helpfull", "--help=true", "-helpshort=1"):
    helped = script(word, *DATA, PATH=os.environ["PATH"])
    assert "Launching" not in helped.stdout
    # absl's help exits 1; printed once, not once a rank.
    assert helped.returncode == 1 and helped.stdout.count(
        "BERT pretraining (masked LM + next sentence): the command.") == 1, helped.stdout
    assert "--train_batch_size" in helped.stdout, helped.stdout + helped.stderr
  # --help=false asks for no help: the job runs (its two ranks print their arguments).
  unhelped = script(*DATA + ["--help=false"])
  assert unhelped.returncode == 0, unhelped.stderr
  assert unhelped.stdout.count("--help=false") == 1 + 2, unhelped.stdout


def test_the_one_card_scripts_dry_run_prints_the_command_checks_the_files_and_trains_nothing(
    tmp_path, pretraining_data):
  def script(*words, dry_run="1"):
    return subprocess.run(["bash", os.path.join(ROOT, "run_1card_FPS.sh")] + list(words),
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True,
                          env=forking_env(dict(os.environ, DRY_RUN=dry_run), script=True),
                          timeout=300)

  good = base_flags(pretraining_data, tmp_path / "out")
  checked = script(*good)
  assert checked.returncode == 0, checked.stderr
  assert checked.stdout.splitlines() == [
      "run_1card_FPS: python3 -m bert_pretrain.run_pretraining --preset=one_card "
      + " ".join(good),
      "DRY_RUN=1: the flags and run_pretraining --check_only pass; nothing was started"]
  assert os.listdir(str(tmp_path)) == []  # no output_dir, no demo folder
  missing = str(tmp_path / "missing")
  bad = script(*(good + ["--input_files_dir=" + missing]))
  assert bad.returncode == 2 and "nothing was started" not in bad.stdout
  assert bad.stderr.startswith("run_pretraining: error: --input_files_dir=%s " % missing)
  refused = script(*good, dry_run="yes")
  assert (refused.returncode, refused.stdout) == (2, "")
  assert refused.stderr == ("run_1card_FPS: error: DRY_RUN=yes; set DRY_RUN=1 to check and "
                            "print the plan only, or DRY_RUN=0 (or nothing) to run\n")


def test_a_dry_run_refuses_a_tf_config_the_run_would_refuse(tmp_path):
  env = dict(os.environ, DRY_RUN="1", DISTRIBUTION="multi_worker_mirrored", TF_CONFIG="notjson",
             IX_NUM_CUDA_VISIBLE_DEVICES="2")
  env.pop("CUDA_VISIBLE_DEVICES", None)
  result = subprocess.run(["bash", os.path.join(ROOT, "run_multi_card_FPS.sh")],
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env, timeout=120)
  assert result.returncode == 2, result.stdout + result.stderr
  assert result.stderr.startswith("run_pretraining: error: TF_CONFIG is not a cluster of "
                                  "workers (JSONDecodeError: ")
  assert len(result.stderr.splitlines()) == 1 and "nothing was started" not in result.stdout


def parsed(*argv):
  """Flags parsed as run_pretraining's command line parses them, presets applied."""
  values = flags.FlagValues()
  config.define_pretraining_flags(values)
  values(["run_pretraining"] + list(argv))
  config.apply_presets(values)
  return values


def test_the_one_card_preset_adds_amp_and_the_load_check_to_the_mlperf_defaults():
  values = parsed("--preset=one_card", *DATA)
  changed = {name for name in config.as_flags(config.settings_from_flags(values))
             if values[name].value != values[name].default}
  assert changed == {"amp", "eval_at_start", "input_files_dir", "eval_files_dir",
                     "bert_config_file"}
  assert not config.is_demo(values)


def test_the_multi_card_preset_is_the_anchors_accumulation_steps_and_horovod():
  values = parsed("--preset=multi_card", *DATA)
  assert (values.amp, values.num_accumulation_steps, values.num_train_steps,
          values.distribution) == (True, 4, 1000, "horovod")


@pytest.mark.parametrize("preset", config.SCRIPT_PRESETS)
def test_without_data_a_scripts_preset_is_the_demo_whose_settings_win_but_the_users_do(
    preset):
  values = parsed("--preset=%s" % preset, "--num_train_steps=2000", "--learning_rate=1e-3")
  assert config.is_demo(values)
  demo_values = dict(config.PRESETS["demo"], num_train_steps=2000, learning_rate=1e-3)
  assert {name: values[name].value for name in demo_values} == demo_values
  # One micro-batch an update on any number of cards, the demo's, not the script's 4.
  assert values.num_accumulation_steps == 1


@pytest.mark.parametrize("preset", ["one_card", "multi_card", "demo"])
@pytest.mark.parametrize("given,on", [
    ("--noamp", False), ("--amp=false", False), ("--nouse_fp16", False),
    ("--nomanual_fp16", False), ("--amp_dtype=auto", True), ("--amp_dtype=bfloat16", True),
    ("--use_fp16", True)])
def test_the_user_chooses_the_precision_over_the_presets(preset, given, on):
  for data in (DATA, []):  # with data, and the demo
    if preset == "demo" and data:
      continue
    assert config.mixed_precision(parsed("--preset=" + preset, given, *data)) is on


def test_the_demo_preset_with_the_users_data_is_an_error():
  with pytest.raises(ValueError, match=re.escape(
      "--preset=demo trains on the demo's data but --input_files_dir is given; drop it, or "
      "pass --preset=one_card to train on yours")):
    parsed("--preset=demo", *DATA)
  # Only an evaluation set: the demo would train on its own data and fail on the lengths.
  for preset in ("one_card", "multi_card"):
    with pytest.raises(ValueError, match=re.escape(
        "--eval_files_dir is given but not --input_files_dir, so this run would be the "
        "embedded demo, on its own data; pass --input_files_dir too, or drop "
        "--eval_files_dir for the demo")):
      parsed("--preset=" + preset, "--eval_files_dir=/data/eval")
  with pytest.raises(ValueError, match=re.escape(
      "--preset=demo evaluates on the demo's data but --eval_files_dir is given; drop it, or "
      "pass --preset=one_card with --input_files_dir to train on yours")):
    parsed("--preset=demo", "--eval_files_dir=/data/eval")


def test_a_value_given_after_its_flag_replaces_the_presets():
  assert parsed("--preset=multi_card", "--num_train_steps", "20", *DATA).num_train_steps == 20


def test_the_flag_defaults_hold_the_mlperf_settings():
  """No preset sets these: the flag definitions are their one home."""
  defaults = run_pretraining.FLAGS
  mlperf = {"output_dir": "./results", "max_seq_length": 512, "max_predictions_per_seq": 76,
            "optimizer": "lamb", "learning_rate": 5e-5, "num_train_steps": 13206,
            "save_checkpoints_steps": 1000, "stop_threshold": 0.72,
            "samples_between_eval": None, "samples_start_eval": 0,
            "gradient_clipping": "per_micro_batch", "lamb_adapt_layernorm_and_bias": False,
            "eval_batch_size": 24, "max_eval_steps": 0}
  assert {name: defaults[name].default for name in mlperf} == mlperf
  assert defaults["amp"].default is False  # the scripts' presets turn it on, as the anchor's


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory):
  cache = str(tmp_path_factory.mktemp("demo") / "cache")
  demo.prepare(cache, log=lambda line: None)
  return cache


def test_the_demo_takes_its_data_from_the_cache_and_a_new_folder_unless_given(
    demo_cache, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
               launch.LAUNCH_ID_VARIABLE):
    monkeypatch.delenv(name, raising=False)
  lines = []
  values = parsed("--preset=one_card", "--demo_cache_dir=" + demo_cache,
                  "--vocab_file=mine.txt")
  demo.set_up_run(values, log=lines.append)
  assert lines == ["No --input_files_dir: running the embedded demo (artefacts in %s)"
                   % demo_cache]
  assert (values.input_files_dir, values.eval_files_dir, values.bert_config_file,
          values.init_checkpoint) == tuple(os.path.join(demo_cache, name) for name in (
              "train", "eval", "bert_config.json", os.path.join("init", "model.ckpt-0")))
  assert values.vocab_file == "mine.txt"  # given: kept
  assert re.match(r"^results/demo-\d{8}-\d{6}$", values.output_dir)
  assert os.listdir("results") == [os.path.basename(values.output_dir)]
  given = parsed("--preset=demo", "--demo_cache_dir=" + demo_cache, "--output_dir=out",
                 "--enable_packed_data_mode")
  demo.set_up_run(given, log=lines.append)
  assert given.output_dir == "out"
  # Packed: the demo's training records packed beside them, which the run reads.
  assert given.input_files_dir == os.path.join(demo_cache, "train_packed")
  assert pack_records.read_summary(given.input_files_dir)["sequences_in"] > 0


def test_a_negative_fine_tuning_length_is_an_error_before_the_cache_is_built(tmp_path):
  cache = tmp_path / "cache"
  with pytest.raises(ValueError, match=re.escape(
      "--demo_finetune_epochs=-1 must not be negative; pass 0 for no fine-tuning step")):
    demo.set_up_run(parsed("--preset=one_card", "--demo_cache_dir=%s" % cache,
                           "--demo_finetune_epochs=-1"))
  assert not cache.exists()


def test_a_demo_run_with_a_bad_setting_ends_with_its_line_before_the_demo_is_built(tmp_path):
  cache = tmp_path / "cache"
  result = subprocess.run(["bash", os.path.join(ROOT, "run_1card_FPS.sh"),
                           "--learning_rate=-1", "--demo_cache_dir=%s" % cache],
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=300,
                          env=forking_env(dict(os.environ), script=True))
  assert result.returncode == 2, result.stdout + result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      "run_pretraining: error: --learning_rate=-1 must be positive (the peak of the "
      "schedule) and finite; pass e.g. --learning_rate=5e-05")
  assert "demo" not in result.stdout
  assert sorted(os.listdir(str(tmp_path))) == []


def test_a_demo_refused_once_its_data_is_read_leaves_no_empty_run_folder(demo_cache, tmp_path):
  """The records' length is known only from the cache: the folder made for the run goes
  again with the refusal."""
  result = subprocess.run(["bash", os.path.join(ROOT, "run_1card_FPS.sh"),
                           "--max_seq_length=256", "--demo_cache_dir=%s" % demo_cache],
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=300,
                          env=forking_env(dict(os.environ), script=True))
  assert result.returncode == 2, result.stdout + result.stderr
  assert result.stderr.strip().splitlines()[-1].endswith(
      "holds records of max_seq_length 128 and max_predictions_per_seq 20, but the run uses "
      "256 and 20; pass --max_seq_length=128 --max_predictions_per_seq=20"), result.stderr
  assert os.listdir(str(tmp_path / "results")) == []


def test_the_processes_of_one_launch_share_the_demos_folder_and_others_must_name_one(
    demo_cache, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("HOROVOD_RANK", "1")
  monkeypatch.setenv("HOROVOD_SIZE", "2")
  monkeypatch.setenv(launch.LAUNCH_ID_VARIABLE, "20261127-120000")
  lines = []
  for _ in range(2):  # two ranks of the launch
    values = parsed("--preset=multi_card", "--demo_cache_dir=" + demo_cache)
    demo.set_up_run(values, log=lines.append)
    assert values.output_dir == "results/demo-20261127-120000"
  assert lines == []  # rank 0 tells
  monkeypatch.delenv(launch.LAUNCH_ID_VARIABLE)
  with pytest.raises(ValueError, match="a demo of several processes needs one folder for "
                     "all; pass --output_dir=results/demo-mine, or start it with "
                     "run_multi_card_FPS.sh"):
    demo.set_up_run(parsed("--preset=multi_card", "--demo_cache_dir=" + demo_cache))
  # One process (horovodrun -np 1 by hand): a folder of its own, as without a launcher.
  monkeypatch.setenv("HOROVOD_RANK", "0")
  monkeypatch.setenv("HOROVOD_SIZE", "1")
  alone = parsed("--preset=multi_card", "--demo_cache_dir=" + demo_cache)
  demo.set_up_run(alone, log=lines.append)
  assert re.match(r"^results/demo-\d{8}-\d{6}$", alone.output_dir)


def _unbuffered_removed(env):
  """`env` without PYTHONUNBUFFERED: output to a pipe as a user's tee gets it (the lines
  the tests wait for must be flushed by the code)."""
  env.pop("PYTHONUNBUFFERED", None)
  return env


def _one_card_demo(demo_cache, cwd, *flags_given, forking=False):
  """forking: the script's Python processes fork (conftest.forking_env); not for a test
  that signals the script."""
  env = _unbuffered_removed(dict(
      os.environ, PATH="%s:%s" % (os.path.dirname(sys.executable), os.environ["PATH"])))
  env = forking_env(env, script=True) if forking else env
  return subprocess.Popen(["bash", os.path.join(ROOT, "run_1card_FPS.sh"),
                           "--demo_cache_dir=" + demo_cache, "--nodraw_report",
                           "--display_loss_steps=1"] + list(flags_given),
                          cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, env=env)


def test_the_one_card_demo_trains_then_fine_tunes_what_it_pretrained(demo_cache, tmp_path):
  script = _one_card_demo(demo_cache, tmp_path, "--num_train_steps=2",
                          "--demo_finetune_epochs=0.1", forking=True)
  out, _ = script.communicate(timeout=600)
  assert script.returncode == 0, out[-3000:]
  run, = os.listdir(str(tmp_path / "results"))
  assert re.search(r"^Step 2, total_loss", out, re.M)
  assert ("demo: masked-LM accuracy on held-out documents: " in out and
          "after 2 updates; predicting the most frequent token" in out)
  assert re.search(r"^demo: fine-tuning from results/%s/model.ckpt-2: " % run, out, re.M)
  assert re.search(r"^demo: word-order accuracy on held-out documents: [\d.]+ fine-tuned "
                   r"from the pretrained checkpoint, [\d.]+ from random weights", out, re.M)
  assert sorted(n for n in os.listdir(str(tmp_path / "results" / run))
                if n.startswith("finetune-")) == ["finetune-model.ckpt-2", "finetune-random"]


def _sigterm_at(script, prefix):
  """Sends SIGTERM to the script when it prints a line starting with `prefix`; returns its
  lines once it exited with 143."""
  lines = []
  for line in script.stdout:
    lines.append(line)
    if line.startswith(prefix):
      script.send_signal(signal.SIGTERM)
  assert script.wait(timeout=120) == 143, "".join(lines[-30:])
  return lines


def test_a_sigterm_stops_the_demo_with_its_checkpoint_and_no_fine_tuning(demo_cache, tmp_path):
  lines = _sigterm_at(_one_card_demo(demo_cache, tmp_path, "--output_dir=out"), "Step 3,")
  assert not any(line.startswith("demo: fine-tuning") for line in lines), lines
  # The demo has no target; stopped, its row says so as a run with one does.
  assert any(re.match(r"^\| 1 card \| acc \S+ \| fps \S+ \| status aborted \|$", line)
             for line in lines), lines[-30:]
  assert any(name.startswith("model.ckpt-") for name in os.listdir(str(tmp_path / "out")))


def _processes_naming(text):
  """The pids of the processes whose command line holds `text`."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open("/proc/%s/cmdline" % pid, "rb") as f:
        if text.encode() in f.read():
          found.append(int(pid))
    except OSError:
      pass
  return found


def test_a_sigterm_during_the_fine_tuning_step_ends_it_and_its_trainer(demo_cache, tmp_path):
  lines = _sigterm_at(_one_card_demo(demo_cache, tmp_path, "--output_dir=out",
                                     "--num_train_steps=2"), "demo: fine-tuning from")
  assert lines[-1].strip() == ("run_pretraining: SIGTERM during the demo's fine-tuning step "
                               "(the pretraining run is saved): exiting (nothing to save)")
  children = _processes_naming(str(tmp_path / "out" / "finetune-"))
  assert [pid for pid in children if not gone(pid, seconds=60)] == []


def test_mirrored_shows_the_count_per_host_of_cards_on_a_gpu_host_only(tmp_path):
  """On a GPU host the script shows the process IX_NUM_CUDA_VISIBLE_DEVICES cards, in the
  command it prints; on a CPU host a card list would stop the run (TensorFlow sees no
  GPU), and --cpu_devices carries the count."""
  bin_dir = tmp_path / "gpu_bin"
  bin_dir.mkdir()
  smi = bin_dir / "nvidia-smi"
  smi.write_text("#!/bin/sh\necho 'GPU 0: A100 (UUID: GPU-0)'\necho 'GPU 1: A100 (UUID: GPU-1)'\n")
  smi.chmod(0o755)
  env = dict(os.environ, DRY_RUN="1", DISTRIBUTION="mirrored", IX_NUM_CUDA_VISIBLE_DEVICES="2")
  env.pop("CUDA_VISIBLE_DEVICES", None)
  lines = {}
  # The process's check of its inputs (DRY_RUN=1) passes: /data is not here.
  for host, path in (("gpu", passing_ranks_path(tmp_path, "%s:%s" % (bin_dir, env["PATH"]))),
                     ("cpu", passing_ranks_path(tmp_path))):
    result = subprocess.run(["bash", os.path.join(ROOT, "run_multi_card_FPS.sh")] + DATA,
                            cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, env=dict(env, PATH=path), timeout=60)
    assert result.returncode == 0, result.stderr
    lines[host], checked = result.stdout.splitlines()
    assert checked == ("DRY_RUN=1: the flags and run_pretraining --check_only on this host "
                       "pass; nothing was started")
  command = ("python3 -m bert_pretrain.run_pretraining --preset=multi_card "
             "--distribution=mirrored --cpu_devices=2 " + " ".join(DATA))
  assert lines["gpu"] == ("Launching 1 process driving 2 cards (mirrored): env "
                          "CUDA_VISIBLE_DEVICES=0,1 " + command)
  assert lines["cpu"] == ("Launching 1 process driving 2 logical CPU devices (mirrored): " +
                          command)


def test_a_demos_dry_run_checks_the_output_folder_it_is_given(tmp_path):
  a_file = tmp_path / "a-file"
  a_file.write_text("not a folder")
  held = tmp_path / "held"
  held.mkdir()
  lock = checkpoints.OutputDirLock(str(held))
  lock.acquire()
  env = dict(os.environ, DRY_RUN="1", IX_NUM_CUDA_VISIBLE_DEVICES="2")
  env.pop("CUDA_VISIBLE_DEVICES", None)
  for output_dir, message in (
      (a_file, "cannot be written: %s is a file, not a folder; pass another path" % a_file),
      (held, "is in use by another run (pid %d" % os.getpid()),
      (tmp_path / "new", None)):
    result = subprocess.run(["bash", os.path.join(ROOT, "run_multi_card_FPS.sh"),
                             "--output_dir=%s" % output_dir], cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, env=forking_env(env, script=True),
                            timeout=300)
    if message is None:
      assert result.returncode == 0, result.stderr
      assert not (tmp_path / "new").exists()  # a dry run makes nothing
    else:
      assert result.returncode == 2, result.stdout + result.stderr
      assert result.stderr.strip().splitlines()[-1].startswith(
          "run_pretraining: error: --output_dir=%s %s" % (output_dir, message)), result.stderr
  lock.release()


def _demo(cache, cwd, *flags_given):
  return subprocess.Popen([sys.executable, "-m", "bert_pretrain.demo",
                           "--demo_cache_dir=%s" % cache]
                          + list(flags_given), cwd=str(cwd), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True,
                          env=_unbuffered_removed(dict(os.environ, PYTHONPATH=ROOT,
                                                       TF_CPP_MIN_LOG_LEVEL="2")))


def _read_until(process, text):
  """The lines `process` printed up to and with the first holding `text`."""
  lines = []
  for line in process.stdout:
    lines.append(line)
    if text in line:
      return lines
  raise AssertionError("no %r in: %s" % (text, "".join(lines[-20:])))


def test_two_demos_started_at_once_on_an_empty_cache_both_succeed(tmp_path):
  # The test holds the cache's lock until both demos wait for it, so they contend
  # however the machine schedules their starts; a demo that never says it waits is
  # killed after 300 s, which ends the reading.
  cache = tmp_path / "cache"
  cache.mkdir()
  lock = checkpoints.OutputDirLock(str(cache))
  lock.acquire()
  demos = [_demo(cache, tmp_path) for _ in range(2)]
  watchdog = threading.Timer(300, lambda: [demo_run.kill() for demo_run in demos])
  watchdog.start()
  try:
    for demo_run in demos:
      _read_until(demo_run, "demo: %s is in use (another demo, or another rank of this one, "
                  "checks or builds it); waiting for it" % cache)
    lock.release()
    outputs = [demo_run.communicate(timeout=300) for demo_run in demos]
  finally:
    watchdog.cancel()
    lock.release()
    for demo_run in demos:
      if demo_run.poll() is None:
        demo_run.kill()
        demo_run.wait()
  for demo_run, (out, err) in zip(demos, outputs):
    assert demo_run.returncode == 0, err[-3000:]
    assert ("demo: the cache is ready: --bert_config_file=%s" % (cache / "bert_config.json")
            in out)
  # The cache was built once, under its lock: the other demo waited, then found it built.
  built = [out for out, _ in outputs if "building a 4096-token WordPiece vocab" in out]
  assert len(built) == 1
  assert sorted(os.listdir(str(cache))) == [".bert_pretrain.lock", "bert_config.json", "eval",
                                            "init", "text", "train", "vocab.txt"]
  assert os.listdir(str(tmp_path)) == ["cache"]  # no run folder: building trains nothing


def test_demos_started_in_the_same_second_train_in_folders_of_their_own(tmp_path):
  folders = [demo.new_output_dir(str(tmp_path / "results")) for _ in range(3)]
  assert len(set(folders)) == 3 and all(os.path.isdir(f) for f in folders)


def test_the_demos_fine_tuning_from_a_folder_that_is_not_a_run_is_an_error(tmp_path):
  (tmp_path / "results").mkdir()
  for given, message in (
      ("results/demo-typo", "--finetune_from=results/demo-typo does not exist"),
      ("results", "--finetune_from=results holds neither a checkpoint nor a pretraining run")):
    demo_run = _demo(tmp_path / "cache", tmp_path, "--finetune_from=" + given)
    _, err = demo_run.communicate(timeout=120)
    assert demo_run.returncode == 2
    assert err.strip().splitlines()[-1] == (
        "demo: error: %s; pass the --output_dir of the demo's pretraining run "
        "(results/demo-<time>)" % message)
  assert not (tmp_path / "cache").exists()
