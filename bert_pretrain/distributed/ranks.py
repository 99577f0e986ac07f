"""Who this process is in a job, and how the job's replicas talk: its rank among the
processes, its local rank on its host, the all-reduce of the chosen engine, and the watch
that names a rank that stalls.

Engines (--distribution):
- horovod (the default of run_multi_card_FPS.sh): one process per card, started by
  horovodrun or mpirun; Horovod all-reduces.
- mirrored: one process drives every card of its host (tf.distribute.MirroredStrategy),
  one replica per card.
- multi_worker_mirrored: one process per host, configured by TF_CONFIG as TensorFlow
  expects, each driving the cards of its host
  (tf.distribute.experimental.MultiWorkerMirroredStrategy; collective all-reduce).
- none: one card, rank 0 of 1.

The graph code is the same for all: it is built once per replica by each_replica() (under
scope()), reduces with all_reduce() and process_sum(), and the loop fetches merged().
"""

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
import warnings

import tensorflow.compat.v1 as tf

from bert_pretrain import errors
from bert_pretrain.distributed import stacks
from bert_pretrain.training import checkpoints
from bert_pretrain.training import logs
from bert_pretrain.training import timing

DISTRIBUTIONS = ("none", "horovod", "mirrored", "multi_worker_mirrored")

# The variables of the job's processes when launched by horovodrun or mpirun (also for
# multi_worker_mirrored, whose TF_CONFIG may leave the task to them).
RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")

# How long a worker waits in its parting collective (part()) once no peer is busy: a peer
# that passed it ends within a second or two.
PARTING_TIMEOUT_S = 10
# A heartbeat file's content once its rank has ended at an error: this, then the line.
ENDED = "ended at its error: "
# What a rank in part() is doing (its heartbeat says it).
PARTING = "the parting collective: every process passes it before any exits"


def launcher_rank():
  """This process's rank as the launcher (horovodrun, mpirun) set it, else None."""
  for name in RANK_VARIABLES:
    if os.environ.get(name, "").isdigit():
      return int(os.environ[name])
  return None


def launcher_size():
  """The number of processes the launcher (horovodrun, mpirun) started, 1 without one."""
  for name in SIZE_VARIABLES:
    if os.environ.get(name, "").isdigit():
      return int(os.environ[name])
  return 1


def multi_worker_config():
  """TF_CONFIG's cluster and this process's worker index, checked.

  TF_CONFIG is TensorFlow's: {"cluster": {"worker": ["host1:port", ...]}, "task":
  {"type": "worker", "index": i}}. Without "task" (run_multi_card_FPS.sh sets one
  TF_CONFIG for all hosts), the index is the launcher's rank. Without TF_CONFIG the job
  is this one process.

  Returns:
    (workers, index): the list of "host:port" and this process's place in it.

  Raises:
    ValueError: the one-line error for a TF_CONFIG that cannot work.
  """
  text = os.environ.get("TF_CONFIG", "")
  if not text.strip():
    return [], 0
  fix = ('; set TF_CONFIG=\'{"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
         '"task": {"type": "worker", "index": 0}}\' (the index differs per host)')
  try:
    config = json.loads(text)
    workers = list(config["cluster"]["worker"])
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError("TF_CONFIG is not a cluster of workers (%s: %s)%s"
                     % (type(e).__name__, e, fix))
  if set(config["cluster"]) - {"worker"}:
    raise ValueError("TF_CONFIG names jobs %s; --distribution=multi_worker_mirrored runs "
                     "workers only%s" % (sorted(config["cluster"]), fix))
  task = config.get("task") or {}
  index = task.get("index", launcher_rank())
  if task.get("type", "worker") != "worker" or not isinstance(index, int) or \
      not 0 <= index < len(workers):
    raise ValueError("TF_CONFIG's task %s is not one of its %d workers%s"
                     % (json.dumps(task) if task else "(none, and no launcher rank)",
                        len(workers), fix))
  return workers, index


