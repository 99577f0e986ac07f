"""Shared fixtures: a tiny BERT config and real pretraining TFRecords made from
tests/data/sample_text.txt with the recipe's own vocab builder and create_pretraining_data."""

import contextlib
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import demo
from bert_pretrain.distributed import device
from bert_pretrain.model import kernels
from bert_pretrain.model import modeling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORKED_RUNS = os.path.join(ROOT, "tests", "forked_runs.py")
FORK_HOOK = os.path.join(ROOT, "tests", "fork_hook")  # forking_env's
RANKS_MODULE = "bert_pretrain.run_pretraining"  # the command whose job processes fork
SAMPLE_TEXT = os.path.join(ROOT, "tests", "data", "sample_text.txt")
SEQ_LENGTH = 64
PREDICTIONS = 10
# The slowest files, longest first (their times: docs/performance.md); the others follow.
# pytest-xdist's --dist loadfile hands out files by their number of tests, which started
# slow files after the quick ones: the suite ended on one busy worker.
SLOWEST_FIRST = ["test_horovod.py", "test_distribution.py", "test_scaling.py",
                 "test_surviving.py", "test_run_pretraining.py", "test_bad_inputs.py",
                 "test_bench.py", "test_tool_errors.py", "test_export.py", "test_scripts.py",
                 "test_prepare_wiki.py", "test_bad_records.py", "test_checkpoints.py",
                 "test_demo.py", "test_multihost.py", "test_run_classifier.py",
                 "test_pack_records.py", "test_modeling.py", "test_compare.py",
                 "test_optimization.py", "test_packed_run.py", "test_mlperf.py",
                 "test_kernels.py"]

# A suite started as a background job (`.ci/run &` in a script) inherits SIGINT ignored, and so
# would every command it starts: the tests that press Ctrl-C on one would wait in vain.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
  """Compiles the project's sources once, before the workers start: with
  PYTHONDONTWRITEBYTECODE set, each of the suite's hundreds of subprocesses would compile
  every module it imports again."""
  if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
    import compileall  # pylint: disable=g-import-not-at-top
    for folder in ("bert_pretrain", "bench", "tools", "tests"):
      compileall.compile_dir(os.path.join(ROOT, folder), quiet=1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """--dist loadfile with the files of SLOWEST_FIRST handed out first, in that order."""
  if config.getoption("dist") != "loadfile":
    return None
  from xdist.scheduler import LoadFileScheduling  # pylint: disable=g-import-not-at-top
  rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}

  class SlowestFirst(LoadFileScheduling):

    def _assign_work_unit(self, node):
      # workqueue: an OrderedDict of file -> its tests, whose first entry goes next.
      for scope in sorted(self.workqueue, key=lambda f: rank.get(os.path.basename(f),
                                                                  len(rank))):
        self.workqueue.move_to_end(scope)
      super(SlowestFirst, self)._assign_work_unit(node)

  return SlowestFirst(config, log)


# The fused kernels as init_tf.sh leaves them, built by the first process to import this
# (xdist's controller): built mid-suite, they would change the device line under tests
# that read it before. A failed build is test_kernels' to report.
try:
  kernels.build()
except kernels.BuildError:
  pass

# What --amp computes on this machine's CPU, as its device line says it: bfloat16, or
# float32 and why where TensorFlow computes bfloat16 slower (device.detect_device).
AMP_ON_THIS_CPU = device.compute_text(device.detect_device("cpu", True, "auto"))
# And float16's (the GPU's type, run on the CPU): with a note where the CPU lacks float16
# arithmetic.
FLOAT16_ON_THIS_CPU = device.compute_text(device.detect_device("cpu", True, "float16"))

# One layer: most of a test's time is its runs' start-up, which grows with the graph; the
# tests of how layers stack and are named use TWO_LAYER_CONFIG.
TINY_CONFIG = {
    "vocab_size": 600,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 128,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
}
TWO_LAYER_CONFIG = dict(TINY_CONFIG, num_hidden_layers=2)

tf.disable_v2_behavior()


