#!/usr/bin/env bash
# Installs what the recipe needs. Idempotent: re-running it only checks. A TensorFlow or
# Horovod that already imports (a vendor 1.15 build, say) is kept as it is. One line per
# decision says what it chose and why.
#
# Settings (environment variables):
#   PYTHON           the interpreter to install into (default python3)
#   TF_VERSION       TensorFlow to install when none imports (default 2.15.1). A 1.x version
#                    without PYTHON sets up a Python 3.7 virtual environment in this folder,
#                    TF_VENV (default .venv-tf<major.minor>), made from PYTHON37 (default
#                    pyenv's 3.7.16)
#   HOROVOD_VERSION  default 0.28.1
#   CUDA_HOME        CUDA for Horovod's GPU operations (default /usr/local/cuda)
#   NCCL_HOME        NCCL for them (default: the nvidia-nccl-cu12 package, then /usr)
#   INIT_TF_DRY_RUN  1: print the decisions and the commands, run nothing
# Then it installs this checkout as the package bert_pretrain in editable mode (pip -e) and
# builds its fused CPU kernels for this TensorFlow (bert_pretrain/model/kernels.py).
set -Eeuo pipefail  # -E: the ERR trap below sees failures inside functions too
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"  # quiet TensorFlow imports
# Installing into the system Python as root is what this script is for on a fresh machine:
# pip's warning against it would read as a failure.
export PIP_ROOT_USER_ACTION="${PIP_ROOT_USER_ACTION:-ignore}"
# Likewise setuptools' boxed warning on every editable install (the last step imports it).
export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation"

ROOT="$(cd "$(dirname "$0")" && pwd)"
TF_VERSION="${TF_VERSION:-2.15.1}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
DRY_RUN="${INIT_TF_DRY_RUN:-0}"

say() { echo "init_tf: $*"; }
die() { echo "init_tf: error: $*" >&2; exit 1; }
on_error() {  # the ERR trap: a command that failed unexpectedly, named once by its line
  local status=$? line=$1 signal=""
  [ "$BASH_SUBSHELL" = 0 ] || return 0  # in a $(...): the line that ran it says it
  [ "${#BASH_LINENO[@]}" -le 2 ] || line="${BASH_LINENO[${#BASH_LINENO[@]}-2]}"
  if [ "$status" -gt 128 ] && name=$(kill -l "$status" 2>/dev/null); then signal=" (SIG$name)"; fi
  echo "init_tf: error: line $line of ${0##*/} failed with exit status $status$signal; the lines above say why; run it again once that is fixed" >&2
}
trap 'on_error "$LINENO"' ERR
run() {  # runs a command; in a dry run only prints it
  if [ "$DRY_RUN" = 1 ]; then printf '+'; printf ' %q' "$@"; echo; else "$@"; fi
}
pip_install() { run "$PYTHON" -m pip install --disable-pip-version-check -q "$@"; }
have_module() { "$PYTHON" -c "import $1" >/dev/null 2>&1; }

# 0. Python: TensorFlow 1.x needs Python <= 3.7; it gets a virtual environment of its own.
if [ "${TF_VERSION%%.*}" = 1 ] && [ -z "${PYTHON:-}" ]; then
  venv="${TF_VENV:-$ROOT/.venv-tf$(echo "$TF_VERSION" | cut -d. -f1-2)}"
  PYTHON="$venv/bin/python"
  if [ -x "$PYTHON" ]; then
    say "Python: using $venv (TensorFlow $TF_VERSION needs Python 3.7)"
  else
    PYTHON37="${PYTHON37:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions/3.7.16/bin/python3.7}"
    [ -x "$PYTHON37" ] || die "TensorFlow $TF_VERSION needs Python 3.7 and $PYTHON37 is not there; set PYTHON37 to a Python 3.7 interpreter"
    say "Python: creating $venv from $PYTHON37 (TensorFlow $TF_VERSION needs Python 3.7)"
    run "$PYTHON37" -m venv "$venv"
  fi
fi
PYTHON="${PYTHON:-python3}"
case "$PYTHON" in /*|"") ;; */*) PYTHON="$PWD/$PYTHON" ;; esac  # it is also run from /

# 1. OpenMPI (Debian packages) for Horovod's MPI path.
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
  say "OpenMPI: keeping the installed one ($(command -v mpirun))"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "OpenMPI: installing libopenmpi-dev openmpi-bin (mpicc or mpirun is missing)"
  # Another apt (an image's first-boot update, a second init_tf) may hold dpkg's lock: wait.
  run apt-get -o DPkg::Lock::Timeout=600 update -qq
  run env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    libopenmpi-dev openmpi-bin
