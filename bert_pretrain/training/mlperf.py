"""MLPerf Training's rules for BERT, as numbers: the evaluation interval, the target, the
initial checkpoint's accuracy and the reference convergence points (RCPs); and the page
cache a timed run starts without (clear_cache).

The RCPs are read from the mlperf-logging package (which init_tf.sh installs): for each
global batch size the reference's hyperparameters and the samples that 20+ reference runs
needed to reach the target. A run can take the hyperparameters of its batch size
(reference_hyperparameters) and project its time to train from its throughput
(projected_time_to_train). No flags are read here.
"""

import collections
import json
import math
import os

TARGET_ACCURACY = 0.720
# The masked-LM accuracy of MLPerf's initial checkpoint (model.ckpt-28252) on eval_10k
# right after loading (the reference README).
MLPERF_CHECKPOINT = "model.ckpt-28252"
MLPERF_CHECKPOINT_ACCURACY = 0.34085
EVAL_SAMPLES = 10000  # eval_10k, the evaluation set
# The round whose rules and RCPs apply: BERT's last MLPerf Training round.
RULESET = "5.0.0"


# Writing 3 here drops the OS page cache (Linux; root, and /proc/sys not read-only).
DROP_CACHES = "/proc/sys/vm/drop_caches"


def check_clear_cache(path=DROP_CACHES):
  """Raises ValueError (the one-line message) when this process cannot drop the page
  cache, so that --clear_cache fails before the run builds anything."""
  if not os.access(path, os.W_OK):
    raise ValueError("--clear_cache cannot write %s on this host (it needs root, and /proc/sys "
                     "writable: a container mounts it read-only unless privileged); run as "
                     "root there, or leave --clear_cache out (mlperf.log then says "
                     "cache_clear false)" % path)


def clear_cache(path=DROP_CACHES):
  """Writes the dirty pages out and drops the page cache, dentries and inodes, as MLPerf's
  rules ask before a timed run ("flush the cache or restart the system")."""
  os.sync()
  try:
    with open(path, "w") as f:
      f.write("3\n")
  except EnvironmentError as e:
    raise ValueError("--clear_cache: writing %s failed (%s); run as root with /proc/sys "
                     "writable, or leave --clear_cache out" % (path, e.strerror or e))


def eval_interval_samples(global_batch_size):
  """Training samples between two evaluations, by MLPerf's rule for BERT:
  floor(0.05 * (230.23 * global_batch_size + 3,000,000) / 25,000) * 25,000; evaluations
  come at every multiple of it from 0 (the one at 0 may be skipped)."""
  return int(math.floor(0.05 * (230.23 * global_batch_size + 3000000) / 25000)) * 25000


def expected_initial_accuracy(init_checkpoint):
  """The masked-LM accuracy expected right after loading `init_checkpoint` (a prefix or
  path), or None when it is not MLPerf's checkpoint."""
  if init_checkpoint and os.path.basename(init_checkpoint.rstrip("/")) == MLPERF_CHECKPOINT:
    return MLPERF_CHECKPOINT_ACCURACY
  return None


def initial_accuracy_warning(accuracy, expected, tolerance):
  """The warning line when the accuracy after loading the initial checkpoint is more than
  `tolerance` from `expected`, else None."""
  if expected is None or abs(accuracy - expected) <= tolerance:
    return None
  return ("masked_lm_accuracy right after loading --init_checkpoint is %.5f, expected "
          "%.5f +- %g: check that --bert_config_file and the data's vocab are the "
          "checkpoint's and that every weight loaded (the lines above)"
          % (accuracy, expected, tolerance))


def eval_set_warning(eval_samples, stop_threshold, max_eval_steps):
  """The warning line when a run with a target evaluated another number of sequences than
  MLPerf's eval_10k holds (a subset by --max_eval_steps, or other files), else None."""
  if stop_threshold <= 0 or eval_samples == EVAL_SAMPLES:
    return None
  return ("the evaluation read %d sequences, not the %d of MLPerf's eval_10k: its masked-LM "
          "accuracy is not comparable with MLPerf's target (--stop_threshold=%g); %s"
          % (eval_samples, EVAL_SAMPLES, stop_threshold,
             "--max_eval_steps=0 evaluates the whole set" if max_eval_steps > 0 else
             "pass eval_10k's records as --eval_files_dir"))