@pytest.fixture(scope="session")
def pretraining_data(tmp_path_factory):
  """Folders train/ (2 files) and eval/ (1 file) of real records, vocab and config."""
  from bert_pretrain import create_pretraining_data
  from bert_pretrain.data import tokenization
  root = tmp_path_factory.mktemp("pretraining_data")
  vocab = str(root / "vocab.txt")
  tokenization.build_wordpiece_vocab([SAMPLE_TEXT], TINY_CONFIG["vocab_size"], vocab)
  for name, files, seed in (("train", 2, 1), ("eval", 1, 2)):
    (root / name).mkdir()
    create_pretraining_data.create_pretraining_data(
        [SAMPLE_TEXT], [str(root / name / ("part-%d" % i)) for i in range(files)], vocab,
        max_seq_length=SEQ_LENGTH, max_predictions_per_seq=PREDICTIONS, dupe_factor=2,
        random_seed=seed)
  config = root / "bert_config.json"
  config.write_text(json.dumps(TINY_CONFIG))
  return {"root": root, "train": str(root / "train"), "eval": str(root / "eval"),
          "vocab": vocab, "config": str(config)}


def pack_fixture_records(train_dir, output_dir):
  """Packs the records of train_dir into output_dir (pack_records, up to 3 a pack);
  returns its summary."""
  from bert_pretrain import pack_records
  return pack_records.pack(train_dir, str(output_dir), jobs=1)


def cut_short(values, length):
  """A parsed unpacked record cut to its first `length` tokens, with the predictions
  among them: a valid record of a shorter sequence."""
  values = dict(values)
  keep = np.arange(len(values["input_ids"])) < length
  for name in ("input_ids", "input_mask", "segment_ids"):
    values[name] = values[name] * keep
  kept = (values["masked_lm_weights"] > 0) & (values["masked_lm_positions"] < length)
  for name in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
    values[name] = np.concatenate([values[name][kept],
                                   np.zeros(np.sum(~kept), values[name].dtype)])
  return values


@pytest.fixture(scope="session")
def packed_data(pretraining_data, tmp_path_factory):
  """pretraining_data's training records cut to 10..40 of their 64 tokens (shorter than
  Wikipedia's at 64, as about half of its tokens at 512 are padding) in unpacked/, and
  packed in train/ with pack_records.json; summary is the packer's."""
  from bert_pretrain.data import records
  root = tmp_path_factory.mktemp("packed_data")
  (root / "unpacked").mkdir()
  rng = np.random.RandomState(3)
  for name in sorted(os.listdir(pretraining_data["train"])):
    with tf.io.TFRecordWriter(str(root / "unpacked" / name)) as writer:
      for serialized in tf.io.tf_record_iterator(os.path.join(pretraining_data["train"],
                                                              name)):
        values = cut_short(records.parse_example(serialized), rng.randint(10, 41))
        assert records.example_problem(values, SEQ_LENGTH, PREDICTIONS) is None
        writer.write(records.serialize_example(values))
  summary = pack_fixture_records(str(root / "unpacked"), root / "train")
  return dict(pretraining_data, train=str(root / "train"), unpacked=str(root / "unpacked"),
              summary=summary)


def _command_env():
  """The environment of a run of the command: the test's, with the repository first."""
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("PYTEST_CURRENT_TEST", None)  # pytest's name of the running test
  return env