def _check_one_process(distribution):
  """Raises ValueError when a launcher started several processes for an engine of one
  process (each would train alone as rank 0, in the same output_dir)."""
  for name in SIZE_VARIABLES:
    size = os.environ.get(name, "")
    if size.isdigit() and int(size) > 1:
      raise ValueError("the launcher started %s processes (%s) but --distribution=%s runs "
                       "one process%s; pass --horovod under horovodrun or mpirun, or start "
                       "one process (run_multi_card_FPS.sh: set DISTRIBUTION=%s instead of "
                       "passing --distribution)" % (size, name, distribution,
                                                   " without TF_CONFIG" if distribution ==
                                                   "multi_worker_mirrored" else "",
                                                   distribution))


def _update_from_first_replica(next_creator, **kwargs):
  """Variable creator: a mirrored variable that a replica assigns takes the first
  replica's value on every replica (all replicas compute the same update, from the
  same all-reduced gradients). Per-replica variables (ON_READ) are left alone."""
  if kwargs.get("synchronization") != tf.VariableSynchronization.ON_READ and \
      kwargs.get("aggregation") in (None, tf.VariableAggregation.NONE):
    kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
  return next_creator(**kwargs)


def _merge(*values):
  """One replica's value that waits for every replica's (see Ranks.merged)."""
  if all(v is values[0] for v in values):
    return values[0]  # The same for all: a placeholder, a shared variable or object.
  if isinstance(values[0], tf.Operation):
    return tf.group(*values)
  if isinstance(values[0], tf.Tensor):
    with tf.control_dependencies(values[1:]):
      return tf.identity(values[0])
  return values[0]


def _as_number(value):
  """A setting as a float that agree() can compare: numbers and bools as they are,
  anything else by a 52-bit hash of its JSON (exact in float64)."""
  if isinstance(value, (bool, int, float)):
    return float(value)
  text = json.dumps(value, sort_keys=True)
  return float(int(hashlib.sha256(text.encode()).hexdigest()[:13], 16))


def _shown(number, like):
  """A number of agree()'s rows as the setting `like` is written (an int as an int)."""
  if isinstance(like, bool):
    return str(bool(number)).lower()
  if isinstance(like, int) or float(number).is_integer():
    return "%d" % number
  return "%g" % number


