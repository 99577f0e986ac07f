"""run_1card_FPS.sh and run_multi_card_FPS.sh: the command line they start.

A fake python3 on PATH prints the arguments run_pretraining would get (the demo's flags
come from the real bert_pretrain.demo.run_flags, the launch plan from the real
bert_pretrain.distributed.launch); the multi-card script's DRY_RUN=1 prints its command. Each flag
must appear once, the user's value winning over the demo's and the script's, and --noamp
must turn off the scripts' mixed precision.
"""

import os
import shlex
import signal
import subprocess
import sys

import pytest

from bert_pretrain import run_pretraining

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_PATHS = ("{'input_files_dir': 'cache/train', 'eval_files_dir': 'cache/eval', "
              "'vocab_file': 'cache/vocab.txt', 'bert_config_file': 'cache/bert_config.json', "
              "'init_checkpoint': 'cache/init/model.ckpt-0'}")


FINETUNE_CALLS = []  # script_args' last run: the demo's --finetune_from, if it ran


def script_args(tmp_path, script, *flags, **env):
  """The arguments `bash SCRIPT FLAGS` gives bert_pretrain.run_pretraining, as a list."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  fake = bin_dir / "python3"
  fake.write_text(
      "#!/bin/sh\n"
      "case \"$2\" in\n"
      "  bert_pretrain.demo) case \"$4\" in --finetune_from=*) echo \"$4\"; exit 0 ;; esac\n"
      "    exec %s -c \"from bert_pretrain import demo; "
      "print(chr(10).join(demo.run_flags(%s, 'results/demo-test')))\" ;;\n"
      "  bert_pretrain.run_pretraining) shift 2; printf '%%s\\n' \"$@\" ;;\n"
      "  *) exec %s \"$@\" ;;\n"
      "esac\n" % (sys.executable, DEMO_PATHS, sys.executable))
  fake.chmod(0o755)
  env = dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]),
             DEMO_CACHE=str(tmp_path / "cache"), IX_NUM_CUDA_VISIBLE_DEVICES="2", **env)
  env.pop("CUDA_VISIBLE_DEVICES", None)
  result = subprocess.run(["bash", os.path.join(ROOT, script)] + list(flags), cwd=str(tmp_path),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env, timeout=120)
  assert result.returncode == 0, result.stderr
  lines = [l for l in result.stdout.splitlines() if not l.startswith("No --input_files_dir")]
  if script == "run_1card_FPS.sh":
    # The demo's downstream step comes after: bert_pretrain.demo --finetune_from=DIR.
    FINETUNE_CALLS[:] = [l for l in lines if l.startswith("--finetune_from=")]
    return [l for l in lines if not l.startswith("--finetune_from=")]
  assert len(lines) == 1 and "python3 -m bert_pretrain.run_pretraining " in lines[0], lines
  return shlex.split(lines[0].split(" python3 -m bert_pretrain.run_pretraining ", 1)[1])


def names(args):
  return [a.lstrip("-").split("=")[0] for a in args]


def assert_each_flag_once(args):
  seen = names(args)
  assert len(seen) == len(set(seen)), args
  # --noamp and --amp, or --amp and its aliases, would contradict each other.
  amp = [n for n in seen if n in ("amp", "noamp", "use_fp16", "nouse_fp16")]
  assert len(amp) <= 1, args


SCRIPTS = ["run_1card_FPS.sh", "run_multi_card_FPS.sh"]
DATA = ["--input_files_dir=/data/train", "--eval_files_dir=/data/eval",
        "--bert_config_file=/data/bert_config.json"]


def test_the_one_card_demo_fine_tunes_what_it_pretrained_in_the_output_dir_that_won(tmp_path):
  args = script_args(tmp_path, "run_1card_FPS.sh")
  assert FINETUNE_CALLS == ["--finetune_from=results/demo-test"]
  assert "--output_dir=results/demo-test" in args
  for given in (["--output_dir=mine"], ["--output_dir", "mine"]):
    args = script_args(tmp_path, "run_1card_FPS.sh", *given)
    assert FINETUNE_CALLS == ["--finetune_from=mine"]
    assert "--output_dir=results/demo-test" not in args
  script_args(tmp_path, "run_1card_FPS.sh", *DATA)
  assert FINETUNE_CALLS == []  # not after the user's own data


def test_the_one_card_script_passes_only_amp_the_load_check_and_the_users_flags(tmp_path):
  args = script_args(tmp_path, "run_1card_FPS.sh", *DATA)
  assert args == ["--amp", "--eval_at_start"] + DATA


def test_the_multi_card_script_adds_horovod_and_the_anchors_accumulation_and_steps(tmp_path):
  args = script_args(tmp_path, "run_multi_card_FPS.sh", *DATA, DRY_RUN="1")
  assert args == ["--horovod", "--amp", "--eval_at_start", "--num_accumulation_steps=4",
                  "--num_train_steps=1000"] + DATA


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_demo_shows_each_flag_once_with_the_users_value(tmp_path, script):
  args = script_args(tmp_path, script, "--num_train_steps=2000", "--learning_rate=1e-3",
                     DRY_RUN="1")
  assert_each_flag_once(args)
  assert "--amp" in args
  assert args[-2:] == ["--num_train_steps=2000", "--learning_rate=1e-3"]
  assert "--input_files_dir=cache/train" in args and "--max_seq_length=128" in args
  if script == "run_multi_card_FPS.sh":
    # The demo's settings win over the script's: one micro-batch per update.
    assert "--num_accumulation_steps=1" in args and "--horovod" in args


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("off", ["--noamp", "--amp=false", "--nouse_fp16"])
def test_the_user_turns_mixed_precision_off(tmp_path, script, off):
  for flags in (DATA, []):  # with data, and the demo
    args = script_args(tmp_path, script, *(flags + [off]), DRY_RUN="1")
    assert_each_flag_once(args)
    assert "--amp" not in args and args[-1] == off


def test_a_value_given_after_its_flag_replaces_the_scripts(tmp_path):
  args = script_args(tmp_path, "run_multi_card_FPS.sh", *DATA + ["--num_train_steps", "20"],
                     DRY_RUN="1")
  assert args[-2:] == ["--num_train_steps", "20"]
  assert "--num_train_steps=1000" not in args


def test_the_flag_defaults_hold_the_mlperf_settings():
  """The scripts pass none of these: the flag definitions are their one home."""
  flags = run_pretraining.FLAGS
  mlperf = {"output_dir": "./results", "max_seq_length": 512, "max_predictions_per_seq": 76,
            "optimizer": "lamb", "learning_rate": 5e-5, "num_train_steps": 13206,
            "save_checkpoints_steps": 1000, "stop_threshold": 0.72,
            "samples_between_eval": None, "samples_start_eval": 0,
            "gradient_clipping": "per_micro_batch", "lamb_adapt_layernorm_and_bias": False,
            "eval_batch_size": 24, "max_eval_steps": 0}
  assert {name: flags[name].default for name in mlperf} == mlperf
  assert flags["amp"].default is False  # the scripts pass --amp, as the anchor's do


def test_a_sigterm_to_the_demo_script_reaches_the_trainer_and_ends_the_script(tmp_path):
  """The demo does not exec the trainer (the downstream step follows), so the script
  passes SIGTERM on: the trainer checkpoints and exits 143, and so does the script."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  fake = bin_dir / "python3"
  fake.write_text(
      "#!/bin/bash\n"
      "case \"$2\" in\n"
      "  bert_pretrain.demo) case \"$4\" in --finetune_from=*) echo finetuned; exit 0 ;; esac\n"
      "    echo --output_dir=out ;;\n"
      "  bert_pretrain.run_pretraining) trap 'echo trainer got TERM; exit 143' TERM\n"
      "    echo trainer started; for i in $(seq 600); do sleep 0.1; done; exit 0 ;;\n"
      "  *) exec %s \"$@\" ;;\n"
      "esac\n" % sys.executable)
  fake.chmod(0o755)
  env = dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]),
             DEMO_CACHE=str(tmp_path / "cache"))
  script = subprocess.Popen(["bash", os.path.join(ROOT, "run_1card_FPS.sh")],
                            cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, universal_newlines=True, env=env)
  lines = []
  for line in script.stdout:
    lines.append(line)
    if line.startswith("trainer started"):
      script.send_signal(signal.SIGTERM)
  assert script.wait(timeout=60) == 143, lines
  assert "trainer got TERM\n" in lines and "finetuned\n" not in lines, lines


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
  for host, path in (("gpu", "%s:%s" % (bin_dir, env["PATH"])), ("cpu", env["PATH"])):
    result = subprocess.run(["bash", os.path.join(ROOT, "run_multi_card_FPS.sh")] + DATA,
                            cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, env=dict(env, PATH=path), timeout=60)
    assert result.returncode == 0, result.stderr
    lines[host] = result.stdout.strip()
  command = ("python3 -m bert_pretrain.run_pretraining --distribution=mirrored --cpu_devices=2 "
             "--amp --eval_at_start --num_accumulation_steps=4 --num_train_steps=1000 " +
             " ".join(DATA))
  assert lines["gpu"] == ("Launching 1 process driving 2 cards (mirrored): env "
                          "CUDA_VISIBLE_DEVICES=0,1 " + command)
  assert lines["cpu"] == "Launching 1 process driving 2 cards (mirrored): " + command


