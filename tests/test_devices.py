"""Which device and compute type a run takes, and the line that says it: the decisions
with fake cards and CPU flags (no GPU here), and a CPU build asked for cards."""

import os
import re

import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain.distributed import device as device_lib
from conftest import base_flags, run_pretraining


@pytest.mark.parametrize("cuda_visible_devices,flags,message", [
    ("0", {}, r"CUDA_VISIBLE_DEVICES=0 lists cards but this TensorFlow \S+ is a CPU build; "
              r"install a GPU build .* or pass --device=cpu to train on the CPU on purpose"),
    ("-1", {"device": "gpu"}, r"--device=gpu but this TensorFlow \S+ is a CPU build"),
])
def test_cards_tensorflow_cannot_see_stop_the_run(pretraining_data, tmp_path, monkeypatch,
                                                   cuda_visible_devices, flags, message):
  """This machine has no GPU and a CPU build of TensorFlow: the real case of a GPU server
  where init_tf.sh installed tensorflow-cpu."""
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cuda_visible_devices)
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(pretraining_data, out, **flags))
  assert result.returncode == 2
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1, result.stderr
  assert re.search("run_pretraining: error: " + message, errors[0]), errors[0]
  assert "Step " not in result.stdout and not out.exists()


class FakeGpu(object):
  """Stands for a tf.config PhysicalDevice."""
  device_type = "GPU"

  def __init__(self, index):
    self.name = "/physical_device:GPU:%d" % index


class FakeRanks(object):
  def __init__(self, local_rank=0, size=1, local_size=1, distribution="horovod",
               local_replicas=1):
    self.local_rank, self.size, self.local_size = local_rank, size, local_size
    self.distribution, self.local_replicas = distribution, local_replicas
    self.strategy = None if distribution == "horovod" else object()
    self.replicas = size * local_replicas


@pytest.mark.parametrize("device_flag,gpus,visible,cuda,amp,amp_dtype,want", [
    ("auto", 8, "0,1,2,3,4,5,6,7", True, True, "auto", ("GPU", tf.float16)),
    ("auto", 1, None, True, False, "auto", ("GPU", tf.float32)),
    ("auto", 1, None, True, True, "bfloat16", ("GPU", tf.bfloat16)),
    ("auto", 0, None, False, True, "auto", ("CPU", tf.bfloat16)),
    ("auto", 0, None, False, True, "float16", ("CPU", tf.float16)),
    ("auto", 0, "", True, False, "auto", ("CPU", tf.float32)),
    ("auto", 0, "-1", True, False, "auto", ("CPU", tf.float32)),
    ("cpu", 8, "0,1,2,3,4,5,6,7", True, True, "auto", ("CPU", tf.bfloat16)),
    ("cpu", 0, "0", False, False, "auto", ("CPU", tf.float32)),
    ("auto", 0, "0,1", True, False, "auto",
     r"CUDA_VISIBLE_DEVICES=0,1 lists cards but TensorFlow \S+, a GPU build, finds no usable "
     r"GPU; check that this host has them, the driver \(nvidia-smi -L or ixsmi -L\) and the "
     r"CUDA libraries, or pass --device=cpu to train on the CPU on purpose$"),
    ("gpu", 0, "-1", True, False, "auto", r"^--device=gpu but CUDA_VISIBLE_DEVICES=-1 hides "
     r"every card; unset it or export the cards to use, e.g. CUDA_VISIBLE_DEVICES=0$"),
    ("gpu", 0, None, True, False, "auto", r"--device=gpu but TensorFlow \S+, a GPU build, "
     r"finds no usable GPU; check the driver"),
    ("gpu", 0, None, False, False, "auto", r"--device=gpu but this TensorFlow \S+ is a CPU "
     r"build; install a GPU build \(bash init_tf.sh on the GPU host\), or pass --device=cpu"),
])
def test_device_and_compute_type_decisions(device_flag, gpus, visible, cuda, amp, amp_dtype,
                                           want):
  gpus = [FakeGpu(i) for i in range(gpus)]
  if isinstance(want, str):
    with pytest.raises(ValueError, match=want):
      device_lib.choose_device(device_flag, gpus, visible, cuda, amp, amp_dtype, "")
    return
  device = device_lib.choose_device(device_flag, gpus, visible, cuda, amp, amp_dtype, "")
  assert (device.kind, device.dtype) == want
  assert len(device.gpus) == (len(gpus) if want[0] == "GPU" else 0)