class Ranks(object):
  """Who this process is: its rank among `size` processes, its local rank on the host,
  and `replicas`, the model replicas of the whole job (one per card: the global batch is
  train_batch_size x accumulation x replicas).

  With several processes and stall_timeout_s, a rank that stops taking part is named and
  the job ends instead of hanging. Two checks share the timeout:
  - Horovod's stall check (HOROVOD_STALL_CHECK_TIME_SECONDS, then
    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS; set here unless the user set them) lists the
    ranks that did not submit an all-reduce ("Missing ranks"), e.g. a rank stuck in I/O,
    and shuts Horovod down; the training loop then fails with a Horovod error. It runs
    under MPI; Horovod 0.28.1's Gloo controller did not run it in our tests.
  - A whole process stopped or frozen cannot answer the all-reduce, so Horovod's stall
    check never runs (MPI waits forever, Gloo times out without a rank) and TensorFlow's
    collectives wait. Each rank therefore rewrites a small file output_dir/.ranks/rank-N
    every few seconds from a thread; a rank that sees another's file unchanged for
    stall_timeout_s prints a one-line error naming it and exits with status 3. On several
    hosts this needs an output_dir all hosts see; otherwise only ranks of the same host
    are named. Before it exits, it writes what each rank of its host was doing (`doing`,
    the step and collective, and its Python stack) to output_dir/stall-rank-N.txt
    (stacks.py), as run_pretraining does when Horovod's stall check ends the job.
  - Peers that never come: agree(), the run's first collective, gives up after
    stall_timeout_s and names the processes without a heartbeat.
  - A rank that ends at an error writes its error line into its file (stop(error=...)):
    a peer that the stall check or a broken collective stops names it and its error
    rather than calling it stalled.

  Args:
    distribution: one of DISTRIBUTIONS (True: "horovod", False: "none").
    stall_timeout_s: seconds a rank may stay away (0: no stall checks).
    output_dir: the run's folder (for the .ranks files).
    program: the tool whose error lines this prints ("run_pretraining: error: ...").
    devices: with "mirrored", the devices of the replicas ("/gpu:0", ...; "/cpu:0",
      "/cpu:1" for logical CPUs of the session config, see cpu_devices).
  """

  def __init__(self, distribution="none", stall_timeout_s=0, output_dir=None, devices=None,
               program="run_pretraining"):
    if distribution is True or distribution is False:
      distribution = "horovod" if distribution else "none"
    self.distribution = distribution
    self.program = program
    self.hvd = None
    self.strategy = None
    self._workers = []  # multi_worker_mirrored: TF_CONFIG's "host:port" list.
    self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
    self.stall_timeout_s = stall_timeout_s
    self._folder = None
    self._interval = 1.0
    self._thread = None
    self._stop = threading.Event()
    self._seen = {}  # rank -> (file content, time it last changed)
    self._started = time.time()
    self._server = None  # multi_worker_mirrored: this worker's tf.distribute.Server
    self._config = None  # multi_worker_mirrored: the tf.ConfigProto of its sessions
    self._parting = threading.Lock()  # part(): its collective's end or its watch's, not both
    # What this rank does now ("update 12: ..."), in its heartbeat and stall report.
    self.doing = "starting"
    if distribution == "horovod":
      try:
        import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
      except ImportError as e:
        raise ValueError("--distribution=horovod needs Horovod with TensorFlow support (%s); "
                         "run bash init_tf.sh, or pass --distribution=mirrored (one host) or "
                         "multi_worker_mirrored" % e)
      if stall_timeout_s > 0:
        # Horovod reads these in init(); a user's own setting wins.
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS",
                              str(max(1, min(60, stall_timeout_s // 2))))
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(stall_timeout_s))
        # Gloo's own timeout ends a job with a frozen rank without naming it; the
        # watchdog below names it first.
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(stall_timeout_s + 30))
      hvd.init()
      self.hvd = hvd
      self.rank, self.size = hvd.rank(), hvd.size()
      self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
    elif distribution == "mirrored":
      _check_one_process(distribution)
      self.strategy = tf.distribute.MirroredStrategy(devices)
    elif distribution == "multi_worker_mirrored":
      self._workers, self.rank = multi_worker_config()
      if self._workers:
        # The strategy reads TF_CONFIG; the task may have come from the launcher.
        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": self._workers},
                                              "task": {"type": "worker", "index": self.rank}})
        self.size = len(self._workers)
        hosts = [w.rsplit(":", 1)[0] for w in self._workers]
        self.local_rank = hosts[:self.rank].count(hosts[self.rank])
        self.local_size = hosts.count(hosts[self.rank])
      else:
        _check_one_process(distribution)
      self.strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
    elif distribution == "none":
      _check_one_process(distribution)
    else:
      raise ValueError("--distribution=%s is not one of %s" % (distribution,
                                                              ", ".join(DISTRIBUTIONS)))
    self.replicas = self.strategy.num_replicas_in_sync if self.strategy else self.size
    if self.size > 1 and stall_timeout_s > 0 and output_dir:
      self._folder = os.path.join(output_dir, ".ranks")
      self._interval = max(1.0, min(10.0, stall_timeout_s / 10.0))
      stacks.arm(self._folder, self.rank)
      self._thread = threading.Thread(target=self._watch, name="stall_watchdog", daemon=True)
      self._thread.start()

  @property
  def local_replicas(self):
    """The replicas this process drives (one per card it computes on)."""
    return self.replicas // self.size

  def scope(self):
    """The context the graph is built in (variables become mirrored under a strategy)."""
    if self.strategy is None:
      return contextlib.ExitStack()
    stack = contextlib.ExitStack()
    stack.enter_context(self.strategy.scope())
    stack.enter_context(tf.variable_creator_scope(_update_from_first_replica))
    return stack

  def iterator(self, dataset):
    """An initializable iterator over this process's dataset of per-replica batches;
    under a strategy its get_next() gives each replica the next batch in turn."""
    if self.strategy is None:
      return tf.data.make_initializable_iterator(dataset)
    distribute = (getattr(self.strategy, "distribute_datasets_from_function", None) or
                  self.strategy.experimental_distribute_datasets_from_function)
    # The dataset is this process's share already (sharded by rank).
    iterator_of = distribute(lambda input_context: dataset)
    with warnings.catch_warnings():
      # TensorFlow 2's multi-device iterator reads the options' experimental_slack in graph
      # mode, with a warning that they may be stale; the pipeline does not set it.
      warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data "
                              "options", category=UserWarning)
      return tf.data.make_initializable_iterator(iterator_of)

  def each_replica(self, fn, *args):
    """Builds fn(*args) once per replica of this process (once without a strategy);
    args from iterator().get_next() give each replica its own batch.

    Returns:
      list of fn's results, one per replica.
    """
    if self.strategy is None:
      return [fn(*args)]
    results = []
    # Not through AutoGraph, which TensorFlow 2 applies to a replica's function: the graph
    # code has no Python control flow on tensors, and converting it cost seconds a run.
    self.strategy.extended.call_for_each_replica(
        tf.autograph.experimental.do_not_convert(lambda *a: results.append(fn(*a))), args=args)
    return results

  def replica_index(self):
    """int64 scalar Tensor, in a replica's graph: this replica's place among the job's
    replicas (0 .. replicas - 1; the rank under Horovod)."""
    if self.strategy is None:
      return tf.constant(self.rank, tf.int64)
    # TensorFlow 2.x numbers a worker's replicas from rank x local_replicas on,
    # TensorFlow 1.15 from 0 in every worker: the local index, placed by the rank.
    local = tf.floormod(tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
                                tf.int64), self.local_replicas)
    return self.rank * self.local_replicas + local

  @staticmethod
  def merged(results):
    """each_replica's results as one structure to fetch: replica 0's tensors, each
    after every replica's (so that every replica's all-reduce runs), every replica's
    ops grouped."""
    return tf.nest.map_structure(_merge, *results)

  def all_reduce(self, tensors, average=True, name=None):
    """Averages (or sums) each tensor over all the job's replicas, in a replica's graph.

    Returns:
      list of tensors.
    """
    if self.hvd is not None:
      op = self.hvd.Average if average else self.hvd.Sum
      return [self.hvd.allreduce(t, op=op, name=name and "%s_%d" % (name, i))
              for i, t in enumerate(tensors)]
    if self.strategy is None:
      return list(tensors)
    reduce_op = tf.distribute.ReduceOp.MEAN if average else tf.distribute.ReduceOp.SUM

    def merge_fn(strategy, *values):
      with tf.name_scope(timing.ALLREDUCE_SCOPE):  # its ops count as the all-reduce
        return strategy.extended.batch_reduce_to(reduce_op, [(v, v) for v in values])

    # ReplicaContext.all_reduce would do it, but its gradient wrapper fails on mirrored
    # variables in graph mode (it looks up "w/replica_1" by name).
    # tf.identity places each tensor on this replica's device (TensorFlow 1.15's
    # collectives need one; a placeholder made outside the replicas has none).
    return list(tf.distribute.get_replica_context().merge_call(
        merge_fn, args=tuple(tf.identity(t) for t in tensors)))

  def process_sum(self, tensor, name=None):
    """Sums over the processes a tensor that every replica of a process holds alike
    (a rank's eval sums, its step time), in a replica's graph."""
    if self.hvd is not None:
      return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=name)
    if self.strategy is None:
      return tf.identity(tensor)
    return self.all_reduce([self._from_first_local_replica(tensor)], average=False)[0]

  def _from_first_local_replica(self, tensor):
    """tensor in the first replica of this process, zeros in its others (in a replica's
    graph): summed over all replicas, each process counts once, exactly."""
    if self.local_replicas == 1:
      return tensor
    replica_id = tf.convert_to_tensor(
        tf.distribute.get_replica_context().replica_id_in_sync_group)
    first = tf.equal(tf.floormod(replica_id, self.local_replicas), 0)
    return tf.where(first, tensor, tf.zeros_like(tensor))

  def broadcast_op(self):
    """The op that gives every replica of every process rank 0's global variables (run
    after restoring), None with one card."""
    if self.hvd is not None:
      return self.hvd.broadcast_global_variables(0)
    if self.strategy is None:
      return None
    variables = tf.global_variables()
    if self.size == 1:
      # Outside a replica a mirrored variable reads its first copy and assigns them all.
      return tf.group(*[v.assign(v.read_value()) for v in variables])

    def replica():
      # Rank 0's values, zeros elsewhere, summed: a broadcast by the engine's all-reduce
      # (integers as float64, exact up to 2^53).
      mine = [self._from_first_local_replica(v.read_value()) if self.is_chief else
              tf.zeros(v.shape, v.dtype.base_dtype) for v in variables]
      mine = [t if t.dtype.is_floating else tf.cast(t, tf.float64) for t in mine]
      summed = [None] * len(mine)
      for dtype in set(t.dtype for t in mine):  # A batch of collectives has one dtype.
        places = [i for i, t in enumerate(mine) if t.dtype == dtype]
        for i, t in zip(places, self.all_reduce([mine[i] for i in places], average=False)):
          summed[i] = t
      return summed

    values = self.merged(self.each_replica(replica))
    return tf.group(*[v.assign(tf.cast(x, v.dtype.base_dtype))
                      for v, x in zip(variables, values)])

  def session(self, config):
    """The training session: multi_worker_mirrored's joins its workers (a server per
    worker, the collectives configured into config)."""
    if self.distribution != "multi_worker_mirrored":
      return tf.Session(config=config)
    self._config = config  # part()'s session takes it too
    config = self.strategy.update_config_proto(config)
    if tf.__version__.startswith("1."):
      # TensorFlow 1.15's scoped-allocator rewrite of the collectives, which the strategy
      # turns on, fails on variable reads and can abort a worker ("Device does not
      # implement GetScopedAllocator()" on a CPU). DEFAULT is off; 1.15 takes OFF for on.
      rewrite = config.graph_options.rewrite_options
      rewrite.scoped_allocator_optimization = rewrite.DEFAULT
      del rewrite.scoped_allocator_opts.enable_op[:]
    target = ""
    if self._workers:
      if self._server is None:  # One server a process, for agree()'s session and the run's.
        self._server = tf.distribute.Server(tf.train.ClusterSpec({"worker": self._workers}),
                                            job_name="worker", task_index=self.rank,
                                            config=config, start=True)
      target = self._server.target
    return tf.Session(target, config=config)

  def is_job_error(self, error):
    """Whether a tf.errors.OpError is one that Horovod, or TensorFlow's collectives of
    multi_worker_mirrored, raise when the job is broken (a rank stalled or gone), or a
    peer's own error that a collective passed on (TensorFlow 1.15: a worker's bad record
    reached its peers as "Data loss ... Error received from peer")."""
    if self.hvd is not None:
      return any(word in error.message for word in ("Horovod", "horovod", "gloo", "Gloo"))
    return self.size > 1 and (isinstance(error, (tf.errors.UnavailableError,
                                                 tf.errors.CancelledError,
                                                 tf.errors.AbortedError,
                                                 tf.errors.DeadlineExceededError)) or
                              "Error received from peer" in error.message)

  def name(self, rank):
    """How the messages name a process: "worker 1 (host2:2222)" or "rank 1"."""
    if self._workers:
      return "worker %d (%s)" % (rank, self._workers[rank])
    return "rank %d" % rank

  def names(self, ranks):
    """Several of them: "worker 1 (host2:2222), worker 2 (host3:2222)" or "rank 1, 2"."""
    if self._workers:
      return ", ".join(self.name(r) for r in ranks)
    return "rank %s" % ", ".join(str(r) for r in ranks)

  def agree(self, settings, config, shared=()):
    """Checks that every process of the job runs with the same settings, the first
    collective of the run, with the engine's own (Horovod's allgather, the strategy's
    all-reduce). A process whose settings differ would wait in a collective the others
    never start (a longer --num_train_steps, another evaluation schedule) or train its
    replicas apart; every process gets the same answer, so all of them stop together.

    With stall_timeout_s, a process whose peers have not all joined after that long
    prints a one-line error naming those without a heartbeat and exits with status 3.

    Args:
      settings: dict name (as the message shows it, e.g. "--num_train_steps") ->
        value: a number, a bool, or anything json.dumps takes (compared by a hash).
      config: the tf.ConfigProto of the run's session.
      shared: names in settings that are not compared: every process takes the first
        process's value (e.g. a seed drawn at random); numbers below 2^53.

    Returns:
      dict name -> the first process's value, for the names in `shared`.

    Raises:
      ValueError: the processes disagree; the message names the settings and values.
    """
    self.doing = "agreeing on the settings: the run's first collective"
    names = sorted(settings)
    mine = [_as_number(settings[n]) for n in names]
    rows = [mine]
    if self.size > 1:
      timer = None
      if self.stall_timeout_s > 0:
        # Counted from this process's start in the job (Ranks()), as the stall check is.
        timer = threading.Timer(max(0.0, self.stall_timeout_s - (time.time() - self._started)),
                                self._not_joined)
        timer.daemon = True
        timer.start()
      try:
        rows = self._gather(mine, config)
      finally:
        if timer is not None:
          timer.cancel()
    differ = []
    for i, name in enumerate(names):
      if name in shared:
        continue
      others = [r for r in range(self.size) if rows[r][i] != rows[0][i]]
      if others:
        shown = lambda r: _shown(rows[r][i], settings[name]) if isinstance(
            settings[name], (bool, int, float)) else "another"
        differ.append("%s (%s)" % (name, ", ".join(
            "%s: %s" % (self.name(r), shown(r)) for r in [0] + others)))
    if differ:
      message = ("the job's processes disagree on %s; start every process with the same "
                 "settings (nothing was trained)" % "; ".join(differ))
      # A worker exiting right after the gather could leave a slower peer without the
      # answer (a "Socket closed" abort instead of this line).
      self.part(2, message)
      raise ValueError(message)
    return {name: type(settings[name])(rows[0][names.index(name)]) for name in shared}

  def _gather(self, values, config):
    """Every process's `values` (a list of floats): a list of lists, by rank."""
    with tf.Graph().as_default():
      row = tf.constant([values], tf.float64)
      if self.hvd is not None:
        rows = self.hvd.allgather(row, name="job_settings")
      else:
        with self.scope():
          def replica():
            # Each process's row at its own place, zeros elsewhere, summed: all rows.
            mine = tf.one_hot([self.rank], self.size, dtype=tf.float64, axis=0) * row
            return self.all_reduce([self._from_first_local_replica(mine)], average=False)[0]
          rows = self.merged(self.each_replica(replica))
      if self.strategy is not None:
        sess = self.session(config)
      else:
        sess = tf.Session(config=config)
      with sess:
        return sess.run(rows).tolist()

  def part(self, status, message=None):
    """The parting collective, a multi_worker_mirrored worker's last: every worker passes
    it before any exits. A worker that exits right after a collective can leave a slower
    peer without its share (TensorFlow's collectives fetch it from the sender): an abort
    ("Socket closed"), or in TensorFlow 1.15 a wait for ever (no run timeout ends it).

    The parting collective itself can hang so. Once no peer has been busy for
    PARTING_TIMEOUT_S (half the stall timeout if shorter), this process prints `message` as
    its error line (if any) and ends with `status`. Busy: its heartbeat is fresh and says
    it is neither done, ended nor parting too (a chief drawing its report is waited for);
    without heartbeats to read, no peer is.
    """
    if not self.parts:
      return
    self.doing = PARTING
    passed = threading.Event()
    watcher = threading.Thread(target=self._watch_parting, args=(passed, status, message),
                               name="parting_watch", daemon=True)
    watcher.start()
    try:
      self._gather([0.0], self._config)
    except tf.errors.OpError:
      pass  # a peer gone after passing it: nothing is left to wait for
    finally:
      with self._parting:
        passed.set()

  @property
  def parts(self):
    """Whether part() passes a collective: a job of several multi_worker_mirrored workers."""
    return self.size > 1 and bool(self._workers)

  def _watch_parting(self, passed, status, message):
    """part()'s watch: ends this process once no peer has been busy for the timeout,
    its heartbeat saying so first."""
    wait = PARTING_TIMEOUT_S if self.stall_timeout_s <= 0 else min(
        PARTING_TIMEOUT_S, self.stall_timeout_s / 2.0)
    since = time.time()
    try:
      while not passed.wait(0.2):
        if self.busy_peers():
          since = time.time()
        elif time.time() - since >= wait:
          with self._parting:
            if passed.is_set():
              return
            self.stop(error=message)
            self._end_process(message, status)
    finally:
      # Whatever failed above (a closed stderr), the main thread must not stay in there.
      if not passed.is_set():
        os._exit(status)  # pylint: disable=protected-access

  def busy_peers(self):
    """The other ranks whose fresh heartbeat says they are at work: neither done, ended
    nor in part(). One frozen or killed goes stale, and counts as gone."""
    if self._folder is None:
      return []
    absent = self.absent_ranks()
    busy = []
    for rank in range(self.size):
      heartbeat = stacks.read_heartbeat(self._folder, rank)
      if rank != self.rank and rank not in absent and heartbeat is not None:
        parsed = stacks.parse_heartbeat(heartbeat[0])
        if parsed is None or parsed[2] != PARTING:
          busy.append(rank)
    return busy

  def _not_joined(self):
    """agree()'s timeout: names the processes without a heartbeat (or with their error,
    those that ended at one) and ends this one."""
    absent = self.absent_ranks()
    ended = self.ended_ranks(absent)
    if ended:
      self._end_process("%s; nothing was trained" % self.ended_words(ended), 3)
    if absent:
      what = "%s did not join the job" % self.names(absent)
      why = "no heartbeat from %s in %s" % ("it" if len(absent) == 1 else "them",
                                           self._folder)
    else:
      what = "the job's processes did not all join"
      why = "every heartbeat in %s is fresh: check that they reach each other" % self._folder
    self._end_process(
        "%s within --stall_timeout_s=%d (%s); start every process of the job (%d) with the "
        "same settings, or check its host and address; nothing was trained"
        % (what, self.stall_timeout_s, why, self.size), 3)

  def _end_process(self, message, status):
    """Prints the error line `PROGRAM: error: message` (if any) and ends the process at
    once, from any thread (the main one may be stuck in a collective)."""
    try:
      if message:
        errors.print_error(self.program, message)
      sys.stdout.flush()
      sys.stderr.flush()
    except (OSError, ValueError):  # a launcher gone: nobody reads them
      pass
    os._exit(status)  # pylint: disable=protected-access

  def absent_ranks(self):
    """The other processes whose heartbeat file is missing, says "done" or that it ended,
    or was not rewritten within three heartbeats: not (or no longer) running."""
    absent = []
    for rank in range(self.size):
      if rank == self.rank:
        continue
      heartbeat = stacks.read_heartbeat(self._folder or "", rank)
      if (heartbeat is None or heartbeat[0].startswith(("done", ENDED)) or
          time.time() - heartbeat[1] > 3 * self._interval):
        absent.append(rank)
    return absent

  @property
  def is_chief(self):
    return self.rank == 0

  def _watch(self):
    """Heartbeat and watchdog thread: see the class docstring."""
    beats = 0
    while not self._stop.wait(0 if beats == 0 else self._interval):
      beats += 1
      try:
        if not os.path.isdir(self._folder):
          os.makedirs(self._folder, exist_ok=True)
        stacks.write_heartbeat(self._folder, self.rank,
                               stacks.heartbeat_text(os.getpid(), beats, self.doing))
      except OSError:
        continue  # The heartbeat is best effort; training goes on.
      stalled = self.stalled_ranks(self.stall_timeout_s)
      ended = self.ended_ranks(stalled)
      stalled = [r for r in stalled if r not in ended]
      if stalled or ended:
        why = [self.ended_words(ended)] if ended else []
        if stalled:
          why.append("%s stalled: no sign of life for %d s (stuck in I/O, stopped, or "
                     "its host frozen; --stall_timeout_s=%d); the job stops: check that "
                     "host; %s%s" % (self.names(stalled), self.stall_timeout_s,
                                     self.stall_timeout_s,
                                     checkpoints.rerun_advice(os.path.dirname(self._folder)),
                                     self.stall_reports(stalled)))
        errors.print_error(self.program, "; ".join(why))
        sys.stderr.flush()
        logs.end_open_runs("; ".join(
            "%s %s: the job stopped (see its error line)" % (self.names(sorted(group)), how)
            for group, how in ((stalled, "stalled"), (ended, "ended at its error")) if group))
        os._exit(3)  # pylint: disable=protected-access

  def ended_words(self, ended):
    """What the error line says of the peers that ended at an error (ended_ranks); their
    own lines say what to do (and what a rerun does)."""
    return "; ".join("%s ended at its error (%s), and the job cannot go on without it: "
                     "do what it says" % (self.name(r), line)
                     for r, line in sorted(ended.items()))

  def ended_ranks(self, ranks=None, wait_s=0.0):
    """Of `ranks` (default: the other ranks), those whose heartbeat file says they ended
    at an error during this job, waiting up to wait_s for one: {rank: its error line}
    (stop(error=...) wrote it). A file older than this process is an earlier run's (a
    job's rank cannot end at an error before all have joined)."""
    deadline = time.time() + wait_s
    while self._folder is not None:
      ended = {}
      for rank in (range(self.size) if ranks is None else ranks):
        heartbeat = stacks.read_heartbeat(self._folder, rank) if rank != self.rank else None
        if (heartbeat is not None and heartbeat[0].startswith(ENDED) and
            heartbeat[1] >= self._started):
          ended[rank] = heartbeat[0][len(ENDED):].strip()
      if ended or time.time() >= deadline:
        return ended
      time.sleep(0.2)
    return {}

  def stall_reports(self, stalled):
    """Writes output_dir/stall-rank-N.txt (stacks.write_reports): what each rank was
    doing. Returns the error line's words naming them ("" without heartbeats)."""
    if self._folder is None:
      return ""
    written = stacks.write_reports(self._folder, os.path.dirname(self._folder), self.size,
                                   self.rank, stalled,
                                   since=self._job_start())
    if not written:
      return ""
    return "; what each rank was doing: %s" % ", ".join(p for _, p in sorted(written.items()))

  def _job_start(self):
    """The earliest a heartbeat of this job can have been written: the ranks of a job
    start within the stall timeout of each other."""
    return self._started - self.stall_timeout_s

  def stalled_ranks(self, min_age_s=None):
    """Other ranks whose heartbeat was written during this job, then not for min_age_s
    seconds (default: three heartbeats). A file written before this rank started, less
    the stall timeout (the ranks of a job start about together), was left by an earlier
    run: it counts only once it changes."""
    if min_age_s is None:
      min_age_s = 3 * self._interval
    if self._folder is None:
      return []
    now = time.time()
    stalled = []
    for rank in range(self.size):
      if rank == self.rank:
        continue
      heartbeat = stacks.read_heartbeat(self._folder, rank)
      if heartbeat is None or heartbeat[0].startswith("done"):
        continue
      content, written = heartbeat
      previous = self._seen.get(rank)
      if previous is None:
        # A rank killed right after its first heartbeat never changes its file again.
        this_job = written >= self._job_start()
        self._seen[rank] = (content, written if this_job else None)
      elif previous[0] != content:
        self._seen[rank] = (content, now)
      elif previous[1] is not None and now - previous[1] >= min_age_s:
        stalled.append(rank)
    return stalled

  def stop(self, error=None):
    """Ends the heartbeat thread; the others no longer wait for this rank. error: the
    line of the error this rank ends at, which its peers then name (ended_ranks)."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=10)
    if self._folder is not None:
      try:
        stacks.write_heartbeat(self._folder, self.rank, "done\n" if error is None else
                               ENDED + error.replace("\n", " ") + "\n")
      except OSError:  # best effort, as the heartbeat
        pass