class ForkedCommand(object):
  """A command as `python3 -m` runs it, forked from a process that imported what it
  imports once (tests/forked_runs.py), in the environment this worker had when it started
  one. One run at a time; with ranks_socket, also the processes of rank_command, any
  number at once."""

  def __init__(self, module, env, ranks_socket=None):
    self.module = module
    self.env = env
    self.ranks_socket = ranks_socket  # where it takes ranks too (tests/forked_runs.py)
    self.server = None  # started by the first run
    self.folder = tempfile.mkdtemp(prefix="forked_runs-")
    self.count = 0
    self.running = None  # the ForkedRun not yet ended
    self._buffer = b""

  def start(self, flags, timeout, stdout, stderr):
    """Starts a run writing to the files at `stdout` and `stderr` (the same path: one
    file); returns its ForkedRun."""
    assert self.running is None, "one run at a time"
    self.serve()
    for path in (stdout, stderr):
      open(str(path), "w").close()  # there once this returns, as with Popen
    request = {"argv": flags, "stdout": str(stdout), "stderr": str(stderr),
               "cwd": os.getcwd(), "timeout": timeout}
    self.server.stdin.write((json.dumps(request) + "\n").encode())
    self.running = ForkedRun(self, [self.module] + flags, self.message(None)["pid"])
    return self.running

  def serve(self):
    """Starts the server unless it runs."""
    if self.server is None:
      self.server = subprocess.Popen(
          [sys.executable, FORKED_RUNS, self.module] + (
              [self.ranks_socket] if self.ranks_socket else []),
          env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)

  def message(self, timeout):
    """The server's next message, or None when none came within `timeout` seconds
    (None: waits as long as it takes)."""
    deadline = None if timeout is None else time.time() + timeout
    fd = self.server.stdout.fileno()
    while b"\n" not in self._buffer:
      left = None if deadline is None else max(0, deadline - time.time())
      if not select.select([fd], [], [], left)[0]:
        return None
      chunk = os.read(fd, 4096)
      assert chunk, "tests/forked_runs.py ended"
      self._buffer += chunk
    line, self._buffer = self._buffer.split(b"\n", 1)
    return json.loads(line.decode())

  def run(self, flags, timeout):
    """Returns a CompletedProcess with the run's exit status, stdout and stderr."""
    self.count += 1
    paths = [os.path.join(self.folder, "run-%d.%s" % (self.count, name))
             for name in ("stdout", "stderr")]
    returncode = self.start(flags, timeout, *paths).wait()
    outputs = [open(path).read() for path in paths]
    for path in paths:
      os.remove(path)
    if returncode == -signal.SIGALRM:
      raise subprocess.TimeoutExpired(flags, timeout, *outputs)
    return subprocess.CompletedProcess(flags, returncode, *outputs)

  def close(self):
    if self.running is not None:
      self.running.kill()
      self.running.wait()
    if self.server is not None:
      self.server.stdin.close()
      try:
        self.server.wait(timeout=60)
      except subprocess.TimeoutExpired:
        self.server.kill()
    shutil.rmtree(self.folder, ignore_errors=True)
    if self.ranks_socket and os.path.exists(self.ranks_socket):
      os.remove(self.ranks_socket)


class ForkedRun(object):
  """A run of a ForkedCommand: what the tests use of subprocess.Popen."""

  def __init__(self, command, args, pid):
    self.command = command
    self.args = args
    self.pid = pid
    self.returncode = None

  def poll(self):
    if self.returncode is None:
      self._ended(self.command.message(0))
    return self.returncode

  def wait(self, timeout=None):
    if self.returncode is None:
      self._ended(self.command.message(timeout))
      if self.returncode is None:
        raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def send_signal(self, sig):
    # Asks the server first: once it has reaped the run, the pid can be another
    # process's (pid_max 32768 wraps within a suite), another test's worker say.
    if self.poll() is None:
      os.kill(self.pid, sig)

  def kill(self):
    self.send_signal(signal.SIGKILL)

  def _ended(self, message):
    if message is not None:
      self.returncode = message["returncode"]
      self.command.running = None


# This worker's ForkedCommands by module, the last used last; at most two stay, each a
# process holding TensorFlow (about 450 MB), one of them RANKS_MODULE's.
_forked_commands = {}
_SESSION_ENV = []
_RANKS_SOCKET = []  # where this worker's ForkedCommand of RANKS_MODULE takes ranks


# PATH as the session found it: its horovodrun is the installed one.
INSTALLED_PATH = os.environ["PATH"]
_HOROVODRUN = """#!{python}
# horovodrun for the tests (tests/conftest.py): Horovod's launcher, its build check answered.
import sys
from horovod.runner import launch
if __name__ == "__main__":  # the launcher's helper processes import this file too
  launch.gloo_built = lambda verbose=False: {gloo}
  launch.mpi_built = lambda verbose=False: {mpi}
  sys.exit(launch.run_commandline())
"""


