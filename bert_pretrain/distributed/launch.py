"""The launch plan of run_multi_card_FPS.sh: hosts, ranks per host and the launcher's words.

The number of ranks per host (IX_NUM_CUDA_VISIBLE_DEVICES, as in the anchor recipe) comes from
the script; the hosts come from HOROVOD_RUN_ARGS (`-H h1:8,h2:8`, `-H h1,h2`, `--hosts=...`,
`--hostfile F` in Horovod's format `host slots=N`). The plan gives horovodrun a total -np and
a host list that agree with each other and with the count per host; any contradiction is an
error before anything starts. horovodrun (or mpirun under it) does the launching.

With DISTRIBUTION (the script's environment variable; --distribution of run_pretraining)
mirrored, one process drives the cards of this host: no launcher. With
multi_worker_mirrored, one process per host: on one host no launcher either; on several,
horovodrun starts one process per host (it only starts them: TensorFlow's collectives do
the all-reduce) and TF_CONFIG names the workers, host:MULTI_WORKER_PORT each, in the
order of the host list, which is also the order of the ranks that give each its index.

  python3 -m bert_pretrain.distributed.launch PER_HOST [DISTRIBUTION]
prints the summary line, then the launcher's words one a line (none for one process),
with HOROVOD_RUN_ARGS and MULTI_WORKER_PORT read from the environment; on a contradiction
it prints a one-line error and exits 2.

  python3 -m bert_pretrain.distributed.launch run COMMAND...
runs the script's command: horovodrun in this process (Horovod's own run_commandline), so
that a job a rank failed ends with that rank's one-line error and its exit status, where
horovodrun --gloo would end with its RuntimeError's traceback, and a signal reaches the
ranks without horovodrun's 5 s or mpirun's limits (StopRanksFirst; with --mpi, horovodrun
runs in a child that becomes mpirun); any other command replaces this process.
"""

import collections
import contextlib
import copy
import functools
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from bert_pretrain import errors
from bert_pretrain import processes
from bert_pretrain.distributed import horovodrun as horovodrun_lib

Plan = collections.namedtuple("Plan", ["ranks", "hosts", "per_host", "args"])
# The engines the script launches (run_pretraining's --distribution, but "none").
DISTRIBUTIONS = ("horovod", "mirrored", "multi_worker_mirrored")
MULTI_WORKER_PORT = 12345  # TF_CONFIG's port of every worker, unless MULTI_WORKER_PORT.
# Set by run for every process it starts (horovodrun and mpirun pass the environment on):
# a demo's processes name their one output folder with it.
LAUNCH_ID_VARIABLE = "BERT_PRETRAIN_LAUNCH_ID"
# Set for run_pretraining --check_only run before a job's ranks: the job's processes
# (horovodrun's -np), whose global batch a resumed --output_dir must have.
CHECK_PROCESSES_VARIABLE = "BERT_PRETRAIN_CHECK_PROCESSES"
# mpirun passes a signal on to the ranks after odls_base_sigkill_timeout seconds and kills
# them as long again later: its own 1 s leaves a rank no time to finish an update and save.
# A value the user set (environment, --mpi-args) wins.
MPI_SIGKILL_TIMEOUT_S = 10
# Ranks a host runs at most: more is a mistyped count (a process each would swamp it).
MAX_RANKS_A_HOST = 1024
# The signals that stop a job (StopRanksFirst).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _stops_taken():
  """The stop signals the launcher takes: SIGTERM and SIGINT always, as a single run does
  (a script's `&` starts its job with SIGINT ignored, and a kill -INT to it is meant);
  SIGHUP unless ignored (nohup's way to outlive the terminal)."""
  return [signum for signum in _STOP_SIGNALS
          if signum != signal.SIGHUP or signal.getsignal(signum) != signal.SIG_IGN]

# horovodrun --gloo kills its host's ranks 5 s after it passes a signal on (Horovod's fixed
# grace), mpirun after its odls_base_sigkill_timeout, and a second signal within 5 s makes
# mpirun exit at once: the launcher signals those ranks itself and hands the signal to
# horovodrun or mpirun only this much later (or at a second one).
STOP_GRACE_S = 120
# Set for each rank by horovodrun --gloo, Open MPI's mpirun (with the job's PMIx namespace:
# a launcher itself under mpirun has its own), MPICH's (ranks_of_this_host).
_RANK_VARIABLES = ("HOROVOD_RANK", "HOROVOD_GLOO_RENDEZVOUS_PORT", "OMPI_COMM_WORLD_RANK",
                   "PMIX_NAMESPACE", "PMI_RANK")
# mpirun takes a second signal within 5 s as "exit now", leaving its ranks running.
MPIRUN_REPEAT_S = 6
# How long mpirun has slept, its ranks on this host ended and their output read, before
# the launcher ends it.
MPIRUN_SETTLE_S = 1

_HOST = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*)(?::([0-9]+))?$")
_OPTIONS = {"-H": "hosts", "--hosts": "hosts", "--hostfile": "hostfile",
            "-np": "np", "--num-proc": "np"}


# horovodrun's controllers, and options that only MPI takes: with any of them the
# controller is the user's, else --gloo goes in front.
_NOT_GLOO = ("--gloo", "--mpi", "--jsrun", "--binding-args")


class LaunchError(ValueError):
  """A host list that contradicts itself or the count per host; the text names the fix."""


def _option_key(name):
  """"hosts", "hostfile" or "np" for horovodrun's names of them, with its single-dash
  -hostfile and the abbreviations its argument parser takes (--num-p, --hostf); else None."""
  if name in _OPTIONS:
    return _OPTIONS[name]
  if name == "-hostfile" or (name.startswith("--hostf") and "--hostfile".startswith(name)):
    return "hostfile"
  if name.startswith("--num-p") and "--num-proc".startswith(name):
    return "np"
  return None


