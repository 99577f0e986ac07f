"""CPU kernels of our own (kernels.cc) that fuse elementwise chains TensorFlow runs as
many passes over memory: built by init_tf.sh (`python3 -m bert_pretrain.model.kernels`)
for the TensorFlow it installs, loaded here, used by precision.py, dropout.py and
training/optimization.py where they apply. Where they are not built, those use
TensorFlow's ops, as they do on GPUs.

The library's file name holds a digest of the TensorFlow build and compiler flags and
one of the source, so that a checkout shared by two TensorFlow versions keeps one
library for each and an edited source is never loaded as an old build; a new build
deletes the one its TensorFlow made from an older source.
"""

import functools
import hashlib
import os
import re
import subprocess
import sys
import time

import tensorflow.compat.v1 as tf

from bert_pretrain import processes
from bert_pretrain.wiki import workdir

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.cc")
# Set to 0 to run TensorFlow's ops where the kernels would apply (an A/B comparison).
ENABLE_VARIABLE = "BERT_PRETRAIN_FUSED_KERNELS"
# Set to 0 to run, on a CPU with AVX-512, the loops every other x86 CPU runs (kernels.cc's
# CPU_LOOP): an A/B comparison, and the test that both give the same bits.
AVX512_VARIABLE = "BERT_PRETRAIN_KERNELS_AVX512"

_loaded = {}  # library path -> op module, or the reason it is not loaded


class BuildError(Exception):
  """The kernels did not build; the message is one line with the fix."""


def compile_command(output):
  """The compiler's command line that builds kernels.cc into `output` for this
  TensorFlow (its headers, ABI and framework library)."""
  flags = list(tf.sysconfig.get_compile_flags())
  if not any(flag.lstrip("-").startswith("std=") for flag in flags):
    flags.append("-std=c++14")  # TensorFlow 1.15's headers say no standard; they need 14
  # -fno-trapping-math lets the compiler vectorize the loops' selects and clamps;
  # -ffp-contract=off rounds a * b + c twice, as TensorFlow's ops, on every CPU clone.
  return ([os.environ.get("CXX", "g++"), "-shared", "-fPIC", "-O3", "-fno-math-errno",
           "-fno-trapping-math", "-ffp-contract=off"] + flags + [SOURCE, "-o", output]
          + list(tf.sysconfig.get_link_flags()))


@functools.lru_cache(maxsize=None)
def library_path():
  """Where this TensorFlow's build of the kernels is (or goes): beside the source, named
  _kernels-<digest of the TensorFlow build and flags>-<digest of the source>.so."""
  build_digest = hashlib.sha256()
  identity = [tf.__version__, getattr(tf.version, "GIT_VERSION", "")]
  # The source by its name, not its place: a checkout moved or copied keeps its build.
  command = [os.path.basename(word) if word == SOURCE else word for word in compile_command("")]
  build_digest.update(" ".join(identity + command).encode())
  with open(SOURCE, "rb") as source:
    source_digest = hashlib.sha256(source.read())
  return os.path.join(os.path.dirname(SOURCE), "_kernels-%s-%s.so" % (
      build_digest.hexdigest()[:8], source_digest.hexdigest()[:8]))


def _remove_stale_builds(path):
  """Deletes the libraries beside `path` that this TensorFlow built from an older
  source, and those of the older naming (_kernels-<one digest>.so), which no TensorFlow
  loads any more. A process that has one loaded keeps its copy."""
  folder, name = os.path.split(path)
  ours = re.match(r"^(_kernels-[0-9a-f]{8}-)[0-9a-f]{8}\.so$", name)
  if not ours:
    return
  for other in os.listdir(folder):
    stale = re.match(r"^(%s[0-9a-f]{8}|_kernels-[0-9a-f]{16})\.so$" % ours.group(1), other)
    if stale and other != name:
      try:
        os.remove(os.path.join(folder, other))
      except OSError:
        pass


def build(output=None):
  """Compiles kernels.cc for this TensorFlow unless its library is there already.

  Args:
    output: (optional) the library's path; default library_path().

  Returns:
    (path, seconds the build took, 0.0 where the library was there).

  Raises:
    BuildError: no compiler, or it failed (its first error line).
  """
  output = output or library_path()
  if os.path.exists(output):
    return output, 0.0
  partial = "%s.%d.partial" % (output, os.getpid())  # renamed when whole: no torn library
  command = compile_command(partial)
  start = time.time()
  try:
    result = processes.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
  except OSError as e:
    raise BuildError("no C++ compiler %r (%s); install g++ (apt-get install -y g++) or "
                     "set CXX" % (command[0], e.strerror))
  except BaseException:  # Ctrl-C or SIGTERM: the compiler is killed; its part goes too
    workdir.remove_quietly(partial)
    raise
  if result.returncode != 0:
    workdir.remove_quietly(partial)
    errors = [line for line in result.stdout.splitlines() if "error" in line]
    raise BuildError("%s failed on %s: %s" % (command[0], SOURCE, (
        errors or result.stdout.splitlines() or ["exit %d" % result.returncode])[0].strip()))
  os.replace(partial, output)
  if output == library_path():
    _remove_stale_builds(output)
  if isinstance(_loaded.get(output), str):
    del _loaded[output]  # a load() before this build found none: the next one loads it
  return output, time.time() - start


def why_unavailable():
  """Why the kernels are not used in this process, "" where they are."""
  load()
  loaded = _loaded[library_path()]
  return loaded if isinstance(loaded, str) else ""


def load():
  """The kernels' op module (tf.load_op_library) for this TensorFlow, None where they are
  off, not built, or TensorFlow is built for GPUs (whose runs keep TensorFlow's ops: the
  kernels are the CPU's). Loaded once a process: a second library registering the same
  ops would give them two kernels.
  """
  path = library_path()
  if path not in _loaded:
    if os.environ.get(ENABLE_VARIABLE, "1") == "0":
      _loaded[path] = "off (%s=0)" % ENABLE_VARIABLE
    elif tf.test.is_built_with_cuda():
      _loaded[path] = "not used: this TensorFlow is built for GPUs"
    elif not os.path.exists(path):
      _loaded[path] = "not built for this TensorFlow; bash init_tf.sh builds them"
    else:
      try:
        _loaded[path] = tf.load_op_library(path)
      except (tf.errors.OpError, OSError) as e:
        _loaded[path] = "%s does not load (%s); remove it and run bash init_tf.sh" % (
            path, str(e).splitlines()[0])
  loaded = _loaded[path]
  return None if isinstance(loaded, str) else loaded


def main():
  if tf.test.is_built_with_cuda():
    print("kernels: not built: this TensorFlow is built for GPUs, whose runs keep "
          "TensorFlow's ops")
    return 0
  try:
    path, seconds = build()
  except BuildError as e:
    print("kernels: error: %s" % e, file=sys.stderr)
    return 1
  print("kernels: %s %s" % ("built" if seconds else "kept", path)
        + (" (%.0f s)" % seconds if seconds else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