@pytest.fixture(scope="session", autouse=True)
def horovodrun_checked_once(tmp_path_factory):
  """Puts first on PATH a horovodrun that is Horovod's own launcher, whose check of how
  Horovod was built (Gloo? MPI?) is answered by the same check run once here.

  horovodrun makes that check on every launch in a new process importing TensorFlow,
  about 5 s of CPU; the suite launches it about 80 times. Here the check's process forks
  from this worker, which imported TensorFlow already. The test of run_multi_card_FPS.sh
  with the demo runs the installed horovodrun (INSTALLED_PATH)."""
  from horovod.common import util  # pylint: disable=g-import-not-at-top
  folder = tmp_path_factory.mktemp("horovodrun")
  path = folder / "horovodrun"
  path.write_text(_HOROVODRUN.format(python=sys.executable, gloo=bool(util.gloo_built()),
                                     mpi=bool(util.mpi_built())))
  path.chmod(0o755)
  os.environ["PATH"] = "%s:%s" % (folder, INSTALLED_PATH)
  yield str(path)
  os.environ["PATH"] = INSTALLED_PATH


@pytest.fixture(scope="session", autouse=True)
def forked_commands(horovodrun_checked_once):
  """Starts this worker's ForkedCommand of run_pretraining, which forks the processes of
  rank_command too, and closes its ForkedCommands at the end; they keep the session's
  start's environment."""
  del horovodrun_checked_once  # the environment holds it
  _SESSION_ENV.append(_command_env())
  folder = tempfile.mkdtemp(prefix="ranks-")  # short: a socket's path has 107 bytes at most
  _RANKS_SOCKET.append(os.path.join(folder, "socket"))
  command = _forked_command(RANKS_MODULE, [])
  command.serve()
  _wait_for_socket(command)  # a command started sooner would not fork
  yield _forked_commands
  for command in _forked_commands.values():
    command.close()
  _forked_commands.clear()
  shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def environment_kept():
  """Within: variables set, changed or removed are put back as they were after it; pytest's
  PYTEST_CURRENT_TEST is left to pytest. Only what changed is touched, so that a thread
  starting a process meanwhile never sees the environment half restored."""
  before = dict(os.environ)
  try:
    yield
  finally:
    for name in set(os.environ) - set(before) - {"PYTEST_CURRENT_TEST"}:
      del os.environ[name]
    for name, value in before.items():
      if os.environ.get(name) != value and name != "PYTEST_CURRENT_TEST":
        os.environ[name] = value


@pytest.fixture(autouse=True)
def environment_restored():
  """Each test leaves the environment as it found it. What a test runs in-process may set
  variables (importing torch sets TORCHINDUCTOR_CACHE_DIR); the worker's later runs would
  then each start a process of their own instead of forking (_forked_command)."""
  with environment_kept():
    yield


def _forked_command(module, flags):
  """This worker's ForkedCommand of `module` for a run with `flags`, when the run could not
  tell the difference: the same environment, no --use_xla (TensorFlow reads its XLA flags
  from the environment once), and no other run of it going on; else None."""
  if (not _SESSION_ENV or _command_env() != _SESSION_ENV[0] or
      any(f.startswith("--use_xla") for f in flags)):
    return None
  command = _forked_commands.pop(module, None)
  if command and command.running:
    _forked_commands[module] = command
    return None
  if command and command.server and command.server.poll() is not None:
    command.close()  # it ended, its stderr saying why: a new one
    command = None
  command = command or ForkedCommand(
      module, _SESSION_ENV[0], _RANKS_SOCKET[0] if module == RANKS_MODULE else None)
  _forked_commands[module] = command
  idle = [m for m, c in _forked_commands.items()
          if not c.running and m not in (module, RANKS_MODULE)]
  for name in idle[:max(0, len(_forked_commands) - 2)]:
    _forked_commands.pop(name).close()
  return command


def run_command(module, *flags, timeout=300):
  """Runs python3 -m `module` (a command of bert_pretrain); returns the CompletedProcess.

  Forked from this worker's ForkedCommand of it (_forked_command) where the run could not
  tell the difference; otherwise a process of its own."""
  command = _forked_command(module, flags)
  if command:
    return command.run(list(flags), timeout)
  return subprocess.run([sys.executable, "-m", module] + list(flags), stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, universal_newlines=True, env=_command_env(),
                        timeout=timeout)


def start_command(module, *flags, stdout, stderr, timeout=300):
  """Starts python3 -m `module`, its output going to the files at `stdout` and `stderr`
  (the same path: one file), as run_command would run it; returns the process: a
  ForkedRun or a subprocess.Popen, to poll, signal and wait for."""
  command = _forked_command(module, flags)
  if command:
    return command.start(list(flags), timeout, stdout, stderr)
  one_file = str(stderr) == str(stdout)
  with open(str(stdout), "w") as out, open(os.devnull if one_file else str(stderr), "w") as err:
    return subprocess.Popen([sys.executable, "-m", module] + list(flags), stdout=out,
                            stderr=subprocess.STDOUT if one_file else err, env=_command_env())