def _split_options(run_args):
  """Takes -H/--hosts, --hostfile and -np/--num-proc (`-H X`, `-H=X`, `--hosts=X`, and
  _option_key's other spellings) out of run_args; returns ({"hosts"|"hostfile"|"np":
  value}, the other arguments in order)."""
  found, rest, i = {}, [], 0
  while i < len(run_args):
    arg = run_args[i]
    name, value = arg.split("=", 1) if "=" in arg else (arg, None)
    key = _option_key(name)
    if key is None:
      rest.append(arg)
      i += 1
      continue
    if value is None:
      if i + 1 >= len(run_args):
        raise LaunchError("%s in HOROVOD_RUN_ARGS has no value; give it one, e.g. "
                          "-H h1:8,h2:8 or --hostfile hosts.txt" % name)
      value = run_args[i + 1]
      i += 1
    if key in found or (key in ("hosts", "hostfile") and ("hosts" in found or "hostfile" in found)):
      raise LaunchError("HOROVOD_RUN_ARGS gives the hosts or -np twice (%s); keep one -H or "
                        "one --hostfile, and at most one -np" % name)
    found[key] = value
    i += 1
  return found, rest


def _parse_host(spec, where):
  """'h1' or 'h1:8' -> ('h1', None) or ('h1', 8)."""
  match = _HOST.match(spec)
  if not match or (match.group(2) or "1").startswith("0"):
    raise LaunchError("bad host %r in %s; write host or host:slots with slots >= 1, "
                      "e.g. -H h1:8,h2:8" % (spec, where))
  return match.group(1), int(match.group(2)) if match.group(2) else None


def read_hostfile(path):
  """Hosts of a Horovod hostfile: lines `host` or `host slots=N`, # comments.

  Args:
    path: the file.

  Returns:
    list of (host, slots or None).

  Raises:
    LaunchError: unreadable, empty, or a line in another format.
  """
  try:
    with open(path) as f:
      lines = f.read().splitlines()
  except (IOError, OSError, UnicodeDecodeError) as e:
    raise LaunchError("cannot read the hostfile %s (%s); give --hostfile a readable file of "
                      "lines 'host slots=N'" % (path, getattr(e, "strerror", None) or e))
  hosts = []
  for number, line in enumerate(lines, 1):
    words = line.split("#", 1)[0].split()
    if not words:
      continue
    where = "hostfile %s line %d" % (path, number)
    if len(words) > 2 or (len(words) == 2 and not re.match(r"^slots=[0-9]+$", words[1])):
      raise LaunchError("bad line %r in %s; write 'host slots=N' or 'host'" % (line, where))
    spec = words[0] if len(words) == 1 else "%s:%s" % (words[0], words[1][len("slots="):])
    hosts.append(_parse_host(spec, where))
  if not hosts:
    raise LaunchError("the hostfile %s lists no host; write one line 'host slots=N' per "
                      "machine" % path)
  return hosts


def plan(run_args, per_host, distribution="horovod"):
  """The job horovodrun is to start.

  Args:
    run_args: list of str, HOROVOD_RUN_ARGS split like a shell does (e.g. ["--gloo", "-H",
      "h1:8,h2:8"]); no hosts means this machine alone (localhost).
    per_host: int, ranks (cards) per host.
    distribution: "horovod" (a process per card), "mirrored" (one process, one host) or
      "multi_worker_mirrored" (a process per host).

  Returns:
    Plan(ranks=total ranks (cards), hosts=list of host names, per_host,
    args=horovodrun's arguments: -np PROCESSES -H h1:C,h2:C (C: processes per host),
    then the other arguments of run_args in their order).

  Raises:
    LaunchError: bad host specs, an unreadable or empty hostfile, slots that differ from
      per_host, hosts given twice, -np that differs from the total.
  """
  found, rest = _split_options(run_args)
  if "hostfile" in found:
    hosts = read_hostfile(found["hostfile"])
    where = "the hostfile %s" % found["hostfile"]
  elif "hosts" in found:
    where = "-H %s" % found["hosts"]
    hosts = [_parse_host(spec, where) for spec in found["hosts"].split(",")]
  else:
    hosts, where = [("localhost", None)], None
  names = [host for host, _ in hosts]
  for host, slots in hosts:
    if names.count(host) > 1:
      raise LaunchError("host %s is listed twice in %s; list every machine once" % (host, where))
    if slots is not None and slots != per_host:
      raise LaunchError("host %s has %d slots in %s but the count per host is %d "
                        "(IX_NUM_CUDA_VISIBLE_DEVICES, else the entries of CUDA_VISIBLE_DEVICES); "
                        "export IX_NUM_CUDA_VISIBLE_DEVICES=%d or give %s"
                        % (host, slots, where, per_host, slots,
                           "%s slots=%d" % (host, per_host) if "hostfile" in found else
                           "%s:%d" % (host, per_host)))
  ranks = per_host * len(hosts)
  if "np" in found and found["np"] != str(ranks):
    raise LaunchError("-np %s in HOROVOD_RUN_ARGS but %d host%s x %d per host = %d ranks; "
                      "drop -np (the script computes it) or change the hosts"
                      % (found["np"], len(hosts), "s" * (len(hosts) > 1), per_host, ranks))
  if distribution == "mirrored" and len(names) > 1:
    raise LaunchError("DISTRIBUTION=mirrored drives the cards of one host but %s names %d; "
                      "use DISTRIBUTION=multi_worker_mirrored or horovod for several hosts"
                      % (where, len(names)))
  slots = per_host if distribution == "horovod" else 1
  host_list = ",".join("%s:%d" % (host, slots) for host in names)
  return Plan(ranks, names, per_host,
              ["-np", str(slots * len(names)), "-H", host_list] + rest)