else
  die "OpenMPI is missing; run: sudo apt-get install -y libopenmpi-dev openmpi-bin"
fi

# 2. The GPU, if any: nvidia-smi or Iluvatar's ixsmi lists it.
gpu=""
for smi in nvidia-smi ixsmi; do
  listed=$("$smi" -L 2>/dev/null | grep '^GPU [0-9]' || true)
  if [ -n "$listed" ]; then
    # The first line by expansion: `echo | head` under pipefail can die of SIGPIPE.
    gpu="$smi -L lists $(echo "$listed" | wc -l): ${listed%%$'\n'*}"
    break
  fi
done
if [ -n "$gpu" ]; then say "GPU: $gpu"; else say "GPU: none (nvidia-smi -L and ixsmi -L list no GPU)"; fi

# 3. TensorFlow: keep one that imports, otherwise the build we test with, for GPU or CPU.
#    TensorFlow < 2.16 is built against numpy 1.x, and before 2.5 against numpy < 1.20
#    (newer numpy fails with "Cannot convert a symbolic Tensor to a numpy array").
tokenizers="tokenizers"
tf_pins=()
case "$TF_VERSION" in
  1.*) numpy_pin="numpy<1.20"; tokenizers="tokenizers<0.14"; tf_pins=("protobuf<3.21") ;;
  2.1[0-5].*|2.[0-9].*) numpy_pin="numpy<2" ;;
  *) numpy_pin="numpy" ;;
esac
if have_module tensorflow; then
  tf_found=$("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)
  say "TensorFlow: keeping the installed $tf_found (it imports)"
  case "$tf_found" in 1.*) tokenizers="tokenizers<0.14" ;; esac
  # It keeps the numpy it works with; 2.x before 2.16 keeps numpy 1.x.
  pin="import numpy, tensorflow as tf
v = tuple(int(x) for x in tf.__version__.split('.')[:2])
print('numpy==' + numpy.__version__ if v < (2, 0) else 'numpy<2' if v < (2, 16) else 'numpy')"
  numpy_pin=$("$PYTHON" -c "$pin")
else
  if [ -z "$gpu" ]; then
    tf_package="tensorflow-cpu==$TF_VERSION"
    say "TensorFlow: installing $tf_package (no TensorFlow imports and no GPU is visible)"
  elif [ "${TF_VERSION%%.*}" = 1 ]; then
    tf_package="tensorflow-gpu==$TF_VERSION"
    say "TensorFlow: installing $tf_package (no TensorFlow imports and a GPU is visible; it needs CUDA 10.0 and cuDNN 7 on the system)"
  else
    tf_package="tensorflow[and-cuda]==$TF_VERSION"
    say "TensorFlow: installing $tf_package (no TensorFlow imports and a GPU is visible; it brings CUDA 12 and NCCL as nvidia-*-cu12 packages)"
  fi
  pip_install "$tf_package" "$numpy_pin" "${tf_pins[@]}"
fi

# 4. Python packages of the recipe, its tools and tests (pip skips what is there).
packages=("$numpy_pin" "$tokenizers" absl-py mlperf-logging pytest pytest-xdist vermin psutil matplotlib)
say "Python packages: ${packages[*]} (pip installs those missing or not matching)"
pip_install "${packages[@]}"

# 5. Horovod against this TensorFlow, with Gloo and MPI, and with NCCL on a GPU when CUDA
#    and NCCL are found. Built from source; --no-build-isolation lets the build see the
#    TensorFlow installed above.
cuda_dir() {  # the CUDA toolkit folder, if it has headers and nvcc
  local dir="${CUDA_HOME:-/usr/local/cuda}"
  if [ -f "$dir/include/cuda_runtime.h" ] && [ -x "$dir/bin/nvcc" ]; then echo "$dir"; fi
}
nccl_dirs() {  # where NCCL is looked for
  if [ -n "${NCCL_HOME:-}" ]; then echo "$NCCL_HOME"; return; fi
  "$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"] + "/nvidia/nccl")' 2>/dev/null || true
  echo /usr
}
if have_module horovod.tensorflow; then
  say "Horovod: keeping the installed $("$PYTHON" -c 'import horovod; print(horovod.__version__)') (it imports)"
