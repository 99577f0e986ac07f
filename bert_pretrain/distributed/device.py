"""Where a run computes: a GPU or the CPU, and in which type (float32, bfloat16, float16).

choose_device decides before any graph is built, from --device, --amp and what
TensorFlow lists; a GPU asked for but not usable is a one-line error. --amp on a CPU
computes bfloat16 where TensorFlow computes it faster than float32, float32 elsewhere
(bfloat16_slowness says why): TensorFlow's bfloat16 matmul ran at 0.4x its float32 one on
an AVX-512 CPU with its bfloat16 instructions masked, and at 0.5x in TensorFlow 1.15's
pip build, which has no oneDNN. device_line names the choice in the run's first log
line, e.g. "GPU 0 of 8, NVIDIA A100-SXM4-40GB, compute float16" or "CPU, 2 cores,
compute bfloat16".
"""

import os
import re

import tensorflow.compat.v1 as tf

from bert_pretrain.model import kernels


class Device(object):
  """Where this process computes: kind "GPU" or "CPU", the GPUs TensorFlow lists
  (tf.config PhysicalDevice objects; empty for "CPU"), the compute type, and why it is
  not the one asked for or why it is slow here, with the fix ("" otherwise), e.g. "--amp:
  this CPU has no bfloat16 instructions, float32 is faster; --amp_dtype=bfloat16 forces
  bfloat16"."""

  def __init__(self, kind, gpus, dtype, why=""):
    self.kind = kind
    self.gpus = gpus
    self.dtype = dtype
    self.why = why


# /proc/cpuinfo's names of bfloat16 instructions: x86's AVX-512 and AMX ones, Arm's.
BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# x86's float16 arithmetic (not the F16C conversions every x86 CPU of a decade has).
FLOAT16_FLAGS = ("avx512_fp16", "amx_fp16")


def cpu_flags(cpuinfo=None, path="/proc/cpuinfo"):
  """The CPU's instruction names, from /proc/cpuinfo's "flags" (x86) or "Features" (Arm)
  lines (`cpuinfo`: that file's text, read from `path` when None): a set of str, None
  where the file cannot be read (not Linux)."""
  if cpuinfo is None:
    try:
      with open(path) as f:
        cpuinfo = f.read()
    except (IOError, OSError):
      return None
  words = set()
  for line in cpuinfo.splitlines():
    name, _, value = line.partition(":")
    if name.strip() in ("flags", "Features"):
      words.update(value.split())
  return words


def cpu_has_bfloat16(cpuinfo=None, path="/proc/cpuinfo"):
  """Whether the CPU has bfloat16 instructions (cpu_flags' arguments); None where
  /proc/cpuinfo cannot be read."""
  words = cpu_flags(cpuinfo, path)
  if words is None:
    return None
  return any(flag in words for flag in BFLOAT16_FLAGS)


def float16_slowness(words):
  """Why float16 computes far slower than float32 and bfloat16 on this CPU ("" where it
  does not or where that cannot be told): an x86 CPU without float16 arithmetic, where
  TensorFlow converts every value.

  Args:
    words: cpu_flags().
  """
  if words is None or "sse2" not in words or any(flag in words for flag in FLOAT16_FLAGS):
    return ""
  return "this CPU has no float16 arithmetic (%s)" % " or ".join(FLOAT16_FLAGS)


def tensorflow_uses_onednn():
  """Whether this TensorFlow computes on the CPU with oneDNN: TensorFlow 2's x86 Linux builds
  where the CPU has AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX, or as TF_ENABLE_ONEDNN_OPTS
  says; TensorFlow 1.15's MKL builds only."""
  try:
    import tensorflow.python.util._pywrap_util_port as port  # pylint: disable=g-import-not-at-top
  except ImportError:  # TensorFlow 1.x
    import tensorflow.python.pywrap_tensorflow as port  # pylint: disable=g-import-not-at-top
  return bool(getattr(port, "IsMklEnabled", lambda: False)())


def bfloat16_slowness(has_bfloat16, onednn):
  """Why bfloat16 computes slower than float32 on this CPU, "" where it does not or
  where that cannot be told.

  Args:
    has_bfloat16: cpu_has_bfloat16() (True, False or None: unknown).
    onednn: tensorflow_uses_onednn().
  """
  if not onednn:
    return "this TensorFlow computes bfloat16 without oneDNN"
  if has_bfloat16 is False:
    return "this CPU has no bfloat16 instructions"
  return ""


def cards_listed(cuda_visible_devices):
  """Whether a CUDA_VISIBLE_DEVICES value asks for cards: set, not empty, and not a list
  that CUDA reads as none (it stops at the first negative entry, e.g. -1)."""
  entries = [e.strip() for e in (cuda_visible_devices or "").split(",") if e.strip()]
  return bool(entries) and not entries[0].startswith("-")


