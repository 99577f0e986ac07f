"""init_tf.sh's decisions, through its dry run (INIT_TF_DRY_RUN=1), on machines made of fakes.

A fake `nvidia-smi` / `ixsmi` on PATH lists GPUs or none, a wrapper Python sees a fake
TensorFlow (a "vendor" build), or none, and fake CUDA / NCCL folders have their headers or
not. Nothing of this machine (its nvcc, its TensorFlow) decides the outcome.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
A100 = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-0)\nGPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\n"
BI_V100 = "GPU 0: Iluvatar BI-V100 (UUID: GPU-2)\n"
NO_DEVICES = "No devices were found\n"


def _executable(path, text):
  path.write_text(text)
  path.chmod(0o755)
  return str(path)


def _fake_tool(folder, name, output, status=0):
  _executable(folder / name, "#!/bin/sh\ncat <<'EOF'\n%sEOF\nexit %d\n" % (output, status))


def _fake_toolkit(folder, headers, nvcc=False):
  """A folder like CUDA's or NCCL's, with the given include/ headers."""
  (folder / "include").mkdir(parents=True)
  (folder / "bin").mkdir()
  for header in headers:
    (folder / "include" / header).write_text("/* fake */\n")
  if nvcc:
    _executable(folder / "bin" / "nvcc", "#!/bin/sh\nexit 0\n")
  return str(folder)


def run_dry(tmp_path, nvidia_smi=None, ixsmi=None, tensorflow=None, horovod=False,
            cuda=False, nccl=None, openmpi=True, bert_pretrain=None, setuptools=None,
            wrapper=(), **settings):
  """Runs `INIT_TF_DRY_RUN=1 bash init_tf.sh` on a faked machine; returns the
  CompletedProcess.

  PATH holds only the fakes and the few plain tools the script uses, so this machine's
  own nvidia-smi, nvcc or OpenMPI play no part. The fake Python, apt-get and pip log each
  call to tmp_path/calls.

  Args:
    nvidia_smi, ixsmi: what `<tool> -L` prints (exit 6 for NO_DEVICES), or None: no such tool.
    tensorflow: the version of a fake TensorFlow that imports, or None: `import tensorflow`
      fails.
    horovod: whether `import horovod.tensorflow` works.
    cuda: whether CUDA_HOME has include/cuda_runtime.h and bin/nvcc.
    nccl: None leaves NCCL_HOME unset; True / False sets it to a folder with / without
      include/nccl.h.
    openmpi: whether mpicc and mpirun are on PATH (the fake user is root either way).
    bert_pretrain: the checkout folder `import bert_pretrain` reports, or None: it fails.
    setuptools: the version of a fake setuptools, or None: the real one.
    wrapper: a command line that runs bash, e.g. strace's.
    **settings: more environment variables (None removes one).
  """
  bin_dir = tmp_path / "bin"
  modules = tmp_path / "modules"
  calls = tmp_path / "calls"
  for folder in (bin_dir, modules / "tensorflow", modules / "horovod" / "tensorflow"):
    folder.mkdir(parents=True)
  for tool in ("dirname", "grep", "wc", "cut", "paste", "cat", "env"):
    os.symlink(shutil.which(tool), str(bin_dir / tool))
  for name, output in (("nvidia-smi", nvidia_smi), ("ixsmi", ixsmi)):
    if output is not None:
      _fake_tool(bin_dir, name, output, 6 if output == NO_DEVICES else 0)
  for name in ("mpicc", "mpirun") if openmpi else ():
    _fake_tool(bin_dir, name, "")
  _fake_tool(bin_dir, "id", "0\n")
  _executable(bin_dir / "apt-get", "#!/bin/sh\necho apt-get \"$@\" >> %s\n" % calls)
  (modules / "tensorflow" / "__init__.py").write_text(
      "__version__ = %r\n" % tensorflow if tensorflow else "raise ImportError('no TensorFlow')\n")
  (modules / "horovod" / "__init__.py").write_text(
      "__version__ = '0.28.1'\n" if horovod else "raise ImportError('no Horovod')\n")
  (modules / "horovod" / "tensorflow" / "__init__.py").write_text("")
  (modules / "bert_pretrain").mkdir()
  (modules / "bert_pretrain" / "__init__.py").write_text(
      "__file__ = %r\n" % os.path.join(bert_pretrain, "bert_pretrain", "__init__.py")
      if bert_pretrain else "raise ImportError('no bert_pretrain')\n")
  if setuptools:
    (modules / "setuptools.py").write_text("__version__ = %r\n" % setuptools)
  python = _executable(tmp_path / "python",
                       "#!/bin/sh\necho python \"$@\" >> %s\nPYTHONPATH=%s exec %s \"$@\"\n"
                       % (calls, modules, sys.executable))
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHON", "CUDA_HOME", "NCCL_HOME", "TF_VERSION", "PYTHONPATH")}
  env.update(PATH=str(bin_dir), PYTHON=python, INIT_TF_DRY_RUN="1",
             CUDA_HOME=_fake_toolkit(tmp_path / "cuda", ["cuda_runtime.h"] if cuda else [],
                                     nvcc=cuda))
  if nccl is not None:
    env["NCCL_HOME"] = _fake_toolkit(tmp_path / "nccl", ["nccl.h"] if nccl else [])
  env.update(settings)
  env = {k: v for k, v in env.items() if v is not None}
  return subprocess.run(list(wrapper) + [shutil.which("bash"), os.path.join(ROOT, "init_tf.sh")],
                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        universal_newlines=True, timeout=120)


def dry_run(tmp_path, **machine):
  """run_dry on the machine run_dry's arguments describe, which must succeed.

  Returns:
    (decision lines without "init_tf: ", command lines without "+ "), both lists of str.
  """
  calls = tmp_path / "calls"
  result = run_dry(tmp_path, **machine)
  assert result.returncode == 0, result.stdout + result.stderr
  lines = result.stdout.splitlines()
  assert all(line.startswith(("init_tf: ", "+ ")) for line in lines), result.stdout
  # A dry run only looks: no apt-get, no pip.
  logged = calls.read_text() if calls.exists() else ""
  assert "apt-get" not in logged and " -m pip" not in logged, logged
  return ([l[len("init_tf: "):] for l in lines if l.startswith("init_tf: ")],
          [l[2:] for l in lines if l.startswith("+ ")])


def _decision(decisions, topic):
  found = [d for d in decisions if d.startswith(topic + ": ")]
  assert len(found) == 1, decisions
  return found[0][len(topic) + 2:]


def _horovod_build(commands):
  found = [c for c in commands if "horovod==0.28.1" in c]
  assert len(found) == 1, commands
  return found[0]


def test_a_gpu_without_tensorflow_gets_the_gpu_build_and_nccl_horovod(tmp_path):
  decisions, commands = dry_run(tmp_path, nvidia_smi=A100, cuda=True)
  assert _decision(decisions, "GPU").startswith("nvidia-smi -L lists 2: GPU 0: NVIDIA A100")
  assert "installing tensorflow[and-cuda]==2.15.1" in _decision(decisions, "TensorFlow")
  assert any("tensorflow\\[and-cuda\\]==2.15.1" in c for c in commands), commands
  assert not any("tensorflow-cpu" in c for c in commands), commands
  # NCCL comes with tensorflow[and-cuda] (nvidia-nccl-cu12), CUDA from CUDA_HOME.
  assert "with GPU operations (NCCL" in _decision(decisions, "Horovod")
  build = _horovod_build(commands)
  assert "HOROVOD_GPU_OPERATIONS=NCCL" in build
  assert "HOROVOD_CUDA_HOME=%s" % (tmp_path / "cuda") in build
  assert "HOROVOD_NCCL_HOME=" in build and "/nvidia/nccl" in build


def test_iluvatars_ixsmi_counts_as_a_gpu(tmp_path):
  decisions, commands = dry_run(tmp_path, nvidia_smi=NO_DEVICES, ixsmi=BI_V100, cuda=True,
                                nccl=True)
  assert _decision(decisions, "GPU") == "ixsmi -L lists 1: " + BI_V100.strip()
  assert "tensorflow[and-cuda]==2.15.1" in _decision(decisions, "TensorFlow")
  assert "HOROVOD_NCCL_HOME=%s" % (tmp_path / "nccl") in _horovod_build(commands)


def test_a_vendor_tensorflow_on_a_gpu_is_kept(tmp_path):
  decisions, commands = dry_run(tmp_path, nvidia_smi=A100, tensorflow="1.15.5", cuda=True,
                                nccl=True)
  assert _decision(decisions, "TensorFlow") == "keeping the installed 1.15.5 (it imports)"
  assert not any(re.search(r" tensorflow\S*==", c) for c in commands), commands
  # TensorFlow 1.x keeps the numpy it came with, and gets the tokenizers of its Pythons.
  assert any("numpy==" in c and "tokenizers\\<0.14" in c for c in commands), commands
  assert "HOROVOD_GPU_OPERATIONS=NCCL" in _horovod_build(commands)


def test_a_vendor_horovod_is_kept(tmp_path):
  decisions, commands = dry_run(tmp_path, nvidia_smi=A100, tensorflow="1.15.5", horovod=True,
                                cuda=True, nccl=True)
  assert _decision(decisions, "Horovod") == "keeping the installed 0.28.1 (it imports)"
  assert not any("horovod==" in c for c in commands), commands


def test_no_gpu_gets_the_cpu_build_and_cpu_horovod(tmp_path):
  decisions, commands = dry_run(tmp_path, nvidia_smi=NO_DEVICES, cuda=True, nccl=True)
  assert _decision(decisions, "GPU") == "none (nvidia-smi -L and ixsmi -L list no GPU)"
  assert "installing tensorflow-cpu==2.15.1 (no TensorFlow imports and no GPU is visible)" \
      in _decision(decisions, "TensorFlow")
  assert any("tensorflow-cpu==2.15.1 numpy\\<2" in c for c in commands), commands
  assert _decision(decisions, "Horovod") == \
      "building 0.28.1 with CPU operations only (no GPU is visible)"
  assert "HOROVOD_GPU_OPERATIONS" not in _horovod_build(commands)


def test_a_gpu_without_cuda_headers_builds_cpu_horovod_and_says_why(tmp_path):
  decisions, commands = dry_run(tmp_path, nvidia_smi=A100, cuda=False, nccl=True)
  horovod = _decision(decisions, "Horovod")
  assert "CPU operations only: a GPU is visible but CUDA is not found" in horovod
  assert str(tmp_path / "cuda") in horovod and "set CUDA_HOME" in horovod
  assert "HOROVOD_GPU_OPERATIONS" not in _horovod_build(commands)


def _delayed_writes(log, microseconds):
  """strace's words that hold every process's second write for `microseconds`, or None
  where strace is missing, too old (4.22 added delays) or may not trace (ptrace)."""
  strace = shutil.which("strace")
  words = [strace, "-f", "-o", log, "-e", "trace=write", "-e",
           "inject=write:delay_enter=%d:when=2" % microseconds]
  if strace and subprocess.run(words + ["true"]).returncode == 0:
    return words
  return None


@pytest.mark.skipif(not _delayed_writes(os.devnull, 1),
                    reason="needs strace 4.22 or later and ptrace")
def test_a_pipe_whose_reader_stops_early_does_not_end_the_script(tmp_path):
  # Each process's second write waits 0.2 s, as on a loaded machine: a reader that
  # stops after one line (head -n 1) is gone by then, and under pipefail the writer's
  # SIGPIPE ended init_tf.sh with 141 right after the OpenMPI line.
  wrapper = _delayed_writes(str(tmp_path / "strace.log"), 200000)
  decisions, _ = dry_run(tmp_path, nvidia_smi=A100, wrapper=wrapper)
  assert _decision(decisions, "GPU") == "nvidia-smi -L lists 2: " + A100.splitlines()[0]


def test_a_command_that_fails_unexpectedly_is_named_by_its_line_in_a_last_error_line(
    tmp_path):
  # A vendor TensorFlow whose version is not a number: reading its numpy pin fails.
  result = run_dry(tmp_path, nvidia_smi=NO_DEVICES, tensorflow="vendor")
  assert result.returncode == 1
  said = re.fullmatch(r"init_tf: error: line (\d+) of init_tf.sh failed with exit status 1; "
                      r"the lines above say why; run it again once that is fixed",
                      result.stderr.splitlines()[-1])
  assert said, result.stderr
  script = open(os.path.join(ROOT, "init_tf.sh")).read().splitlines()
  assert script[int(said.group(1)) - 1].startswith("  numpy_pin=$("), said.group(0)
  assert "ValueError" in result.stderr


@pytest.mark.parametrize("status, said", [(141, "141 (SIGPIPE)"), (200, "200")])
def test_the_last_error_line_names_a_signal_only_for_a_status_that_is_one(status, said,
                                                                         tmp_path):
  # The Python that reads the numpy pin fails with `status`; the others answer.
  failing = _executable(tmp_path / "failing", "#!/bin/sh\ncase \"$2\" in *'numpy, tensorflow'*) "
                        "exit %d ;; esac\nexec %s \"$@\"\n" % (status, tmp_path / "python"))
  result = run_dry(tmp_path, nvidia_smi=A100, tensorflow="2.15.1", PYTHON=failing)
  assert result.returncode == status, result.stderr
  assert re.fullmatch(r"init_tf: error: line \d+ of init_tf.sh failed with exit status %s; .*"
                      % re.escape(said), result.stderr.splitlines()[-1]), result.stderr


def test_a_gpu_without_nccl_headers_builds_cpu_horovod_and_says_why(tmp_path):
  decisions, commands = dry_run(tmp_path, nvidia_smi=A100, tensorflow="2.15.1", cuda=True,
                                nccl=False)
  horovod = _decision(decisions, "Horovod")
  assert "CPU operations only: a GPU is visible but NCCL is not found" in horovod
  assert str(tmp_path / "nccl") in horovod and "set NCCL_HOME" in horovod
  assert "HOROVOD_GPU_OPERATIONS" not in _horovod_build(commands)


def test_tensorflow_1_15_gets_a_python_37_environment_with_its_pins(tmp_path):
  venv = tmp_path / "venv"
  decisions, commands = dry_run(tmp_path, nvidia_smi=NO_DEVICES, TF_VERSION="1.15.0",
                                PYTHON=None, TF_VENV=str(venv), PYTHON37=sys.executable)
  assert _decision(decisions, "Python").startswith("creating %s from %s" % (venv,
                                                                           sys.executable))
  assert commands[0] == "%s -m venv %s" % (sys.executable, venv)
  python = str(venv / "bin" / "python")
  assert all(c.startswith(python) or c.startswith("env ") for c in commands[1:]), commands
  install = [c for c in commands if "tensorflow-cpu==1.15.0" in c]
  assert len(install) == 1 and "numpy\\<1.20" in install[0] and "protobuf\\<3.21" in install[0]
  assert any("tokenizers\\<0.14" in c and "matplotlib" in c for c in commands), commands
  assert _decision(decisions, "Python packages").startswith("numpy<1.20 tokenizers<0.14 ")


def test_missing_openmpi_is_installed_from_debian_waiting_for_a_held_dpkg_lock(tmp_path):
  decisions, commands = dry_run(tmp_path, nvidia_smi=NO_DEVICES, openmpi=False)
  assert _decision(decisions, "OpenMPI").startswith("installing libopenmpi-dev openmpi-bin")
  # Two init_tf runs at once failed with "Could not get lock /var/lib/dpkg/lock-frontend".
  assert commands[:2] == [
      "apt-get -o DPkg::Lock::Timeout=600 update -qq",
      "env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "
      "libopenmpi-dev openmpi-bin"]


def _editable_installs(commands):
  return [c for c in commands if " -e " in c]


def test_the_checkout_is_installed_in_editable_mode_without_dependencies(tmp_path):
  decisions, commands = dry_run(tmp_path, nvidia_smi=NO_DEVICES)
  checkout = os.path.realpath(ROOT)
  assert _decision(decisions, "bert_pretrain") == (
      "installing this checkout (%s) in editable mode (it does not import)" % checkout)
  # Nothing fetched and no dependency pulled: TensorFlow and numpy stay as init_tf chose.
  assert _editable_installs(commands) == [
      "%s -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e %s"
      % (tmp_path / "python", checkout)]
  # Then the fused kernels, built by the package just installed.
  assert commands[-2:] == [_editable_installs(commands)[0],
                           "%s -m bert_pretrain.model.kernels" % (tmp_path / "python")]


def test_an_install_of_this_checkout_is_kept(tmp_path):
  decisions, commands = dry_run(tmp_path, nvidia_smi=NO_DEVICES, bert_pretrain=ROOT)
  assert _decision(decisions, "bert_pretrain") == (
      "keeping the editable install of this checkout (%s)" % os.path.realpath(ROOT))
  assert _editable_installs(commands) == []


def test_an_install_of_another_checkout_is_replaced(tmp_path):
  other = tmp_path / "deleted-ci-clone"
  decisions, commands = dry_run(tmp_path, nvidia_smi=NO_DEVICES, bert_pretrain=str(other))
  assert _decision(decisions, "bert_pretrain") == (
      "installing this checkout (%s) in editable mode (it imports from %s)"
      % (os.path.realpath(ROOT), other))
  assert len(_editable_installs(commands)) == 1


def test_an_old_setuptools_is_upgraded_before_the_editable_install(tmp_path):
  # Python 3.7's venv comes with setuptools 47, which cannot install pyproject.toml
  # projects in editable mode (PEP 660 needs >= 64).
  _, commands = dry_run(tmp_path, nvidia_smi=NO_DEVICES, horovod=True, setuptools="47.1.0")
  upgrade = [c for c in commands if "setuptools\\>=64" in c]
  assert len(upgrade) == 1 and " -U " in upgrade[0], commands
  assert commands.index(upgrade[0]) < commands.index(_editable_installs(commands)[0])