def names_hosts(run_args):
  """Whether HOROVOD_RUN_ARGS names the hosts (else the job is this host's alone)."""
  return bool({"hosts", "hostfile"} & set(_split_options(run_args)[0]))


def check_this_host(per_host, cards, cores, hidden=False, visible=None):
  """Raises LaunchError when a job on this host alone asks for more cards than it has:
  more than the cards listed, or with none listed or all hidden, more CPU ranks than cores.

  Args:
    per_host: int, the ranks (cards) asked for.
    cards: Cards, those listed here (listed_cards; count 0: none).
    cores: int, this host's cores.
    hidden: an empty CUDA_VISIBLE_DEVICES, or -1, hides the cards: the ranks run on the CPU.
    visible: CUDA_VISIBLE_DEVICES when its entries give the count (None: the count is
      IX_NUM_CUDA_VISIBLE_DEVICES's).
  """
  asked = "CUDA_VISIBLE_DEVICES=%s" % visible if visible else "IX_NUM_CUDA_VISIBLE_DEVICES"
  if hidden and cards.count and per_host > cores:
    raise LaunchError("%d CPU ranks asked for (IX_NUM_CUDA_VISIBLE_DEVICES) on a host of %d "
                      "cores: CUDA_VISIBLE_DEVICES is empty (or -1), which hides the %d cards %s "
                      "lists; unset CUDA_VISIBLE_DEVICES to train on them, or export "
                      "IX_NUM_CUDA_VISIBLE_DEVICES=%d or fewer"
                      % (per_host, cores, cards.count, cards.lister, cores))
  if cards.count and per_host > cards.count and not hidden:
    raise LaunchError("%d cards asked for (%s) but %s lists %d on this host; export %s"
                      % (per_host, asked, cards.lister, cards.count,
                         "a CUDA_VISIBLE_DEVICES of %d cards or fewer" % cards.count
                         if visible else
                         "IX_NUM_CUDA_VISIBLE_DEVICES=%d or fewer" % cards.count))
  if not cards.count and per_host > cores:
    raise LaunchError("%d CPU ranks asked for (%s) on a host of %d cores where neither "
                      "nvidia-smi nor ixsmi lists a GPU: each would get less than a core; "
                      "%sexport IX_NUM_CUDA_VISIBLE_DEVICES=%d or fewer, or name the host "
                      "to oversubscribe anyway: HOROVOD_RUN_ARGS=\"--gloo -H localhost:%d\""
                      % (per_host, asked, cores,
                         "unset CUDA_VISIBLE_DEVICES and " if visible else "", cores, per_host))


def check_card_list(visible, cards):
  """Raises LaunchError when CUDA_VISIBLE_DEVICES (visible) names a card index this host
  lacks: CUDA would hide every card from it on, and the ranks would share the rest.

  Args:
    visible: the CUDA_VISIBLE_DEVICES value, checked for syntax by the script.
    cards: Cards, those listed here (count 0: none listed, nothing to check against;
      with MIG slices counted, an index is checked against at least the GPUs).
  """
  indexes = [int(e) for e in visible.split(",") if e.strip().isdigit()]
  missing = [i for i in indexes if i >= cards.count]
  if cards.count and missing:
    raise LaunchError("CUDA_VISIBLE_DEVICES=%s names card %d but %s lists %d on this host "
                      "(from 0); CUDA would hide every card from it on and ranks would share "
                      "the rest; export cards it has, e.g. CUDA_VISIBLE_DEVICES=%s"
                      % (visible, missing[0], cards.lister, cards.count,
                         ",".join(str(i) for i in range(min(len(indexes), cards.count)))))


# The cards a host lists, and the tool that listed them.
Cards = collections.namedtuple("Cards", ["count", "lister"])