def signal_when(process, ready, signum, log, timeout=120):
  """Sends `signum` to `process` (start_command's) once ready() holds, the process still
  running, and waits for it; returns its exit status. A process left running is killed,
  the test failing with what it was doing (stuck_process_state)."""
  try:
    deadline = time.time() + timeout
    while not ready():
      assert process.poll() is None and time.time() < deadline, log.read_text()
      time.sleep(0.05)
    process.send_signal(signum)
    try:
      return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      raise AssertionError("still running %d s after signal %d: %s\n%s" % (
          timeout, signum, stuck_process_state(process), log.read_text()[-4000:])) from None
  finally:
    if process.poll() is None:
      process.kill()


def stuck_process_state(process):
  """What a process (a Popen or ForkedRun) that did not end and its descendants are doing:
  each one's /proc state and signal masks (a signal blocked or ignored since the test
  started it never arrives) and kernel wait. Those armed with stacks.STACK_SIGNAL write
  their Python stacks first: the process to its log, a benchmark's worker to its own."""
  import psutil  # pylint: disable=g-import-not-at-top
  from bert_pretrain.distributed import stacks  # pylint: disable=g-import-not-at-top
  try:
    tree = [psutil.Process(process.pid)] + psutil.Process(process.pid).children(recursive=True)
  except psutil.Error as e:
    return str(e)
  armed = [member for member in tree
           if stacks._catches_stack_signal(member.pid)]  # pylint: disable=protected-access
  for member in armed:
    try:
      if member.pid == process.pid:
        process.send_signal(stacks.STACK_SIGNAL)  # not once it has ended
      else:
        member.send_signal(stacks.STACK_SIGNAL)
    except (OSError, psutil.Error):
      pass
  if armed:
    time.sleep(2)  # for their stacks to be written
  lines = []
  for member in tree:
    try:
      with open("/proc/%d/status" % member.pid) as f:
        status = [" ".join(line.split()) for line in f if line.split(":")[0] in (
            "State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")]
      with open("/proc/%d/wchan" % member.pid) as f:
        lines.append("pid %d %s: %s, waits in %s" % (member.pid, member.name(),
                                                    " ".join(status), f.read()))
    except (OSError, psutil.Error) as e:
      lines.append("pid %d: %s" % (member.pid, e))
  return "; ".join(lines)


def passing_ranks_path(tmp_path, path=None, print_args=False):
  """A PATH whose first folder (tmp_path/python_bin) holds a python3 that is this
  interpreter but for `python3 -m bert_pretrain.run_pretraining ...`, which (a rank, or
  the check run before the ranks) ends at once with status 0, printing its arguments a line
  each with print_args (also for the --check_only check the multi-card script runs first
  on this host): a test of the scripts' commands sees them without running them.
  path: the PATH to put it in front of (default: this process's)."""
  bin_dir = tmp_path / "python_bin"
  bin_dir.mkdir(exist_ok=True)
  fake = bin_dir / "python3"
  fake.write_text(
      "#!/bin/sh\n"
      "case \"$2\" in\n"
      "  bert_pretrain.run_pretraining) %s ;;\n"
      "  *) exec %s \"$@\" ;;\n"
      "esac\n" % ("shift 2; printf '%s\\n' \"$@\"" if print_args else "exit 0",
                   sys.executable))
  fake.chmod(0o755)
  return "%s:%s" % (bin_dir, path or os.environ["PATH"])


def rewrite_checkpoint(prefix, out_prefix, change=lambda name, value: value, extra=None):
  """Writes a copy of checkpoint `prefix` at `out_prefix`, each value as change(name,
  value) makes it, with the variables of `extra` (name -> value) beside them: a
  converted, stitched-together or foreign checkpoint. Returns out_prefix."""
  reader = tf.train.load_checkpoint(prefix)
  values = {name: change(name, reader.get_tensor(name))
            for name in reader.get_variable_to_shape_map()}
  values.update(extra or {})
  with tf.Graph().as_default():
    for name, value in values.items():
      tf.Variable(value, name=name)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      tf.train.Saver().save(sess, out_prefix, write_meta_graph=False)
  return out_prefix


