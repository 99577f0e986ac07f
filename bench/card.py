"""The benchmark card: a bench/ result as JSON that says what was measured, where, and how
it compares with the anchors' published rows of the same configuration.

bench/benchmark.py writes benchmark_card.json and bench/scaling.py scaling_card.json
beside their tables. A card holds:

  tool, command       the script and its command line;
  flags               the script's flags, every one, with its value;
  environment         Python, TensorFlow, Horovod and numpy versions, the CPU (model,
                      cores, its /proc/cpuinfo flags), the GPUs (model and count, from
                      nvidia-smi -L or Iluvatar's ixsmi -L), the load average;
  entries             one per measured configuration: its config (what a user chooses:
                      model, sequence, batch, compute type, threads, ranks, engine,
                      ...), config_hash (the first 16 hex digits of the SHA-256 of that
                      config as sorted JSON: two cards' entries with one hash measured
                      the same thing, on whatever machine), the metric
                      (sentences_per_second) with n, mean, stdev (sample, n >= 2),
                      min, max and the values (the timing windows of all rounds, or the
                      repeated runs), and `published`: the anchors' rows of the same
                      model, sequence length and compute type (bench/published.json,
                      where those numbers are kept with their source), each with its
                      sentences/s per device beside ours and whether it is our device.

No TensorFlow is imported here: benchmark.py's parent process must not load it.
"""

import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

PUBLISHED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "published.json")

# The CPU flags that decide how fast a matmul runs here: AVX-512, its bfloat16 dot
# products, AMX's bfloat16 tiles. The same code measured 1.8x and 3.8x more bfloat16
# than float32 matmul FLOP/s on CPUs without and with AMX (docs/performance.md).
MATMUL_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16")

# float32 matmuls on an A100 run in TF32 unless TensorFlow is told otherwise: a
# published TF32 row is the float32 configuration of that GPU.
SAME_COMPUTE = {"tf32": "float32"}


def cpu_fields(cpuinfo="/proc/cpuinfo"):
  """The first processor's fields of /proc/cpuinfo (name -> value), None where the file
  cannot be read."""
  try:
    with open(cpuinfo) as f:
      text = f.read()
  except (IOError, OSError):
    return None
  fields = {}
  for line in text.splitlines():
    key, _, value = line.partition(":")
    fields.setdefault(key.strip(), value.strip())
  return fields


def cpu_description(cpuinfo="/proc/cpuinfo"):
  """The CPU's model name, x86's family and model numbers (a virtual machine's name, "AMD
  EPYC", covers generations of twice the matmul speed) and which of MATMUL_FLAGS it has,
  e.g. "AMD EPYC, family 26 model 2 (avx512f, avx512_bf16)"; platform.machine() where
  `cpuinfo` cannot be read."""
  fields = cpu_fields(cpuinfo)
  if fields is None:
    return platform.machine()
  model = fields.get("model name") or platform.machine()
  if fields.get("cpu family") and fields.get("model"):
    model += ", family %s model %s" % (fields["cpu family"], fields["model"])
  present = set(fields.get("flags", "").split())
  return "%s (%s)" % (model, ", ".join(f for f in MATMUL_FLAGS if f in present) or
                      "no AVX-512")


def cpu_info(cpuinfo="/proc/cpuinfo"):
  """{"model", "description" (cpu_description), "cores", "flags"}: the CPU's model name,
  its logical cores and /proc/cpuinfo's flags (Arm: Features)."""
  fields = cpu_fields(cpuinfo) or {}
  return {"model": fields.get("model name") or platform.machine(),
          "description": cpu_description(cpuinfo), "cores": os.cpu_count(),
          "flags": sorted((fields.get("flags") or fields.get("Features") or "").split())}