def test_amp_on_a_cpu_where_bfloat16_is_slower_computes_float32_and_says_why(monkeypatch):
  monkeypatch.setattr(device_lib.kernels, "why_unavailable", lambda: "")  # its own note
  slow = "this CPU has no bfloat16 instructions"
  cpu = device_lib.choose_device("auto", [], None, False, True, "auto", slow)
  assert (cpu.kind, cpu.dtype) == ("CPU", tf.float32)
  assert device_lib.device_line(cpu, FakeRanks(), cores=2) == (
      "CPU, 2 cores, compute float32 (--amp: this CPU has no bfloat16 instructions, "
      "float32 is faster; --amp_dtype=bfloat16 forces bfloat16)")
  forced = device_lib.choose_device("cpu", [], None, False, True, "bfloat16", slow)
  assert (forced.dtype, forced.why) == (tf.bfloat16, "")
  gpu = device_lib.choose_device("auto", [FakeGpu(0)], None, True, True, "auto", slow)
  assert (gpu.kind, gpu.dtype, gpu.why) == ("GPU", tf.float16, "")
  # detect_device asks this machine: here made a CPU without the instructions.
  monkeypatch.setattr(device_lib, "cpu_has_bfloat16", lambda: False)
  detected = device_lib.detect_device("cpu", True, "auto")
  assert (detected.dtype, detected.why.split(",")[0]) == (
      tf.float32, "--amp: this CPU has no bfloat16 instructions"
      if device_lib.tensorflow_uses_onednn() else
      "--amp: this TensorFlow computes bfloat16 without oneDNN")


def test_float16_asked_for_on_a_cpu_without_float16_arithmetic_says_it_is_slow(monkeypatch):
  x86 = "flags\t\t: fpu sse sse2 avx2 f16c avx512f avx512_bf16\n"
  slow = device_lib.float16_slowness(device_lib.cpu_flags(x86))
  assert slow == "this CPU has no float16 arithmetic (avx512_fp16 or amx_fp16)"
  fp16 = x86.replace("f16c", "avx512_fp16")
  assert device_lib.float16_slowness(device_lib.cpu_flags(fp16)) == ""
  assert device_lib.float16_slowness(device_lib.cpu_flags("Features\t: fp asimd fphp\n")) == ""
  assert device_lib.float16_slowness(None) == ""  # cannot tell
  cpu = device_lib.choose_device("cpu", [], None, False, True, "float16", "", slow)
  assert (cpu.kind, cpu.dtype) == ("CPU", tf.float16)
  monkeypatch.setattr(device_lib.kernels, "why_unavailable", lambda: "")
  note = ("--amp_dtype=float16: this CPU has no float16 arithmetic (avx512_fp16 or amx_fp16), "
          "so it computes tens of times slower than in bfloat16 or float32; pass "
          "--amp_dtype=bfloat16 instead, or --noamp without --amp_dtype")
  assert device_lib.device_line(cpu, FakeRanks(), cores=2) == (
      "CPU, 2 cores, compute float16 (%s)" % note)
  # Without the fused kernels both notes are said.
  monkeypatch.setattr(device_lib.kernels, "why_unavailable", lambda: "not built; run init_tf.sh")
  assert device_lib.device_line(cpu, FakeRanks(), cores=2) == (
      "CPU, 2 cores, compute float16 (%s) (fused kernels not built; run init_tf.sh)" % note)
  # Not on a GPU, and not when the CPU has the instructions.
  gpu = device_lib.choose_device("auto", [FakeGpu(0)], None, True, True, "float16", "", slow)
  assert (gpu.dtype, gpu.why) == (tf.float16, "")
  assert device_lib.choose_device("cpu", [], None, False, True, "float16", "", "").why == ""
  assert device_lib.choose_device("cpu", [], None, False, True, "bfloat16", "", slow).why == ""


def test_bfloat16_is_slower_without_onednn_or_without_the_cpus_instructions(tmp_path):
  assert device_lib.bfloat16_slowness(True, True) == ""
  assert device_lib.bfloat16_slowness(None, True) == ""  # cannot tell: as asked
  assert device_lib.bfloat16_slowness(False, True) == "this CPU has no bfloat16 instructions"
  assert device_lib.bfloat16_slowness(True, False) == (
      "this TensorFlow computes bfloat16 without oneDNN")
  # TensorFlow 1.15's pip build has no oneDNN; TensorFlow 2's x86 Linux builds turn it on
  # where the CPU has one of these instructions, or as TF_ENABLE_ONEDNN_OPTS says.
  want = bool(device_lib.cpu_flags() & {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
                           "amx_bf16"})
  setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "").lower()
  if setting in ("0", "1", "true", "false"):
    want = setting in ("1", "true")
  assert device_lib.tensorflow_uses_onednn() == (want and not tf.__version__.startswith("1."))
  assert device_lib.cpu_has_bfloat16(path=str(tmp_path / "missing")) is None