def listed_cards():
  """The cards `nvidia-smi -L`, else Iluvatar's `ixsmi -L` (which lists as nvidia-smi
  does), lists on this host: each GPU, or the MIG slices listed under it when it is
  split. Cards(0, None) when neither lists one."""
  for lister in ("nvidia-smi", "ixsmi"):
    try:
      listing = subprocess.run([lister, "-L"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, universal_newlines=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
      continue
    if listing.returncode != 0:
      continue
    slices = []  # per GPU, its MIG slices
    for line in listing.stdout.splitlines():
      if line.startswith("GPU "):
        slices.append(0)
      elif line.strip().startswith("MIG ") and slices:
        slices[-1] += 1
    if slices:
      return Cards(sum(max(count, 1) for count in slices), lister)
  return Cards(0, None)


def launcher(job, distribution="horovod", port=MULTI_WORKER_PORT):
  """The words that start the job before `python3 -m ...`: horovodrun and its arguments,
  with TF_CONFIG for several multi_worker_mirrored hosts; none for one process."""
  if distribution == "horovod":
    return ["horovodrun"] + job.args
  if len(job.hosts) == 1:
    return []
  workers = ["%s:%d" % (host, port) for host in job.hosts]
  tf_config = json.dumps({"cluster": {"worker": workers}}, separators=(",", ":"))
  return ["env", "TF_CONFIG=" + tf_config, "horovodrun"] + job.args


def summary(job, distribution="horovod", cpu=False):
  """'Launching 16 ranks on 2 hosts (8 per host)', or for TensorFlow's engines 'Launching
  2 processes on 2 hosts, each driving 8 cards (multi_worker_mirrored)' (cpu: a job on
  this host alone, which has no card to drive)."""
  hosts = "%d host%s" % (len(job.hosts), "" if len(job.hosts) == 1 else "s")
  if distribution == "horovod":
    return "Launching %d rank%s on %s (%d per host)" % (
        job.ranks, "" if job.ranks == 1 else "s", hosts, job.per_host)
  if cpu and distribution == "mirrored":  # the script passes --cpu_devices
    return "Launching 1 process driving %d logical CPU device%s (mirrored)" % (
        job.per_host, "" if job.per_host == 1 else "s")
  if cpu:
    return "Launching 1 process, one replica on this host's CPU (%s)" % distribution
  cards = "%d card%s (%s)" % (job.per_host, "" if job.per_host == 1 else "s", distribution)
  if len(job.hosts) == 1:
    return "Launching 1 process driving %s" % cards
  return "Launching %d processes on %s, each driving %s" % (len(job.hosts), hosts, cards)


def ranks_of_this_host():
  """The processes of the ranks started on this host below this one, by horovodrun --gloo
  or by mpirun: those whose rank variables (_RANK_VARIABLES) are set and differ from their
  parent's (horovodrun and mpirun set them for each rank; an ssh to another host's rank
  has none of its own, a rank's own children have their parent's)."""
  import psutil  # pylint: disable=g-import-not-at-top  (Horovod's dependency)

  def job_of(process):
    try:
      environ = process.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
      return None
    return tuple(environ.get(name) for name in _RANK_VARIABLES)

  ranks = []
  for process in psutil.Process().children(recursive=True):
    try:
      parent = process.parent()
    except psutil.NoSuchProcess:
      continue
    job = job_of(process)
    if job and any(job) and parent is not None and job != job_of(parent):
      ranks.append(process)
  return ranks


class StopRanksFirst(object):
  """The launcher's handler of SIGTERM, SIGINT and SIGHUP: the first goes to this host's
  ranks as SIGTERM, which stop after the update they are in, save and exit (the ranks of
  other hosts stop with them: they agree on the step). end_now(), the launcher's own end
  of the job, runs only STOP_GRACE_S later, at a signal one second or more after the
  first (a rank's own rule for "now"), or alone_s after the signal when this host runs no
  rank. ranks_ended(outputs), if given, runs in a thread of its own once the ranks it
  signalled have ended; outputs: where they wrote (processes.output_of)."""

  def __init__(self, end_now, alone_s=0, ranks_ended=None):
    self.end_now, self.alone_s, self.ranks_ended = end_now, alone_s, ranks_ended
    self.signum = None  # the first signal
    self.first = None  # and when it came (time.monotonic)
    self.timer = None

  def __call__(self, signum, unused_frame):
    try:
      if self.signum is not None:
        if time.monotonic() - self.first >= 1:
          self.end_now()
        return
      self.signum, self.first = signum, time.monotonic()
      ranks = ranks_of_this_host()
      # Where they write, while they still run (processes.output_of).
      outputs = [processes.output_of(rank.pid) for rank in ranks] if self.ranks_ended else []
      for rank in ranks:
        try:
          rank.send_signal(signal.SIGTERM)
        except Exception:  # pylint: disable=broad-except  (it has just ended)
          pass
      if not ranks and not self.alone_s:
        self.end_now()
        return
      self.timer = threading.Timer(STOP_GRACE_S if ranks else self.alone_s, self.end_now)
      self.timer.daemon = True
      self.timer.start()
      if ranks and self.ranks_ended and None not in outputs:
        threading.Thread(target=self._wait_ranks, args=(ranks, set().union(*outputs)),
                         daemon=True).start()
    except Exception:  # pylint: disable=broad-except  (not into the launcher's wait)
      self.end_now()

  def _wait_ranks(self, ranks, outputs):
    import psutil  # pylint: disable=g-import-not-at-top  (Horovod's dependency)

    def ended(rank):  # a zombie too: mpirun may reap its ranks only when it ends
      try:
        return not rank.is_running() or rank.status() == psutil.STATUS_ZOMBIE
      except psutil.NoSuchProcess:
        return True
    while not all(ended(rank) for rank in ranks):
      time.sleep(0.2)
    self.ranks_ended(outputs)

  def cancel(self):
    if self.timer is not None:
      self.timer.cancel()


@contextlib.contextmanager
def ranks_stop_before_horovodrun_ends_them():
  """Within: horovodrun --gloo (run in this process) takes SIGTERM, SIGINT and SIGHUP
  through StopRanksFirst, whose end_now is horovodrun's own end of the job (SIGTERM to the
  ranks, and SIGKILL 5 s later); the block gets the list of them (one per horovodrun run).
  A Horovod without the hook (gloo_run.register_shutdown_event) keeps its own handling."""
  try:
    from horovod.runner import gloo_run  # pylint: disable=g-import-not-at-top
  except ImportError:
    gloo_run = None
  register = getattr(gloo_run, "register_shutdown_event", None)
  previous, stops = {}, []
  if register is None:
    yield stops
    return

  def register_passing_on():
    shutdown = threading.Event()  # set: horovodrun ends every rank
    stops.append(StopRanksFirst(shutdown.set))
    for signum in _stops_taken():
      previous[signum] = signal.signal(signum, stops[-1])
    return shutdown

  gloo_run.register_shutdown_event = register_passing_on
  try:
    yield stops
  finally:
    gloo_run.register_shutdown_event = register
    for stop in stops:
      stop.cancel()
    for signum, handler in previous.items():
      signal.signal(signum, handler)


@contextlib.contextmanager
def shell_execs_its_command():
  """Within: an os.execve of `/bin/sh -c COMMAND` runs `exec COMMAND`. horovodrun --mpi
  (and --jsrun) replaces its process with `sh -c "mpirun ..."`, whose shell would take a
  signal passed on to it and die, leaving mpirun and the ranks training; with exec,
  mpirun is the process and passes the signal on to the ranks."""
  execve = os.execve

  def execve_exec(path, args, env):
    args = list(args)
    if len(args) >= 3 and args[1] == "-c" and os.path.basename(args[0]) == "sh":
      args[2] = "exec " + args[2]
    sys.stdout.flush()  # what horovodrun printed, before the process is replaced
    sys.stderr.flush()
    execve(path, args, env)

  os.execve = execve_exec
  try:
    yield
  finally:
    os.execve = execve


def _asleep_with_output_read(child, outputs):
  """Waits until mpirun (child(): its pid, None once it ended) has been in one sleep for
  MPIRUN_SETTLE_S with nothing in `outputs` (processes.output_of's) left unread; returns
  True then, False when it ended first."""
  idle_since, asleep = time.monotonic(), None
  while True:
    pid = child()
    if pid is None:
      return False
    # unread_output is None when it cannot be told: never asleep then.
    now = processes.sleeping(pid) if processes.unread_output(pid, outputs) == 0 else None
    if now is None or now != asleep:
      idle_since, asleep = time.monotonic(), now
    elif time.monotonic() - idle_since >= MPIRUN_SETTLE_S:
      return True
    time.sleep(0.2)


def _wait_until_ended(child):
  """Returns once the child process has ended, leaving it unreaped. Polled: a blocking
  wait would act on a signal the kernel gave another thread, or one that came as the wait
  began, only after the child."""
  while os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
    time.sleep(0.2)


def run_mpirun_in_child(body, alone=False):
  """Runs body(), horovodrun --mpi, which becomes mpirun, in a child process of its own
  process group and returns its exit status: 128 + the signal that ended it, or that
  this process got before it failed (mpirun exits with 1 after passing a signal on, or
  passes on the ranks' 143). This process takes SIGTERM, SIGINT and SIGHUP through
  StopRanksFirst, whose end_now passes the first of them on to mpirun, once (when this
  host runs no rank, MPIRUN_REPEAT_S after the signal): mpirun SIGTERMs the ranks after
  its odls_base_sigkill_timeout and kills them as long again later, and at a second
  signal within 5 s it exits at once and leaves its ranks running. A signal to every
  process of the job (a scheduler's) thus reaches mpirun once. The child gets
  SIGTERM if this process ends first (SIGKILL, say), and its standard input is /dev/null:
  outside the terminal's foreground group, reading it would stop it.
  With alone, once the ranks the signal stopped have ended, mpirun is killed when it is
  asleep with their output read (_asleep_with_output_read): it sleeps through its
  odls_base_sigkill_timeout once a rank that ended with 143, with nothing left to end.

  Args:
    body: a callable returning an exit status, or replacing its process (execve).
    alone: whether every rank of the job runs on this host.
  """
  state = {"child": None, "passed": False, "cut": False}
  lock = threading.Lock()  # held: passing on, or the child has ended

  def pass_on():  # from the handler or the grace's timer
    if not lock.acquire(False):
      return
    try:
      if state["child"] is not None and not state["passed"]:
        state["passed"] = True
        os.kill(state["child"], stop.signum)
    except OSError:  # it has just ended
      pass
    finally:
      lock.release()

  def cut_short(outputs):  # from StopRanksFirst's thread, once the ranks it signalled ended
    if not _asleep_with_output_read(lambda: state["child"], outputs):
      return
    with lock:
      if state["child"] is not None:
        try:
          os.killpg(state["child"], signal.SIGKILL)
          state["cut"] = True
        except OSError:  # it has just ended
          pass

  stop = StopRanksFirst(pass_on, alone_s=MPIRUN_REPEAT_S,
                        ranks_ended=cut_short if alone else None)
  caught = _stops_taken()  # held back until the child's pid is known
  mask = signal.pthread_sigmask(signal.SIG_BLOCK, caught)
  previous = {signum: signal.signal(signum, stop) for signum in caught}
  parent = os.getpid()
  child = os.fork()
  if child == 0:
    status = 1
    try:
      for signum in caught:
        signal.signal(signum, signal.SIG_DFL)
      os.setpgid(0, 0)
      processes.end_with_parent(parent)  # the job ends with a killed launcher
      signal.pthread_sigmask(signal.SIG_SETMASK, mask)
      os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
      status = body()
    except SystemExit as e:
      if e.code is None or isinstance(e.code, int):
        status = e.code or 0
      else:
        print(e.code, file=sys.stderr)
    except BaseException:  # pylint: disable=broad-except  (the child must not return)
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
    finally:
      try:
        sys.stdout.flush()
        sys.stderr.flush()
      finally:
        os._exit(status)  # pylint: disable=protected-access
  try:
    os.setpgid(child, child)  # as the child does: whichever runs first
  except OSError:  # it has done so and exec'd
    pass
  state["child"] = child
  signal.pthread_sigmask(signal.SIG_SETMASK, mask)
  try:
    _wait_until_ended(child)
    with lock:
      state["child"] = None  # once reaped, its pid may be another process's
    _, status = os.waitpid(child, 0)
  finally:
    state["child"] = None
    stop.cancel()
    for signum, handler in previous.items():
      signal.signal(signum, handler)
  if state["cut"]:
    return 128 + stop.signum
  if os.WIFSIGNALED(status):
    return 128 + os.WTERMSIG(status)
  if os.WEXITSTATUS(status) and stop.signum:
    return 128 + stop.signum
  return os.WEXITSTATUS(status)


def check_training_flags(words):
  """Parses the words after `bert_pretrain.run_pretraining` in words as a rank will
  (absl), so that what every rank would refuse is told once, before any starts: a
  horovodrun option given to the script, a misspelt flag, a bad value, a stray word.
  Other unknown names are left to the ranks, which also know the flags TensorFlow
  defines; so are --flagfile (read where the ranks run) and the help flags.

  Returns:
    the parsed flags (absl's FlagValues), None when they are left to the ranks.

  Raises:
    LaunchError: what is wrong, and the fix.
  """
  if "bert_pretrain.run_pretraining" not in words:
    return None
  args = list(words[words.index("bert_pretrain.run_pretraining") + 1:])
  names = [word.split("=", 1)[0].lstrip("-") for word in args if word.startswith("-")]
  if set(names) & {"?", "help", "helpshort", "helpfull", "helpxml", "flagfile"}:
    return None
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top,unused-import
  from bert_pretrain import config  # pylint: disable=g-import-not-at-top
  app.define_help_flags()
  values = flags.FlagValues()
  copied = [flag for module, module_flags in flags.FLAGS.flags_by_module_dict().items()
            if module.startswith("absl.") for flag in module_flags]
  for flag in copied:  # absl's own (--verbosity, --pdb, ...), as a rank's
    values[flag.name] = copy.deepcopy(flag)  # parsed here without setting them
  config.define_pretraining_flags(values)
  # An alias's copy (--pdb) parses into the process's own flag: restored below.
  saved = [(flag, flag.value, flag.present) for flag in copied]
  try:
    rest = values(["run_pretraining"] + args)[1:]
  except flags.UnrecognizedFlagError as e:
    message = _unknown_flag_text(e.flagname, args, str(e))
    if message:
      raise LaunchError(message)
    return None
  except flags.Error as e:
    raise LaunchError("%s; pass a value of the flag's type (run_pretraining --helpfull lists "
                      "them)" % str(e).splitlines()[0])
  finally:
    for flag, value, present in saved:
      flag.value, flag.present = value, present
  if rest:
    raise LaunchError(errors.unexpected_arguments_text(rest))
  # horovodrun starts one process a host for multi_worker_mirrored, with TF_CONFIG.
  started = ("none", "horovod") + (("multi_worker_mirrored",) if any(
      word.startswith("TF_CONFIG=") for word in words) else ())
  if "horovodrun" in words and values.distribution not in started:
    raise LaunchError("--distribution=%s runs one process, but the script starts Horovod "
                      "ranks; set DISTRIBUTION=%s instead of passing --distribution"
                      % (values.distribution, values.distribution))
  return values


def check_settings_here(values):
  """Checks the settings that need no file nor host (inputs.check_settings: a batch of 0,
  say) of the parsed flags `values`, with the presets, as each rank will: for a job of
  other hosts, whose files, page cache and TF_CONFIG only they can check.

  Raises:
    LaunchError: what is wrong, and the fix.
  """
  from bert_pretrain import config  # pylint: disable=g-import-not-at-top
  from bert_pretrain.training import inputs as inputs_lib  # pylint: disable=g-import-not-at-top
  try:
    config.apply_presets(values)
    config.apply_anchor_flags(log=lambda line: None, flag_values=values)
    inputs_lib.check_settings(config.settings_from_flags(values), here=False)
  except ValueError as e:
    raise LaunchError(str(e))


def job_on_this_host(words):
  """Whether every host the launcher's -H names (plan() names every host so, this one as
  localhost) is this one, in the command's words before run_pretraining's."""
  end = (words.index("bert_pretrain.run_pretraining")
         if "bert_pretrain.run_pretraining" in words else len(words))
  hosts = [spec.split(":")[0] for before, word in zip(words[:end], words[1:end])
           if before == "-H" for spec in word.split(",")]
  return all(host in ("localhost", "127.0.0.1", socket.gethostname()) for host in hosts)


def check_inputs_here(words):
  """Runs a rank's own checks of its settings, files and --output_dir (run_pretraining
  --check_only) once in this process's environment with the command's `env NAME=VALUE`
  words, when the command's processes all run on this host. Returns its exit status (None
  when there is nothing to check here)."""
  if "bert_pretrain.run_pretraining" not in words:
    return None
  start = words.index("bert_pretrain.run_pretraining")
  env, after = dict(os.environ), None
  for word in words[:start]:
    if after == "-np" and "horovodrun" in words[:start] and word.isdigit():
      env[CHECK_PROCESSES_VARIABLE] = word
    elif after == "env" and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word):
      name, value = word.split("=", 1)
      env[name] = value
      continue
    after = word
  if not job_on_this_host(words):
    return None
  # The ranks' own interpreter (python3 -m ...); its errors are one line on stderr.
  python = (words[start - 2:start] if start >= 2 and words[start - 1] == "-m" else
            [sys.executable, "-m"])
  # A session of its own: a Ctrl-C in its first seconds (TensorFlow's import) would print
  # a traceback; this process says it (main) and ends the check, which writes nothing.
  # Any other end of this process ends it too, without a word of its own (SIGKILL).
  return processes.run(python + words[start:] + ["--check_only"], env=env,
                       stdout=subprocess.DEVNULL, start_new_session=True,
                       preexec_fn=functools.partial(processes.end_with_parent, os.getpid(),
                                                    signal.SIGKILL)).returncode


def _unknown_flag_text(name, args, absl_message):
  """The message for flag `name` that run_pretraining's own flags do not define: where
  it goes when it is horovodrun's, else that run_pretraining has no such flag (with
  absl's guesses); "" for one of TensorFlow's flags, which the ranks also take."""
  takes_value = dict.fromkeys(_NOT_GLOO, False)
  takes_value.update(dict.fromkeys(list(_OPTIONS) + ["--binding-args"], True))
  takes_value.update(horovodrun_options())
  for index, word in enumerate(args):
    option = word.split("=", 1)[0]
    if option.lstrip("-") == name and option in takes_value:
      words = [word]
      if "=" not in word and takes_value[option] and index + 1 < len(args):
        words.append(args[index + 1])
      value = " ".join(shlex.quote(w) for w in words)
      # Double quotes read better around single-quoted words, where nothing expands.
      value = ('"%s"' % value if "'" in value and not re.search(r'["$`\\!]', value)
               else shlex.quote(value))
      return ("%s is horovodrun's, not run_pretraining's: pass it in HOROVOD_RUN_ARGS, "
              "e.g. HOROVOD_RUN_ARGS=%s" % (option, value))
  # Only now the imports of a rank (TensorFlow's flags: --delta_threshold is one).
  from absl import flags  # pylint: disable=g-import-not-at-top
  from bert_pretrain import run_pretraining  # pylint: disable=g-import-not-at-top,unused-import
  # Not a flag this process alone defines (a bench module's, say): a rank has none of those.
  known = {flag.name for module, module_flags in flags.FLAGS.flags_by_module_dict().items()
           if module.startswith(("absl.", "tensorflow.")) for flag in module_flags}
  if name in known or (name.startswith("no") and name[2:] in known):
    return ""
  return errors.unknown_flag_text("run_pretraining", name, args, absl_message)


# horovodrun's options that print something and start no job.
_NO_JOB = {"-h": "its help", "--help": "its help", "-v": "its version",
           "--version": "its version", "-cb": "its build check", "--check-build": "its build check"}


def check_horovodrun_args(args):
  """Raises LaunchError with horovodrun's own complaint about its arguments (`args`, as
  launcher() gives them: an option it does not know, --gloo with --mpi) in one line,
  before any rank starts, where its usage text would fill the screen; nothing where
  Horovod does not import here (its horovodrun then says it as the job starts)."""
  for option in args:  # before its parser, which runs --check-build's probes (seconds)
    if option in _NO_JOB:
      raise LaunchError("HOROVOD_RUN_ARGS has %s, which makes horovodrun print %s and start "
                        "no job; drop it%s" % (option, _NO_JOB[option], " (--verbose is its "
                                               "verbose option)" if option == "-v" else ""))
  try:
    from horovod.runner import launch as horovod_launch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  said, argv = io.StringIO(), sys.argv
  sys.argv = ["horovodrun"] + list(args) + ["python3"]  # the command's first word
  try:
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
      command = getattr(horovod_launch.parse_args(), "command", ["python3"])
    if not command:  # the last option took the command's first word as its value
      raise LaunchError("HOROVOD_RUN_ARGS ends with %s, which takes a value; give it one "
                        "or drop it" % [arg for arg in args if arg.startswith("-")][-1])
    if command != ["python3"]:  # a word before it (python3 itself, too) starts the command
      raise LaunchError("HOROVOD_RUN_ARGS has '%s', which is no option: horovodrun would "
                        "start it as the ranks' command; drop it%s" % (
                            command[0], " (or --%s?)" % command[0]
                            if "--" + command[0] in horovodrun_options() else ""))
  except SystemExit:
    complaint = (said.getvalue().strip().splitlines() or ["refused"])[-1]
    raise LaunchError("HOROVOD_RUN_ARGS: horovodrun says %s; horovodrun --help lists its "
                      "options" % complaint.replace("horovodrun: error: ", ""))
  except LaunchError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (its --config-file's, say)
    raise LaunchError("HOROVOD_RUN_ARGS: horovodrun cannot start with them: %s"
                      % (str(e).splitlines() or [type(e).__name__])[0])
  finally:
    sys.argv = argv


def horovodrun_options():
  """{option: whether it takes a value} of horovodrun's options (--network-interface NICS,
  --verbose, -p SSH_PORT, ...), read from its own --help, but its help; {} where Horovod
  does not import."""
  try:
    from horovod.runner import launch as horovod_launch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return {}
  text, argv = io.StringIO(), sys.argv
  sys.argv = ["horovodrun", "--help"]
  try:
    with contextlib.redirect_stdout(text):
      horovod_launch.parse_args()
  except SystemExit:
    pass
  finally:
    sys.argv = argv
  options = {}
  for option, metavar in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)(?: ([A-Z][A-Z0-9_]*))?",
                                    text.getvalue()):
    if option not in ("-h", "--help"):
      options[option] = options.get(option, False) or bool(metavar)
  return options