def gpu_info(listers=("nvidia-smi", "ixsmi")):
  """{"model", "count", "lister"} of the GPUs nvidia-smi -L (or Iluvatar's ixsmi -L)
  lists, as init_tf.sh finds them; None without GPUs."""
  for lister in listers:
    try:
      output = subprocess.run([lister, "-L"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, universal_newlines=True,
                              timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
      continue
    gpus = [line for line in output.splitlines() if line.startswith("GPU ")]
    if gpus:
      model = gpus[0].split(":", 1)[1].split("(UUID")[0].strip()
      return {"model": model, "count": len(gpus), "lister": lister}
  return None


def run_env():
  """The environment of a run the bench starts: this process's, TensorFlow quiet, and this
  checkout first on PYTHONPATH with the caller's entries after it (a vendor's TensorFlow
  may be there)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                   if p and p != root]
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(path))


VERSIONS_SCRIPT = """
import json
versions = {}
for name in ("tensorflow", "horovod", "numpy"):
  try:
    versions[name] = __import__(name).__version__
  except Exception:  # not installed, or broken: the card says None
    versions[name] = None
print(json.dumps(versions))
"""


def package_versions(python=sys.executable):
  """Python's version and TensorFlow's, Horovod's and numpy's (None where they do not
  import), read by `python` in a process of its own."""
  versions = {"python": platform.python_version()}
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  try:
    output = subprocess.run([python, "-c", VERSIONS_SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, universal_newlines=True, env=env,
                            timeout=300).stdout
    versions.update(json.loads(output.splitlines()[-1]))
  except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
    versions.update(tensorflow=None, horovod=None, numpy=None)
  return versions


def environment():
  """Where the card's numbers were measured (the module docstring's environment)."""
  return {"versions": package_versions(), "cpu": cpu_info(), "gpus": gpu_info(),
          "hostname": platform.node(), "load_average": list(os.getloadavg())}


def tool_flags(flag_values, flag_name):
  """The flags (name -> value) of the module that defines `flag_name`: the script's own."""
  module = flag_values.find_module_defining_flag(flag_name)
  return {f.name: f.value for f in flag_values.get_flags_for_module(module)}


def config_hash(config):
  """The first 16 hex digits of the SHA-256 of `config` as sorted, compact JSON."""
  text = json.dumps(config, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def spread(values):
  """n, mean, stdev (sample; None for one value), min, max and the values."""
  values = [float(v) for v in values]
  return {"n": len(values), "mean": statistics.mean(values),
          "stdev": statistics.stdev(values) if len(values) > 1 else None,
          "min": min(values), "max": max(values), "values": values}


def load_published(path=PUBLISHED):
  with open(path) as f:
    return json.load(f)


def published_beside(config, mean, devices, env, published):
  """The anchors' rows of the same model, sequence length and compute type as `config`,
  each with its sentences/s per device beside ours.

  Args:
    config: an entry's config, with "model" ({"layers", "hidden", "heads",
      "intermediate", ...}), "seq" and "compute".
    mean: our mean sentences/s.
    devices: the devices (GPUs, or CPU processes) ours used.
    env: environment() (for whether a row's device is ours).
    published: load_published().

  Returns:
    list of dicts: the published row with its source's text, "per_device",
    "ours_per_device" and "same_device".
  """
  ours = " ".join([env["cpu"]["model"]] + ([env["gpus"]["model"]] if env["gpus"] else []))
  model = {k: config["model"].get(k) for k in ("layers", "hidden", "heads", "intermediate")}
  beside = []
  for row in published["rows"]:
    compute = SAME_COMPUTE.get(row["compute"], row["compute"])
    if row["model"] != model or row["seq"] != config["seq"] or compute != config["compute"]:
      continue
    beside.append(dict(row, source_text=published["sources"][row["source"]],
                       per_device=row["sentences_per_second"] / row["devices"],
                       ours_per_device=mean / devices, same_device=row["match"] in ours))
  return beside


def entry(name, config, values, devices, env, published):
  """One measured configuration of a card (the module docstring's entries)."""
  stats = spread(values)
  return {"name": name, "config": config, "config_hash": config_hash(config),
          "metric": "sentences_per_second", "devices": devices, "stats": stats,
          "published": published_beside(config, stats["mean"], devices, env, published)}


def write_card(path, tool, flags, entries, env):
  """Writes the card as JSON to `path`; returns the card."""
  card = {"tool": tool, "command": [os.path.basename(sys.executable)] + sys.argv,
          "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "flags": flags,
          "environment": env, "entries": entries}
  with open(path, "w") as f:
    json.dump(card, f, indent=1, sort_keys=True)
  return card


def published_lines(card):
  """One line per published row beside an entry, for the scripts' tables."""
  lines = []
  for e in card["entries"]:
    for row in e["published"]:
      lines.append("%s (%s x %d, %s): %.2f sentences/s per device published%s, ours %.2f "
                   "(%s)" % (e["name"], row["device"], row["devices"], row["compute"],
                             row["per_device"], " (about)" if row.get("approximate") else "",
                             row["ours_per_device"],
                             "the same device" if row["same_device"] else "another device"))
  return lines