def horovod_env(**extra):
  """The environment of a launcher, horovodrun or mpirun: the repository first, TensorFlow
  quiet, Open MPI allowed as root, its ranks yielding their core while they wait (busy
  polling took CPU the other tests' processes need); keyword arguments add or replace
  variables."""
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
             OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
             OMPI_MCA_mpi_yield_when_idle="1")
  env.update(extra)
  return env


def forking_env(env, script=False, socket_path=None):
  """`env` for a command whose new `python3 -m` processes of the commands in
  forked_runs.FORKABLE fork from this worker's server of RANKS_MODULE (or the one at
  socket_path: forking_server) instead of importing TensorFlow (tests/fork_hook), where
  they could not tell the difference. Not for commands run in a namespace of their own (a
  read-only mount, another host's network), nor for those a test signals. script: the
  command is a script that puts the repository first on PYTHONPATH itself, so env's is
  left out (the server has the repository alone)."""
  path = [] if script else [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
  return dict(env, PYTHONPATH=os.pathsep.join(path + [FORK_HOOK]),
              FORKED_RUNS_SOCKET=socket_path or _RANKS_SOCKET[0])


def tool_env():
  """The environment of a test's command line of a tool: the test's, the repository first on
  PYTHONPATH, TensorFlow quiet, made to fork (forking_env)."""
  return forking_env(dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"))


def _wait_for_socket(command, timeout=300):
  """Waits until the server of `command` (a ForkedCommand with a socket) has imported and
  takes clients, has ended, or `timeout` seconds have gone (its clients then run the
  commands themselves)."""
  deadline = time.time() + timeout
  while (not os.path.exists(command.ranks_socket) and command.server.poll() is None and
         time.time() < deadline):
    time.sleep(0.1)


@contextlib.contextmanager
def forking_server(env):
  """Within: a server of RANKS_MODULE of its own started in `env` (a PYTHONPATH of the
  test's, say); yields its socket's path, for forking_env."""
  folder = tempfile.mkdtemp(prefix="ranks-")
  command = ForkedCommand(RANKS_MODULE, env, os.path.join(folder, "socket"))
  try:
    command.serve()
    _wait_for_socket(command)
    yield command.ranks_socket
  finally:
    command.close()
    shutil.rmtree(folder, ignore_errors=True)


def launcher_env(**values):
  """horovod_env without the session's card variables but those given."""
  env = horovod_env(**values)
  for name in ("IX_NUM_CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
    if name not in values:
      env.pop(name, None)
  return env


def run_multi_card_script(folder, *flags, **values):
  """bash run_multi_card_FPS.sh FLAGS in `folder`, with launcher_env(**values)."""
  return subprocess.run(["bash", os.path.join(ROOT, "run_multi_card_FPS.sh")] + list(flags),
                        cwd=str(folder), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        universal_newlines=True,
                        env=forking_env(launcher_env(**values), script=True), timeout=300)


def rank_command(*flags):
  """The command of one process of a job (a Horovod rank under horovodrun or mpirun, a
  multi_worker_mirrored worker): python3 -m bert_pretrain.run_pretraining FLAGS, forked
  from this worker's ForkedCommand of it where the process could not tell the difference
  (tests/forked_runs.py --rank); on this host only."""
  return [sys.executable, FORKED_RUNS, "--rank", _RANKS_SOCKET[0], sys.executable, "-m",
          RANKS_MODULE] + list(flags)


@functools.lru_cache(maxsize=None)  # the machine's answer, asked once a worker
def can_look_into_descriptors():
  """Whether processes.unread_output and processes.sleeping can tell here: pidfd_getfd
  (Linux 5.6; a container's seccomp may forbid it) and a readable wait channel."""
  from bert_pretrain import processes  # pylint: disable=g-import-not-at-top
  child = subprocess.Popen(["sleep", "30"], stdin=subprocess.PIPE)
  try:
    deadline = time.time() + 10
    while processes.sleeping(child.pid) is None and time.time() < deadline:
      time.sleep(0.05)
    outputs = {os.readlink("/proc/self/fd/%d" % child.stdin.fileno())}
    return (processes.sleeping(child.pid) is not None and
            processes.unread_output(child.pid, outputs) is not None)
  finally:
    child.kill()
    child.wait()
    child.stdin.close()


def run_pretraining(*flags, timeout=300):
  """run_command of bert_pretrain.run_pretraining."""
  return run_command(RANKS_MODULE, *flags, timeout=timeout)


def base_flags(data, output_dir, **overrides):
  """Flags of a short run on the fixture data; keyword arguments override them (a value
  of None makes a bare flag, e.g. nodo_eval=None -> --nodo_eval)."""
  values = dict(input_files_dir=data["train"], eval_files_dir=data["eval"],
                bert_config_file=data["config"], output_dir=str(output_dir),
                max_seq_length=SEQ_LENGTH, max_predictions_per_seq=PREDICTIONS,
                train_batch_size=8, eval_batch_size=16, num_train_steps=4,
                learning_rate=1e-3, display_loss_steps=2, save_checkpoints_steps=100,
                samples_start_eval=10 ** 9, intra_op_threads=1, nodraw_report=None)
  values.update(overrides)
  return ["--%s" % k if v is None else "--%s=%s" % (k, v) for k, v in values.items()]


@pytest.fixture(scope="session")
def equal_weight_data(pretraining_data, tmp_path_factory):
  """The fixture records in one file with every masked_lm_weight set to 1, so every
  micro-batch normalizes its masked-LM loss by the same count, and a fresh checkpoint
  of a dropout-free config. Then ranks x batch and one card x (ranks * batch) compute
  the same mean gradient."""
  root = tmp_path_factory.mktemp("equal_weights")
  (root / "train").mkdir()
  files = sorted(os.listdir(pretraining_data["train"]))
  with tf.io.TFRecordWriter(str(root / "train" / "part-0")) as writer:
    for name in files:
      for record in tf.io.tf_record_iterator(os.path.join(pretraining_data["train"], name)):
        example = tf.train.Example.FromString(record)
        weights = example.features.feature["masked_lm_weights"].float_list.value
        for i in range(len(weights)):
          weights[i] = 1.0
        writer.write(example.SerializeToString())
  config = dict(TINY_CONFIG, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  (root / "bert_config.json").write_text(json.dumps(config))
  demo.write_fresh_checkpoint(modeling.BertConfig.from_dict(config),
                              str(root / "init" / "model.ckpt-0"))
  return dict(pretraining_data, train=str(root / "train"), config=str(root / "bert_config.json"),
              init=str(root / "init" / "model.ckpt-0"))


def final_weights(output_dir):
  """(global_step, {name: array}) of the model weights in output_dir's latest checkpoint."""
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(output_dir)))
  names = [n for n in reader.get_variable_to_shape_map() if n.startswith(("bert/", "cls/"))
           and not n.endswith(("adam_m", "adam_v"))]
  return reader.get_tensor("global_step"), {n: reader.get_tensor(n) for n in names}


def ordered_flags(data, out, batch, accumulation):
  """Flags of 3 updates on equal_weight_data in record order (ranks x batch = one global batch)."""
  # shuffle_buffer=1 with one file reads records in order; the replicas take the
  # micro-batches of that order in turn, so each update trains on the same records.
  # Clipped after the all-reduce and averaged over the ranks, ranks x accumulation x batch
  # update as one batch (clipped per micro-batch on each rank, or summed over the ranks,
  # MLPerf's reference, they would not).
  return base_flags(data, out, input_files_dir=data["train"], bert_config_file=data["config"],
                    init_checkpoint=data["init"], train_batch_size=batch,
                    num_accumulation_steps=accumulation, num_train_steps=3, shuffle_buffer=1,
                    learning_rate=5e-3, nodo_eval=None, gradient_clipping="after_allreduce",
                    cross_replica_gradients="mean")


def assert_same_weights(one_dir, other_dir, init_checkpoint):
  """Asserts that two runs of ordered_flags ended at step 3 with the same weights (rtol 1e-4)
  and that training moved them away from init_checkpoint.

  Returns:
    float, the largest absolute difference between the two runs' weights.
  """
  step_one, weights_one = final_weights(one_dir)
  step_other, weights_other = final_weights(other_dir)
  assert step_one == step_other == 3
  assert sorted(weights_one) == sorted(weights_other)
  reader = tf.train.load_checkpoint(init_checkpoint)
  moved = largest = 0.0
  for name in weights_one:
    np.testing.assert_allclose(weights_other[name], weights_one[name], rtol=1e-4, atol=1e-5,
                               err_msg=name)
    largest = max(largest, float(np.abs(weights_other[name] - weights_one[name]).max()))
    moved = max(moved, np.abs(weights_one[name] - reader.get_tensor(name)).max())
  assert moved > 1e-3  # the steps did train
  return largest


def kill_tree(pid):
  """Kills process `pid` and every process under it: what a failed test left running
  would slow the rest of the suite down."""
  import psutil  # pylint: disable=g-import-not-at-top  (Horovod's launcher needs it)
  try:
    parent = psutil.Process(pid)
    parent.suspend()  # starts no child after the list is taken; killed, its children move
    processes = [parent] + parent.children(recursive=True)
  except psutil.Error:
    return
  for process in processes:
    try:
      process.kill()
    except psutil.Error:
      pass


def workers_of(parent, count=2):
  """The pids of the first `count` worker processes (not multiprocessing's resource
  tracker) that process `parent` has, once there are that many."""
  import psutil  # pylint: disable=g-import-not-at-top  (Horovod's launcher needs it)
  deadline = time.time() + 120
  while time.time() < deadline:
    workers = []
    for child in psutil.Process(parent).children():
      try:
        if "_tracker import main" not in " ".join(child.cmdline()):
          workers.append(child.pid)
      except psutil.Error:
        pass
    if len(workers) >= count:
      return workers[:count]
    time.sleep(0.05)
  raise AssertionError("process %d has not %d workers after 120 s" % (parent, count))


def gone(pid, seconds=30):
  """Whether process pid has ended (or is a zombie) within `seconds`: a killed process
  ends when the kernel next runs it, which on a loaded machine can be after its killer's
  own exit."""
  import psutil  # pylint: disable=g-import-not-at-top  (Horovod's launcher needs it)
  deadline = time.time() + seconds
  while time.time() < deadline:
    try:
      if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
        return True
    except psutil.NoSuchProcess:
      return True
    time.sleep(0.1)
  return False


def rank_pid(launcher, rank):
  """The pid of training rank `rank` among the descendants of the launcher process
  (horovodrun or mpirun, a subprocess.Popen): never another job's process. Of a forked
  rank (rank_command), the pid its client was told."""
  import psutil  # pylint: disable=g-import-not-at-top  (Horovod's launcher needs it)
  for child in psutil.Process(launcher.pid).children(recursive=True):
    try:
      environ = child.environ()
      cmdline = child.cmdline()
    except psutil.Error:
      continue
    if RANKS_MODULE in cmdline and str(rank) in (
        environ.get("HOROVOD_RANK"), environ.get("OMPI_COMM_WORLD_RANK")):
      return _forked_pid(child)
  raise AssertionError("rank %d not found among the launcher's processes" % rank)


def _forked_pid(process):
  """The pid of the forked rank whose client is `process` (a psutil.Process), or its own
  where it is not a client or ran the command itself."""
  import psutil  # pylint: disable=g-import-not-at-top
  deadline = time.time() + 60
  while time.time() < deadline:
    try:
      cmdline = process.cmdline()
    except psutil.Error:
      raise AssertionError("rank process %d ended" % process.pid)
    if cmdline[1:3] != [FORKED_RUNS, "--rank"]:
      return process.pid
    try:
      with open("%s-%d.pid" % (cmdline[3], process.pid)) as f:
        return int(f.read())
    except OSError:
      time.sleep(0.1)
  raise AssertionError("rank client %d told no pid within 60 s" % process.pid)


@pytest.fixture
def small_disk(tmp_path):
  """A 4 MB tmpfs mounted for the test, unmounted afterwards."""
  mount_point = tmp_path / "disk"
  mount_point.mkdir()
  try:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                   check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                   universal_newlines=True)
  except (OSError, subprocess.CalledProcessError) as e:
    pytest.skip("cannot mount a tmpfs to fill (%s); needs root and CAP_SYS_ADMIN"
                % getattr(e, "output", e))
  try:
    yield mount_point
  finally:
    subprocess.call(["umount", str(mount_point)])