def run(words, dry_run=False):
  """Runs the script's command (words): horovodrun, after any `env NAME=VALUE` words, in
  this process (horovodrun.py); any other command replaces this process. Every process
  of the job gets the launch's time and this process's id in LAUNCH_ID_VARIABLE. Its
  flags are checked first, and its inputs where the job is this host's alone, before
  horovodrun starts any rank (a bad path is one line, not one per rank); with dry_run
  (DRY_RUN=1) that is all."""
  processes.arm_stacks()  # a launch that seems stuck: its stacks and its forks' (mpi_built)
  # Until horovodrun takes them: Ctrl-C and SIGTERM are main's one line (a script's `&`
  # starts this with SIGINT ignored, and a kill -INT to it is meant: _stops_taken).
  errors.take_stop_signals()
  try:
    values = check_training_flags(words)
  except LaunchError as e:
    errors.print_error("run_multi_card_FPS", e)
    return 2
  if dry_run or "horovodrun" in words:  # a single process checks its own inputs
    status = check_inputs_here(words)
    if status:
      return status
    try:
      if status is None and values is not None:
        check_settings_here(values)
    except LaunchError as e:
      errors.print_error("run_multi_card_FPS", e)
      return 2
    if dry_run:
      print("DRY_RUN=1: %s; nothing was started" % (
          "the flags check out (each host checks its files as the job starts)"
          if status is None else "the flags and run_pretraining --check_only on this host pass"))
      return 0
  os.environ[LAUNCH_ID_VARIABLE] = "%s-%d" % (time.strftime("%Y%m%d-%H%M%S"), os.getpid())
  env, program = {}, list(words)
  while program and program[0] == "env":
    program.pop(0)
    while program and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", program[0]):
      name, value = program.pop(0).split("=", 1)
      env[name] = value
  if program and program[0] == "horovodrun":
    try:
      from horovod.runner.launch import run_commandline  # pylint: disable=g-import-not-at-top
    except ImportError:  # horovodrun of another Python: it runs as it is.
      run_commandline = None
    if run_commandline is not None:
      os.environ.update(env)
      if "--gloo" in program:
        with ranks_stop_before_horovodrun_ends_them() as stops:
          launcher_stop = lambda: stops[-1].signum if stops else None  # noqa: E731
          status = horovodrun_lib.run_horovodrun(program[1:], run_commandline, launcher_stop)
        if status == 128 + signal.SIGTERM and launcher_stop():  # as under mpirun
          return 128 + launcher_stop()
        return status
      # Any other controller (--mpi, --jsrun) ends in its shell: mpirun in a child.
      os.environ.setdefault("OMPI_MCA_odls_base_sigkill_timeout", str(MPI_SIGKILL_TIMEOUT_S))

      def job():
        with shell_execs_its_command():
          return horovodrun_lib.run_horovodrun(program[1:], run_commandline)
      return run_mpirun_in_child(job, alone=job_on_this_host(program))
  os.execvp(words[0], list(words))
  return 1  # Not reached: execvp replaces this process or raises.