def choose_device(device_flag, gpus, cuda_visible_devices, built_with_cuda, amp, amp_dtype,
                  bfloat16_slow, float16_slow=""):
  """Decides the device and the compute type, before any graph is built.

  Args:
    device_flag: --device: "auto", "gpu" or "cpu".
    gpus: the GPUs TensorFlow lists (tf.config.experimental.list_physical_devices).
    cuda_visible_devices: the CUDA_VISIBLE_DEVICES value (None: unset).
    built_with_cuda: whether this TensorFlow is a GPU build.
    amp: --amp.
    amp_dtype: --amp_dtype: "auto", "float16" or "bfloat16".
    bfloat16_slow: why bfloat16 computes slower than float32 on this CPU
      (bfloat16_slowness), "" if it does not; then --amp with --amp_dtype=auto
      computes float32 on the CPU.
    float16_slow: why float16 computes far slower on this CPU (float16_slowness), ""
      if it does not; then --amp_dtype=float16 on the CPU says so.

  Returns:
    Device.

  Raises:
    ValueError: a GPU is asked for (--device=gpu, or cards in CUDA_VISIBLE_DEVICES) but
      TensorFlow sees none.
  """
  if gpus or device_flag == "cpu":
    kind = "CPU" if device_flag == "cpu" else "GPU"
  else:
    if built_with_cuda:
      cause = "TensorFlow %s, a GPU build, finds no usable GPU" % tf.VERSION
      fix = "check the driver (nvidia-smi -L or ixsmi -L) and the CUDA libraries"
    else:
      cause = "this TensorFlow %s is a CPU build" % tf.VERSION
      fix = "install a GPU build (bash init_tf.sh on the GPU host)"
    fix += ", or pass --device=cpu to train on the CPU on purpose"
    if built_with_cuda and cuda_visible_devices is not None and \
        not cards_listed(cuda_visible_devices):
      (cause, fix) = ("CUDA_VISIBLE_DEVICES=%s hides every card" % cuda_visible_devices,
                      "unset it or export the cards to use, e.g. CUDA_VISIBLE_DEVICES=0")
    elif built_with_cuda and cards_listed(cuda_visible_devices):
      fix = fix.replace("check the driver", "check that this host has them, the driver")
    if device_flag == "gpu":
      raise ValueError("--device=gpu but %s; %s" % (cause, fix))
    if cards_listed(cuda_visible_devices):
      raise ValueError("CUDA_VISIBLE_DEVICES=%s lists cards but %s; %s"
                       % (cuda_visible_devices, cause, fix))
    kind = "CPU"
  why = ""
  if not amp:
    dtype = tf.float32
  elif amp_dtype != "auto":
    dtype = tf.as_dtype(amp_dtype)
    if kind == "CPU" and dtype == tf.float16 and float16_slow:
      why = ("--amp_dtype=float16: %s, so it computes tens of times slower than in bfloat16 "
             "or float32; pass --amp_dtype=bfloat16 instead, or --noamp without --amp_dtype"
             % float16_slow)
  elif kind == "GPU":
    dtype = tf.float16
  elif not bfloat16_slow:
    dtype = tf.bfloat16
  else:
    dtype = tf.float32
    why = "--amp: %s, float32 is faster; --amp_dtype=bfloat16 forces bfloat16" % bfloat16_slow
  return Device(kind, gpus if kind == "GPU" else [], dtype, why)


def detect_device(device_flag, amp, amp_dtype):
  """choose_device with the environment and what TensorFlow lists (arguments: --device,
  whether mixed precision is on, --amp_dtype)."""
  # list_physical_devices starts no GPU, so it does not fight the session's
  # visible_device_list (one card per Horovod rank).
  return choose_device(device_flag, tf.config.experimental.list_physical_devices("GPU"),
                       os.environ.get("CUDA_VISIBLE_DEVICES"), tf.test.is_built_with_cuda(),
                       amp, amp_dtype,
                       bfloat16_slowness(cpu_has_bfloat16(), tensorflow_uses_onednn()),
                       float16_slowness(cpu_flags()))


def gpu_index(ranks, num_gpus, cuda_visible_devices=None):
  """The index, among the GPUs this process sees, of the one this rank uses: its local
  rank, or 0 when the launcher gave each rank a single card.

  Args:
    cuda_visible_devices: the CUDA_VISIBLE_DEVICES value (None: this process's).

  Raises:
    ValueError: CUDA_VISIBLE_DEVICES lists more cards than TensorFlow sees (CUDA stops at
      an entry the host lacks, and the ranks would share what is left), or more ranks on
      this host than GPUs.
  """
  if cuda_visible_devices is None:
    cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
  entries = []
  for entry in (e.strip() for e in (cuda_visible_devices or "").split(",") if e.strip()):
    if entry.startswith("-"):
      break  # CUDA reads no further
    entries.append(entry)
  # A process sees one MIG slice of those listed.
  if entries and not any(e.startswith("MIG-") for e in entries) and len(entries) > num_gpus:
    raise ValueError("CUDA_VISIBLE_DEVICES=%s lists %d cards but TensorFlow sees %d (CUDA "
                     "hides every card from the first this host lacks, and ranks would "
                     "share the rest); export cards it has (nvidia-smi -L or ixsmi -L lists "
                     "them)"
                     % (cuda_visible_devices, len(entries), num_gpus))
  if ranks.local_rank < num_gpus:
    return ranks.local_rank
  if num_gpus == 1:
    return 0
  raise ValueError("%d ranks on this host but TensorFlow sees %d GPUs; launch one rank per "
                   "GPU (IX_NUM_CUDA_VISIBLE_DEVICES) or pass --device=cpu"
                   % (ranks.local_size, num_gpus))