@pytest.mark.parametrize("cpuinfo,want", [
    ("processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni avx512_bf16 avx512_fp16\n", True),
    ("flags\t\t: fpu avx512f amx_bf16 amx_tile\n", True),  # amx_bf16 alone
    ("flags\t\t: fpu sse4_2 avx2 avx512f avx512bw avx512_vnni\n", False),  # Cascade Lake
    ("processor\t: 0\nFeatures\t: fp asimd sve i8mm bf16\n", True),  # Arm Neoverse V1
    ("processor\t: 0\nFeatures\t: fp asimd aes crc32 atomics\n", False),  # Neoverse N1
    ("model name\t: bf16 in a name is not a flag\nflags\t\t: fpu avx2\n", False),
    ("", False),
])
def test_cpu_has_bfloat16_reads_the_flags_of_proc_cpuinfo(cpuinfo, want):
  assert device_lib.cpu_has_bfloat16(cpuinfo) == want


def test_device_line_names_this_ranks_card_among_the_jobs(monkeypatch):
  gpu = device_lib.Device("GPU", [FakeGpu(i) for i in range(8)], tf.float16)
  assert (device_lib.device_line(gpu, FakeRanks(3, size=16, local_size=8), "NVIDIA A100-SXM4-40GB")
          == "GPU 3 of 16, NVIDIA A100-SXM4-40GB, compute float16")
  assert device_lib.device_line(gpu, FakeRanks()) == "GPU 0 of 1, compute float16"
  cpu = device_lib.Device("CPU", [], tf.bfloat16)
  assert device_lib.device_line(cpu, FakeRanks(), cores=2) == "CPU, 2 cores, compute bfloat16"
  assert (device_lib.device_line(cpu, FakeRanks(1, size=4, local_size=2), cores=2)
          == "CPU, 2 cores, 2 ranks on this host, compute bfloat16")
  # TensorFlow's engines: a process drives all the cards of its host.
  assert (device_lib.device_line(gpu, FakeRanks(size=2, distribution="multi_worker_mirrored",
                                                local_replicas=8), "NVIDIA A100-SXM4-40GB")
          == "8 GPUs of 16 (multi_worker_mirrored), NVIDIA A100-SXM4-40GB, compute float16")
  assert (device_lib.device_line(cpu, FakeRanks(distribution="mirrored", local_replicas=2),
                                 cores=2)
          == "CPU, 2 cores, 2 logical devices (mirrored), compute bfloat16")
  # A launcher that gives every rank its own single card: each uses its card 0.
  assert device_lib.gpu_index(FakeRanks(5, size=8, local_size=8), 1, "GPU-5c1e") == 0
  with pytest.raises(ValueError, match="3 ranks on this host but TensorFlow sees 2 GPUs"):
    device_lib.gpu_index(FakeRanks(2, size=3, local_size=3), 2, "")
  # A card the host lacks hides the cards after it: two ranks would share card 0.
  with pytest.raises(ValueError, match=r"CUDA_VISIBLE_DEVICES=0,5 lists 2 cards but "
                                       r"TensorFlow sees 1 \(CUDA hides"):
    device_lib.gpu_index(FakeRanks(1, size=2, local_size=2), 1, "0,5")
  assert device_lib.gpu_index(FakeRanks(1, size=2, local_size=2), 2, "0,5") == 1
  # CUDA reads no further than a negative entry; a process sees one MIG slice.
  assert device_lib.gpu_index(FakeRanks(1, size=2, local_size=2), 2, "0,1,-1,3") == 1
  assert device_lib.gpu_index(FakeRanks(0), 1, "MIG-a,MIG-b") == 0


def test_gpu_name_without_starting_the_gpu_and_on_tf115(monkeypatch):
  """TensorFlow >= 2.3 names the card from its details; 1.15, which lacks them, from the
  description of the device the session config makes."""
  from tensorflow.python.client import device_lib as tf_device_lib
  seen = {}

  def details(gpu):
    seen["gpu"] = gpu.name
    return {"device_name": "NVIDIA A100-SXM4-40GB", "compute_capability": (8, 0)}

  monkeypatch.setattr(tf.config.experimental, "get_device_details", details, raising=False)
  assert device_lib.gpu_name(FakeGpu(2), tf.ConfigProto()) == "NVIDIA A100-SXM4-40GB"
  assert seen["gpu"] == "/physical_device:GPU:2"

  class Local(object):
    def __init__(self, device_type, desc):
      self.device_type, self.physical_device_desc = device_type, desc

  def list_local_devices(config):
    seen["visible"] = config.gpu_options.visible_device_list
    return [Local("CPU", ""), Local("GPU", "device: 0, name: Tesla V100-SXM2-16GB, pci bus "
                                           "id: 0000:3b:00.0, compute capability: 7.0")]

  # None rather than delattr: TensorFlow 1.15 wraps its API modules, and a deleted
  # attribute is still found in the wrapped module.
  monkeypatch.setattr(tf.config.experimental, "get_device_details", None, raising=False)
  monkeypatch.setattr(tf_device_lib, "list_local_devices", list_local_devices)
  config = tf.ConfigProto()
  config.gpu_options.visible_device_list = "3"
  assert device_lib.gpu_name(FakeGpu(3), config) == "Tesla V100-SXM2-16GB"
  assert seen["visible"] == "3"
