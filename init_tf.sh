#!/usr/bin/env bash
# Installs what the recipe needs into the python3 on PATH. Idempotent: re-running it only
# checks. A TensorFlow that already imports (a vendor 1.15 build, say) is kept as it is.
set -euo pipefail
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"  # quiet TensorFlow imports

PYTHON="${PYTHON:-python3}"
TF_VERSION="${TF_VERSION:-2.15.1}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
pip_install() { "$PYTHON" -m pip install --disable-pip-version-check -q "$@"; }
have_module() { "$PYTHON" -c "import $1" >/dev/null 2>&1; }

# 1. OpenMPI (Debian packages) for Horovod's MPI path and mpi4py.
if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "init_tf: installing OpenMPI (libopenmpi-dev openmpi-bin)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenmpi-dev openmpi-bin >/dev/null
  else
    echo "init_tf: OpenMPI is missing; run: sudo apt-get install -y libopenmpi-dev openmpi-bin" >&2
    exit 1
  fi
fi

# 2. TensorFlow: keep one that imports, otherwise the CPU build we test with.
if have_module tensorflow; then
  echo "init_tf: keeping the installed TensorFlow"
else
  echo "init_tf: installing tensorflow-cpu==$TF_VERSION"
  pip_install "tensorflow-cpu==$TF_VERSION"
fi

# 3. Python packages of the recipe, its tools and tests (pip skips what is there).
#    TensorFlow < 2.16 is built against numpy 1.x: keep pip from pulling numpy 2 in.
#    TensorFlow 1.x keeps exactly the numpy it was installed with.
numpy_pin=$("$PYTHON" -c "
import numpy, tensorflow as tf
v = tuple(int(x) for x in tf.__version__.split('.')[:2])
print('numpy==' + numpy.__version__ if v < (2, 0) else 'numpy<2' if v < (2, 16) else 'numpy')")
pip_install "$numpy_pin" absl-py tokenizers mlperf-logging pytest vermin psutil
have_module mpi4py || pip_install mpi4py

# 4. Horovod against this TensorFlow, with Gloo and MPI. Built from source; --no-build-isolation
#    lets the build see the TensorFlow installed above.
if ! have_module horovod.tensorflow; then
  echo "init_tf: building horovod==$HOROVOD_VERSION (a few minutes)"
  pip_install -U pip setuptools wheel
  pip_install "$numpy_pin"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    pip_install --no-build-isolation "horovod==$HOROVOD_VERSION"
fi

"$PYTHON" - <<'PY'
import tensorflow as tf, absl, numpy, tokenizers, horovod, mpi4py
print("init_tf: tensorflow %s, numpy %s, tokenizers %s, horovod %s, mpi4py %s"
      % (tf.__version__, numpy.__version__, tokenizers.__version__, horovod.__version__, mpi4py.__version__))
PY