CPU_DEVICES_A_CORE = 4  # --cpu_devices allowed a core


def check_cpu_devices(cpu_devices, distribution, cores=None):
  """Checks --cpu_devices (logical CPU devices, one replica each) against the engine and
  this host's `cores` (None: not checked).

  Raises:
    ValueError: below 1, above 1 without --distribution=mirrored, or above
      CPU_DEVICES_A_CORE a core (one line, the fix).
  """
  if cpu_devices < 1:
    raise ValueError("--cpu_devices=%d must be at least 1 (the logical CPU devices of "
                     "--distribution=mirrored, one replica each); pass --cpu_devices=2 or "
                     "more to try the engine on a CPU, or drop it" % cpu_devices)
  if cpu_devices > 1 and distribution != "mirrored":
    raise ValueError("--cpu_devices=%d: logical CPU devices are replicas of "
                     "--distribution=mirrored only, not of --distribution=%s; drop it or pass "
                     "--distribution=mirrored" % (cpu_devices, distribution))
  # A few a core try the engine; each is a graph and a copy of the model (memory).
  if cores and cpu_devices > CPU_DEVICES_A_CORE * cores:
    raise ValueError("--cpu_devices=%d is more than %d a core of this host's %d cores; "
                     "pass at most --cpu_devices=%d" % (cpu_devices, CPU_DEVICES_A_CORE, cores,
                                                CPU_DEVICES_A_CORE * cores))


def replica_devices(device, cpu_devices=1):
  """The devices of --distribution=mirrored's replicas: every GPU this process sees, or
  cpu_devices logical CPUs (pretraining.session_config makes them)."""
  if device.kind == "GPU":
    return ["/gpu:%d" % i for i in range(len(device.gpus))]
  return ["/cpu:%d" % i for i in range(cpu_devices)]


def gpu_name(gpu, config):
  """The product name of a GPU (a tf.config PhysicalDevice), "" if unknown.

  TensorFlow >= 2.3 reads it without starting the GPU. TensorFlow 1.15 only names it
  once the device is created: with the session's own config (this rank's
  visible_device_list), as the session would.
  """
  details = getattr(tf.config.experimental, "get_device_details", None)
  if details is not None:
    return details(gpu).get("device_name", "")
  from tensorflow.python.client import device_lib  # pylint: disable=g-import-not-at-top
  for device in device_lib.list_local_devices(config):
    match = re.search(r"name: ([^,]+)", device.physical_device_desc or "")
    if device.device_type == "GPU" and match:
      return match.group(1)
  return ""


def device_line(device, ranks, name="", cores=None):
  """The run's device, e.g. "GPU 0 of 8, NVIDIA A100-SXM4-40GB, compute float16" (this
  rank's card among the job's) or "CPU, 2 cores, compute bfloat16", with compute_text's
  notes."""
  if device.kind == "GPU" and ranks.strategy is not None:
    where = "%d GPUs of %d (%s)" % (ranks.local_replicas, ranks.replicas, ranks.distribution)
    if name:
      where += ", " + name
  elif device.kind == "GPU":
    where = "GPU %d of %d" % (gpu_index(ranks, len(device.gpus)), ranks.size)
    if name:
      where += ", " + name
  else:
    where = "CPU, %d cores" % (cores or os.cpu_count() or 1)
    if ranks.local_size > 1:
      where += ", %d ranks on this host" % ranks.local_size
    if ranks.local_replicas > 1:
      where += ", %d logical devices (%s)" % (ranks.local_replicas, ranks.distribution)
  return "%s, %s" % (where, compute_text(device))


def compute_text(device):
  """The end of device_line: "compute bfloat16", then in brackets Device.why ("compute
  float32 (why; the fix)") and, in brackets of its own, "fused kernels not built ...;
  the fix" where a CPU runs without our fused kernels (model/kernels.py: in every
  precision, the optimizer's update)."""
  notes = [device.why] if device.why else []
  if device.kind == "CPU":
    why_not_fused = kernels.why_unavailable()
    if why_not_fused:
      notes.append("fused kernels %s" % why_not_fused)
  return "compute %s" % device.dtype.name + "".join(" (%s)" % note for note in notes)