def _demo(cache, cwd, *flags):
  return subprocess.Popen([sys.executable, "-m", "bert_pretrain.demo", "--cache_dir=%s" % cache]
                          + list(flags), cwd=str(cwd), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True,
                          env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"))


def test_two_demos_started_at_once_on_an_empty_cache_both_succeed(tmp_path):
  cache = tmp_path / "cache"
  demos = [_demo(cache, tmp_path) for _ in range(2)]
  outputs = [demo.communicate(timeout=300) for demo in demos]
  for demo, (_, err) in zip(demos, outputs):
    assert demo.returncode == 0, err[-3000:]
  # The cache was built once, under its lock: the second waited, then found it built.
  waited = [err for _, err in outputs if "another demo is building" in err]
  built = [err for _, err in outputs if "building a 4096-token WordPiece vocab" in err]
  assert len(waited) == 1 and len(built) == 1
  assert sorted(os.listdir(str(cache))) == [".bert_pretrain.lock", "bert_config.json", "eval",
                                            "init", "text", "train", "vocab.txt"]
  # Each trains in a folder of its own, even when both start in the same second.
  output_dirs = [[l for l in out.splitlines() if l.startswith("--output_dir=")][0]
                 for out, _ in outputs]
  assert len(set(output_dirs)) == 2
  for flag in output_dirs:
    assert os.path.isdir(str(tmp_path / flag.split("=", 1)[1]))


def test_the_demos_fine_tuning_from_a_folder_that_is_not_a_run_is_an_error(tmp_path):
  (tmp_path / "results").mkdir()
  for given, message in (
      ("results/demo-typo", "--finetune_from=results/demo-typo does not exist"),
      ("results", "--finetune_from=results holds neither a checkpoint nor a pretraining run")):
    demo = _demo(tmp_path / "cache", tmp_path, "--finetune_from=" + given)
    _, err = demo.communicate(timeout=120)
    assert demo.returncode == 2
    assert err.strip().splitlines()[-1] == (
        "demo: error: %s; pass the --output_dir of the demo's pretraining run "
        "(results/demo-<time>)" % message)
  assert not (tmp_path / "cache").exists()