# One reference convergence point: its name in the RCP file, the global batch size, the
# hyperparameters by our flag names, and the samples each reference run needed.
Rcp = collections.namedtuple("Rcp", ["name", "batch_size", "hyperparameters", "samples"])

# RCP hyperparameter key -> our flag.
_RCP_FLAGS = (("opt_base_learning_rate", "learning_rate"), ("opt_epsilon", "epsilon"),
              ("opt_learning_rate_training_steps", "num_train_steps"),
              ("num_warmup_steps", "num_warmup_steps"),
              ("start_warmup_step", "start_warmup_step"), ("opt_lamb_beta_1", "beta_1"),
              ("opt_lamb_beta_2", "beta_2"),
              ("opt_lamb_weight_decay_rate", "weight_decay_rate"))
# The hyperparameters counted in updates, scaled when a run's batch differs from the RCP's.
_STEP_FLAGS = ("num_train_steps", "num_warmup_steps", "start_warmup_step")


def rcp_file(ruleset=RULESET):
  """The path of the BERT RCP file of `ruleset` in the installed mlperf-logging.

  Raises:
    ValueError: mlperf-logging is missing or has no BERT RCPs for the ruleset.
  """
  try:
    import mlperf_logging  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError("mlperf-logging is not installed, so MLPerf's reference convergence "
                     "points are unknown; run bash init_tf.sh (or pip install "
                     "mlperf-logging)")
  path = os.path.join(os.path.dirname(mlperf_logging.__file__), "rcp_checker",
                      "training_" + ruleset, "rcps_bert.json")
  if not os.path.exists(path):
    raise ValueError("the installed mlperf-logging has no BERT RCPs of training %s (%s); "
                     "pip install -U mlperf-logging" % (ruleset, path))
  return path


def load_rcps(path=None):
  """The BERT RCPs, by batch size: a list of Rcp sorted by batch_size."""
  with open(path or rcp_file()) as f:
    raw = json.load(f)
  rcps = []
  for name, record in raw.items():
    params = record["Hyperparams"]
    rcps.append(Rcp(name, int(record["BS"]),
                    {ours: params[theirs] for theirs, ours in _RCP_FLAGS},
                    sorted(float(s) for s in record["Epochs to converge"])))
  return sorted(rcps, key=lambda rcp: rcp.batch_size)


def samples_mean_and_stdev(rcp):
  """The RCP's mean samples to converge as MLPerf's RCP checker computes it (the
  "olympic" mean: without the fastest and the slowest run) and the standard deviation of
  all its runs."""
  samples = rcp.samples
  kept = samples[1:-1] if len(samples) > 2 else samples
  mean = sum(kept) / len(kept)
  all_mean = sum(samples) / len(samples)
  stdev = math.sqrt(sum((s - all_mean) ** 2 for s in samples) / len(samples))
  return mean, stdev


# What a run takes from the RCPs for its global batch size: the RCP whose hyperparameters
# it uses, those hyperparameters (steps scaled to the run's batch), the expected samples to
# converge (mean, stdev) as MLPerf's RCP checker expects them and the RCPs they come from
# (judged_by), and one line that says which hyperparameters and why.
RcpChoice = collections.namedtuple("RcpChoice", ["rcp", "hyperparameters", "samples_mean",
                                                 "samples_stdev", "judged_by", "note"])


def prune_rcps(rcps):
  """The RCPs MLPerf's RCP checker judges convergence by (its pruned set, which the
  package checker uses): those from the one that converges in the fewest samples up, then
  without each that converges slower than the line between its two neighbours.

  Args:
    rcps: load_rcps(), sorted by batch size.

  Returns:
    A list of Rcp, sorted by batch size.
  """
  means = {rcp.name: samples_mean_and_stdev(rcp)[0] for rcp in rcps}
  fastest = min(rcps, key=lambda rcp: means[rcp.name])
  kept = [rcp for rcp in rcps if rcp.batch_size >= fastest.batch_size]
  i = 1
  while i < len(kept) - 1:
    low, rcp, high = kept[i - 1], kept[i], kept[i + 1]
    t = float(rcp.batch_size - low.batch_size) / (high.batch_size - low.batch_size)
    if means[rcp.name] > means[low.name] + t * (means[high.name] - means[low.name]):
      del kept[i]  # and the next one is weighed against the same left neighbour
    else:
      i += 1
  return kept