else
  hvd_env=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
           HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1)
  cuda=$(cuda_dir)
  nccl=""
  while IFS= read -r dir; do
    if [ -f "$dir/include/nccl.h" ]; then nccl="$dir"; break; fi
    # In a dry run tensorflow[and-cuda] is not installed yet; its nvidia-nccl-cu12 will be.
    case "$DRY_RUN ${NCCL_HOME:-} ${tf_package:-}" in
      "1  tensorflow[and-cuda]"*) nccl="$dir"; break ;;
    esac
  done < <(nccl_dirs)
  if [ -z "$gpu" ]; then
    say "Horovod: building $HOROVOD_VERSION with CPU operations only (no GPU is visible)"
  elif [ -z "$cuda" ]; then
    say "Horovod: building $HOROVOD_VERSION with CPU operations only: a GPU is visible but CUDA is not found (no include/cuda_runtime.h and bin/nvcc in ${CUDA_HOME:-/usr/local/cuda}); set CUDA_HOME for GPU operations"
  elif [ -z "$nccl" ]; then
    say "Horovod: building $HOROVOD_VERSION with CPU operations only: a GPU is visible but NCCL is not found (no include/nccl.h in $(nccl_dirs | paste -s -d ' ')); set NCCL_HOME for GPU operations"
  else
    say "Horovod: building $HOROVOD_VERSION with GPU operations (NCCL; CUDA $cuda, NCCL $nccl)"
    hvd_env+=(HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_CUDA_HOME=$cuda" "HOROVOD_NCCL_HOME=$nccl"
              HOROVOD_NCCL_LINK=SHARED)
    # The pip package ships only libnccl.so.2; the build links against libnccl.so.
    if [ ! -e "$nccl/lib/libnccl.so" ] && { [ -e "$nccl/lib/libnccl.so.2" ] || [ ! -e "$nccl" ]; }; then
      run ln -s libnccl.so.2 "$nccl/lib/libnccl.so"
    fi
  fi
  pip_install -U pip setuptools wheel
  pip_install "$numpy_pin"
  run env "${hvd_env[@]}" "$PYTHON" -m pip install --disable-pip-version-check -q \
    --no-build-isolation "horovod==$HOROVOD_VERSION"
fi

# 6. This checkout as the package bert_pretrain, in editable mode, so that tools/, bench/ and
#    tests/ import it from here without path edits. Kept when it already imports from this
#    checkout (asked from /, without PYTHONPATH); installed again when it imports from
#    another one (a deleted clone leaves its editable finder behind). --no-deps: its
#    dependencies are the packages above, in the versions this TensorFlow needs;
#    --no-build-isolation: built with the installed setuptools, nothing fetched (an
#    editable install of a pyproject.toml project needs pip >= 21.3 and setuptools >= 64).
checkout="$(cd "$ROOT" && pwd -P)"
found=$(cd / && env -u PYTHONPATH "$PYTHON" -c 'import os, bert_pretrain
print(os.path.dirname(os.path.dirname(os.path.realpath(bert_pretrain.__file__))))' 2>/dev/null || true)
if [ "$found" = "$checkout" ]; then
  say "bert_pretrain: keeping the editable install of this checkout ($checkout)"
else
  why="it does not import"
  if [ -n "$found" ]; then why="it imports from $found"; fi
  say "bert_pretrain: installing this checkout ($checkout) in editable mode ($why)"
  builds=$("$PYTHON" -c 'import setuptools, pip, wheel  # setuptools first: it replaces distutils
def version(m): return tuple(int(x) for x in m.__version__.split(".")[:2])
print(version(pip) >= (21, 3) and version(setuptools) >= (64, 0))' 2>/dev/null || true)
  if [ "$builds" != True ]; then
    pip_install -U "pip>=21.3" "setuptools>=64" wheel
  fi
  pip_install --no-deps --no-build-isolation -e "$checkout"
fi

# 7. The fused CPU kernels (bert_pretrain/model/kernels.cc) for this TensorFlow, built once
#    (kept while the source and TensorFlow stay). Where they do not build, the recipe runs
#    TensorFlow's ops instead and its device line says why.
if [ "$DRY_RUN" = 1 ]; then
  run "$PYTHON" -m bert_pretrain.model.kernels
elif built=$(cd / && "$PYTHON" -m bert_pretrain.model.kernels 2>&1); then
  say "$(echo "$built" | tail -n 1)"
else
  say "$(echo "$built" | tail -n 1); TensorFlow's ops stand in for them"
fi

if [ "$DRY_RUN" = 1 ]; then exit 0; fi
"$PYTHON" - <<'PY'
import tensorflow as tf, absl, numpy, tokenizers, horovod, bert_pretrain
print("init_tf: tensorflow %s, numpy %s, tokenizers %s, horovod %s"
      % (tf.__version__, numpy.__version__, tokenizers.__version__, horovod.__version__))
PY