def main(argv):
  if len(argv) > 2 and argv[1] in ("run", "check"):
    try:
      return run(argv[2:], dry_run=argv[1] == "check")
    except KeyboardInterrupt as e:  # before horovodrun took the stops, or after
      return errors.stopped_by_signal("run_multi_card_FPS", e, "run the same command again")
  if argv[1:] == ["cards"]:  # for scripts/common.sh
    print("%d %s" % listed_cards())
    return 0
  if len(argv) not in (2, 3) or not re.match(r"^[1-9][0-9]*$", argv[1]):
    print("usage: python3 -m bert_pretrain.distributed.launch RANKS_PER_HOST [DISTRIBUTION]",
          file=sys.stderr)
    return 2
  distribution = argv[2] if len(argv) == 3 else "horovod"
  try:
    if int(argv[1]) > MAX_RANKS_A_HOST:
      raise LaunchError("%s ranks a host (IX_NUM_CUDA_VISIBLE_DEVICES, else the cards "
                        "listed) is more than a host runs (at most %d); export the number of "
                        "cards, or of CPU ranks, e.g. IX_NUM_CUDA_VISIBLE_DEVICES=8"
                        % (argv[1], MAX_RANKS_A_HOST))
    if distribution not in DISTRIBUTIONS:
      raise LaunchError("DISTRIBUTION=%s is not one of %s; unset it for Horovod"
                        % (distribution, ", ".join(DISTRIBUTIONS)))
    port = os.environ.get("MULTI_WORKER_PORT") or str(MULTI_WORKER_PORT)
    if not re.match(r"^[1-9][0-9]*$", port) or int(port) > 65535:
      raise LaunchError("MULTI_WORKER_PORT=%s is not a port; export a free TCP port, e.g. "
                        "MULTI_WORKER_PORT=%d" % (port, MULTI_WORKER_PORT))
    try:
      run_args = shlex.split(os.environ.get("HOROVOD_RUN_ARGS") or "--gloo")
    except ValueError as e:
      raise LaunchError("HOROVOD_RUN_ARGS cannot be split into arguments (%s); check its "
                        "quotes" % e)
    if not any(arg.startswith(_NOT_GLOO) for arg in run_args):
      # horovodrun alone picks MPI where its build has it: the default stays Gloo.
      run_args = ["--gloo"] + run_args
    job = plan(run_args, int(argv[1]), distribution)
    if launcher(job, distribution):
      check_horovodrun_args(job.args)
    # On this host alone: the cards listed must be here; a count given must fit (the
    # script's own default is within the host). An empty list, or -1, hides every card
    # (as CUDA reads them): CPU ranks.
    visible, cards = os.environ.get("CUDA_VISIBLE_DEVICES"), None
    hidden = visible is not None and visible.strip() in ("", "-1")
    if not names_hosts(run_args) and (visible or os.environ.get("IX_NUM_CUDA_VISIBLE_DEVICES")):
      cards = listed_cards()
      if not hidden and visible:
        check_card_list(visible, cards)
      check_this_host(job.per_host, cards, os.cpu_count() or 1, hidden=hidden,
                      visible=None if hidden else visible or None)
  except LaunchError as e:
    errors.print_error("run_multi_card_FPS", e)
    return 2
  cpu = distribution != "horovod" and not names_hosts(run_args) and (
      hidden or (not visible and (cards or listed_cards()).count == 0))
  print("\n".join([summary(job, distribution, cpu)] + launcher(job, distribution, int(port))))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