def expected_convergence(global_batch_size, rcps):
  """The samples to converge MLPerf's RCP checker weighs a run of this global batch size
  against, from the pruned RCPs (prune_rcps): at an RCP's batch size its mean and stdev;
  between two, both interpolated linearly; below every one, the smallest's (slower
  convergence at a smaller batch passes); above every one, the largest's, though the
  checker cannot judge that batch size.

  Returns:
    (mean, stdev, the RCPs they come from).
  """
  pruned = prune_rcps(rcps)
  below = [r for r in pruned if r.batch_size <= global_batch_size]
  above = [r for r in pruned if r.batch_size > global_batch_size]
  if below and above and below[-1].batch_size < global_batch_size:
    low, high = below[-1], above[0]
    (low_mean, low_stdev), (high_mean, high_stdev) = (samples_mean_and_stdev(low),
                                                      samples_mean_and_stdev(high))
    t = float(global_batch_size - low.batch_size) / (high.batch_size - low.batch_size)
    return (low_mean + t * (high_mean - low_mean), low_stdev + t * (high_stdev - low_stdev),
            "%s and %s interpolated" % (low.name, high.name))
  rcp = below[-1] if below else above[0]
  return samples_mean_and_stdev(rcp) + (rcp.name,)


def choose_rcp(global_batch_size, rcps):
  """The reference's hyperparameters and convergence for a global batch size.

  The hyperparameters: on an RCP's batch size, that RCP's; between two, those of the one
  below (tuned for a batch no larger than the run's); below every RCP the smallest's,
  above every RCP the largest's. Away from the RCP's batch size, the hyperparameters
  counted in updates (training, warm-up steps, start_warmup_step) are scaled by the ratio
  of the batch sizes, so the schedule spans the same samples. The samples to converge:
  expected_convergence.

  Args:
    global_batch_size: sequences per update, all ranks.
    rcps: load_rcps().

  Returns:
    RcpChoice.
  """
  below = [r for r in rcps if r.batch_size <= global_batch_size]
  above = [r for r in rcps if r.batch_size >= global_batch_size]
  if below and below[-1].batch_size == global_batch_size:
    rcp = below[-1]
    note = "RCP %s (global batch %d)" % (rcp.name, rcp.batch_size)
  elif below and above:
    rcp = below[-1]
    note = ("no RCP at global batch %d: hyperparameters of %s (the nearest below, %d; "
            "steps scaled by %d/%d)" % (global_batch_size, rcp.name, rcp.batch_size,
                                        rcp.batch_size, global_batch_size))
  elif above:
    rcp = above[0]
    note = ("global batch %d is below every RCP: those of the smallest, %s (%d; steps "
            "scaled by %d/%d)" % (global_batch_size, rcp.name, rcp.batch_size,
                                  rcp.batch_size, global_batch_size))
  else:
    rcp = below[-1]
    note = ("global batch %d is above every RCP: those of the largest, %s (%d; steps "
            "scaled by %d/%d); MLPerf's RCP checker has none to judge this batch size"
            % (global_batch_size, rcp.name, rcp.batch_size, rcp.batch_size,
               global_batch_size))
  params = dict(rcp.hyperparameters)
  for name in _STEP_FLAGS:
    params[name] = int(round(params[name] * float(rcp.batch_size) / global_batch_size))
  mean, stdev, judged_by = expected_convergence(global_batch_size, rcps)
  return RcpChoice(rcp, params, mean, stdev, judged_by, note)


def projected_time_to_train(samples, throughput, global_batch_size, eval_seconds_per_sample):
  """The time to train `samples` sequences at `throughput` sentences/s, plus MLPerf's
  evaluations on the way: one every eval_interval_samples(global_batch_size), each of
  EVAL_SAMPLES sequences at eval_seconds_per_sample (None: their time is unknown).

  Returns:
    (total seconds, number of evaluations, seconds of the evaluations or None).
  """
  evaluations = int(samples // eval_interval_samples(global_batch_size))
  eval_seconds = None
  if eval_seconds_per_sample is not None:
    eval_seconds = evaluations * EVAL_SAMPLES * eval_seconds_per_sample
  return samples / throughput + (eval_seconds or 0.0), evaluations, eval_seconds


def format_duration(seconds):
  """3725 -> "1 h 02 min", 75 -> "1 min 15 s"."""
  seconds = int(round(seconds))
  if seconds >= 3600:
    return "%d h %02d min" % (seconds // 3600, seconds % 3600 // 60)
  if seconds >= 60:
    return "%d min %02d s" % (seconds // 60, seconds % 60)
  return "%d s" % seconds
