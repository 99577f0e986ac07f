"""Bad records anywhere in a training set, and a rank that stalls.

A corrupt record, a file cut short and a token id outside the vocab are met mid-run (the
up-front check of the whole set is turned off with --full_record_check_mb=0, as for a
set over 256 MB): the run stops with one line naming the file and the record, keeps its
checkpoints, and --skip_corrupt_records trains around them. A rank stopped with SIGSTOP
is named and ends the job; a worker that ends at a bad record is named, with its error,
by its peer.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain.data import input_pipeline
from bert_pretrain.data import records
from bert_pretrain.training import report
from conftest import (PREDICTIONS, SEQ_LENGTH, TINY_CONFIG, base_flags, horovod_env,
                      rank_command, rank_pid, run_pretraining)

# The damaged record: far enough into part-1 that a few updates (and checkpoints) come
# before the pipeline reaches it.
BAD_INDEX = 50


def damaged_copy(data, tmp_path, kind):
  """A copy of the training folder whose part-1 has a bad record BAD_INDEX.

  Args:
    kind: "crc" (a payload byte flipped), "cut" (the file ends inside the record) or
      "id" (a token id above vocab_size).

  Returns:
    (folder, damaged file, byte offset of the record).
  """
  folder = str(tmp_path / ("train_" + kind))
  shutil.copytree(data["train"], folder)
  path = os.path.join(folder, "part-1")
  offsets, error = records.record_offsets(path)
  assert error is None and len(offsets) > BAD_INDEX + 5
  offset = offsets[BAD_INDEX][0]
  if kind == "id":
    serialized = list(tf.io.tf_record_iterator(path))
    example = tf.train.Example.FromString(serialized[BAD_INDEX])
    example.features.feature["input_ids"].int64_list.value[3] = TINY_CONFIG["vocab_size"] + 7
    serialized[BAD_INDEX] = example.SerializeToString()
    with tf.io.TFRecordWriter(path) as writer:
      for record in serialized:
        writer.write(record)
  else:
    content = bytearray(open(path, "rb").read())
    if kind == "crc":
      content[offset + 12 + 40] ^= 0xFF
    else:
      content = content[:offset + 30]
    with open(path, "wb") as f:
      f.write(bytes(content))
  return folder, path, offset


PROBLEMS = {
    "crc": "the CRC does not match the data",
    "cut": "the file is cut short or corrupt: record %d at byte {offset} claims" % BAD_INDEX,
    "id": "token id %d is outside the vocab (vocab_size %d)" % (TINY_CONFIG["vocab_size"] + 7,
                                                                TINY_CONFIG["vocab_size"]),
}


def mid_run_flags(data, folder, out, **overrides):
  # shuffle_buffer=1: records are read in file order, so BAD_INDEX comes after a few
  # updates; save_checkpoints_steps=2: checkpoints exist when it does.
  values = dict(input_files_dir=folder, num_train_steps=40, save_checkpoints_steps=2,
                shuffle_buffer=1, full_record_check_mb=0, nodo_eval=None)
  values.update(overrides)
  return base_flags(data, out, **values)


def error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith("run_pretraining: error:")]


@pytest.mark.parametrize("kind", ["crc", "cut", "id"])
def test_a_bad_record_met_mid_run_is_named_and_checkpoints_stay(pretraining_data, tmp_path,
                                                                 kind):
  folder, path, offset = damaged_copy(pretraining_data, tmp_path, kind)
  out = tmp_path / "out"
  result = run_pretraining(*mid_run_flags(pretraining_data, folder, out))
  print(result.stderr.splitlines()[-1])
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  [line] = error_lines(result.stderr)
  where = "bad TFRecord %s record %d (byte %d): " % (path, BAD_INDEX, offset)
  assert line.startswith("run_pretraining: error: " + where), line
  assert PROBLEMS[kind].format(offset=offset) in line
  assert "pass --skip_corrupt_records" in line
  assert "checkpoints in %s are kept" % out in line
  # It was met mid-run: updates were made and their checkpoints are intact.
  assert "Step 2," in result.stdout
  latest = tf.train.latest_checkpoint(str(out))
  assert latest is not None
  assert tf.train.load_checkpoint(latest).get_tensor("global_step") >= 2
  # The MLPerf log ends as a failed run's does, with run_stop aborted.
  last = (out / "mlperf.log").read_text().splitlines()[-1]
  assert '"key": "run_stop"' in last and '"status": "aborted"' in last, last


@pytest.mark.parametrize("kind", ["crc", "cut"])
def test_the_up_front_check_names_the_record(pretraining_data, tmp_path, kind):
  folder, path, offset = damaged_copy(pretraining_data, tmp_path, kind)
  out = tmp_path / "out"
  result = run_pretraining(*mid_run_flags(pretraining_data, folder, out,
                                          full_record_check_mb=256))
  print(result.stderr.splitlines()[-1])
  assert result.returncode == 2
  [line] = error_lines(result.stderr)
  assert ("corrupt TFRecord file %s" % path) in line
  assert ("record %d" % BAD_INDEX) in line and ("byte %d" % offset) in line
  assert "pass --skip_corrupt_records" in line
  assert "Step " not in result.stdout  # before any training


@pytest.mark.parametrize("kind", ["crc", "cut", "id"])
def test_skip_corrupt_records_trains_around_them_and_counts_them(pretraining_data, tmp_path,
                                                                 kind):
  folder, path, offset = damaged_copy(pretraining_data, tmp_path, kind)
  out = tmp_path / "out"
  # 40 updates of 8 records: more than two passes over the ~130 records.
  result = run_pretraining(*mid_run_flags(pretraining_data, folder, out,
                                          skip_corrupt_records=None, max_corrupt_share=0.01))
  assert result.returncode == 0, result.stderr[-3000:]
  [line] = [l for l in result.stdout.splitlines() if l.startswith("--skip_corrupt_records")]
  print(line)
  assert line.startswith("--skip_corrupt_records: 1 of ")
  assert "first: %s record %d (byte %d)" % (path, BAD_INDEX, offset) in line
  assert "Step 40," in result.stdout
  logged = [json.loads(l) for l in open(str(out / "dllog.json"))]
  [counts] = [r for r in logged if r["type"] == "data"]
  assert counts["skipped_records"] == 1 and counts["records"] > 100


def test_skipping_stops_past_the_share(pretraining_data, tmp_path):
  folder, path, offset = damaged_copy(pretraining_data, tmp_path, "crc")
  out = tmp_path / "out"
  out.mkdir()
  (out / "model.ckpt-7.index").write_text("an earlier run's file")
  result = run_pretraining(*mid_run_flags(pretraining_data, folder, out,
                                          skip_corrupt_records=None))
  print(result.stderr.splitlines()[-1])
  assert result.returncode == 2
  [line] = error_lines(result.stderr)
  assert "1 of " in line and "more than --max_corrupt_share=0.001 allows" in line
  assert "first: %s record %d (byte %d)" % (path, BAD_INDEX, offset) in line
  assert (out / "model.ckpt-7.index").read_text() == "an earlier run's file"
  assert "Step " not in result.stdout


def _skipping_check(data, tmp_path, kind):
  """check_training_files with skipping on damaged_copy's folder of `kind`, whose one bad
  record it must find; returns (folder, damaged file, the folder's files, records)."""
  folder, path, _ = damaged_copy(data, tmp_path, kind)
  files = input_pipeline.list_record_files(folder)
  num_records, bad = input_pipeline.check_training_files(
      files, SEQ_LENGTH, PREDICTIONS, TINY_CONFIG["vocab_size"], skip_corrupt=True,
      max_corrupt_share=0.1)
  assert [(r.path, r.index) for r in bad] == [(path, BAD_INDEX)]
  return folder, path, files, num_records, bad


def test_a_cut_tail_counts_among_the_records_as_well_as_among_the_bad_ones(pretraining_data,
                                                                          tmp_path):
  folder, path, files, num_records, _ = _skipping_check(pretraining_data, tmp_path, "cut")
  whole = sum(1 for f in files if f != path for _ in tf.io.tf_record_iterator(f))
  assert num_records == whole + BAD_INDEX + 1
  # A file that is one cut record: 1 of 1 bad, not 1 of 0.
  only_cut = os.path.join(folder, "part-2")
  with open(path, "rb") as source, open(only_cut, "wb") as f:
    f.write(source.read(30))
  with pytest.raises(ValueError, match=r"of (\d+) training records are corrupt \(") as error:
    input_pipeline.check_training_files(
        [only_cut], SEQ_LENGTH, PREDICTIONS, TINY_CONFIG["vocab_size"], skip_corrupt=True,
        max_corrupt_share=0.1)
  assert "1 of 1 training records are corrupt (100%)" in str(error.value)


def test_skipped_records_are_left_out_and_every_other_record_is_read(pretraining_data,
                                                                     tmp_path):
  _, path, files, num_records, bad = _skipping_check(pretraining_data, tmp_path, "crc")
  expected = []
  for name in sorted(os.listdir(pretraining_data["train"])):
    source = os.path.join(pretraining_data["train"], name)
    for i, record in enumerate(tf.io.tf_record_iterator(source)):
      if not (name == "part-1" and i == BAD_INDEX):
        expected.append(tuple(tf.train.Example.FromString(record).features.feature[
            "input_ids"].int64_list.value))
  assert num_records == len(expected) + 1
  with tf.Graph().as_default():
    dataset = input_pipeline.make_dataset(files, 16, SEQ_LENGTH, PREDICTIONS,
                                          is_training=False, skip_records=bad,
                                          vocab_size=TINY_CONFIG["vocab_size"])
    batch = tf.data.make_one_shot_iterator(dataset).get_next()
    read = []
    with tf.Session() as sess:
      while True:
        try:
          read.extend(tuple(row) for row in sess.run(batch["input_ids"]))
        except tf.errors.OutOfRangeError:
          break
  assert sorted(read) == sorted(expected)


STALL_TIMEOUT_S = 20


# What a rank training says it does: inside an update, or in the display step's average
# of the losses after it (both all-reduce).
UPDATE_DOING = (r"doing( at its last heartbeat)?: (update \d+: input, forward, backward, "
                r"the gradients' all-reduce|log line after update \d+: the losses' average "
                r"over the ranks)")


def _start_two_ranks(data, tmp_path, transport):
  """Starts a long 2-rank run with --stall_timeout_s=STALL_TIMEOUT_S under horovodrun
  --gloo or --mpi and reads its output until update 10.

  Returns:
    (the horovodrun process, output lines so far, pid of rank 1's training process).
  """
  # No checkpoint while it runs: a rank stopped then says it was inside an update.
  flags = base_flags(data, tmp_path / "out", num_train_steps=10 ** 6, display_loss_steps=5,
                     nodo_eval=None, stall_timeout_s=STALL_TIMEOUT_S,
                     save_checkpoints_steps=10 ** 6)
  env = horovod_env(PYTHONUNBUFFERED="1")
  proc = subprocess.Popen(["horovodrun", "-np", "2", "-H", "localhost:2", transport] +
                          rank_command("--horovod", *flags), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, env=env)
  deadline = time.time() + 180
  output = []
  for line in proc.stdout:
    output.append(line)
    if "Step 10," in line or time.time() > deadline:
      break
  # A heartbeat is written every 2 s at this timeout, and 10 updates of this model can
  # take less: before it, rank 1's last one may still say what it did before update 1.
  time.sleep(5)
  try:
    return proc, output, rank_pid(proc, 1)
  except AssertionError:
    return proc, output, None  # the caller's assertion says so, after _end cleans up


def _end(proc, pid):
  """SIGKILLs the stopped rank and the launcher if they are still there."""
  if pid:
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass
  if proc.poll() is None:
    proc.kill()
    proc.wait()


def test_a_stalled_rank_is_named_and_the_job_ends(pretraining_data, tmp_path):
  proc, output, stopped = _start_two_ranks(pretraining_data, tmp_path, "--gloo")
  try:
    assert stopped, "rank 1 not found:\n" + "".join(output)
    os.kill(stopped, signal.SIGSTOP)
    stopped_at = time.time()
    output.append(proc.stdout.read())
    status = proc.wait(timeout=STALL_TIMEOUT_S + 120)
    elapsed = time.time() - stopped_at
    text = "".join(output)
    print("exit status %d after %.1f s; %s" % (
        status, elapsed, [l for l in text.splitlines() if "error:" in l]))
    assert status != 0
    assert elapsed < STALL_TIMEOUT_S + 40
    assert ("run_pretraining: error: rank 1 stalled: no sign of life for %d s"
            % STALL_TIMEOUT_S) in text
    # What each rank was doing, in a file a rank named by the error line: the stopped
    # one's last heartbeat (it cannot answer), the other's own stack.
    out = tmp_path / "out"
    assert "what each rank was doing: %s, %s" % (
        out / "stall-rank-0.txt", out / "stall-rank-1.txt") in text
    stopped_report = (out / "stall-rank-1.txt").read_text()
    print(stopped_report)
    assert "stalled, its last heartbeat" in stopped_report
    assert re.search(UPDATE_DOING, stopped_report), stopped_report
    assert "no answer to SIGUSR2" in stopped_report
    # Rank 0's MLPerf log ends as a failed run's does, not cut short.
    mllog = [json.loads(line.split(":::MLLOG ", 1)[1])
             for line in open(str(out / "mlperf.log"))]
    assert mllog[-1]["key"] == "run_stop" and mllog[-1]["metadata"]["status"] == "aborted"
    # And its report says why the part has no summary.
    assert "the last part ended without a summary: rank 1 stalled: the job stopped (see its " \
        "error line)" in report.format_summary(report.summarize(report.read_records(
            str(out / "dllog.json"))))
    own_report = (out / "stall-rank-0.txt").read_text()
    print(own_report)
    assert "running" in own_report.splitlines()[0] and "doing: " in own_report
    assert re.search(r'File ".*loop\.py", line \d+ in train', own_report), own_report
    assert re.search(r'File ".*ranks\.py", line \d+ in _watch', own_report), own_report
  finally:
    _end(proc, stopped)


def _ptrace(request, tid):
  """ptrace(request, tid, 0, 0) through libc; raises OSError on failure."""
  import ctypes  # pylint: disable=g-import-not-at-top
  libc = ctypes.CDLL(None, use_errno=True)
  libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
  if libc.ptrace(request, tid, None, None) != 0:
    raise OSError(ctypes.get_errno(), "ptrace(%d, %d) failed" % (request, tid))


PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207


def test_a_rank_alive_but_stuck_is_named_and_the_job_ends(pretraining_data, tmp_path):
  # Only rank 1's main thread is stopped (ptrace), as when it waits on a read that never
  # returns: its Horovod thread still negotiates, and Horovod's stall check sees rank 1
  # missing from the next all-reduce. That check works under MPI; under Gloo, Horovod
  # 0.28.1 printed nothing here (see docs/reliability.md). If the main thread stopped while
  # holding Python's lock, rank 1's heartbeat thread stops too, and the other rank's
  # watch may name it first: either way rank 1 is named and the job ends.
  proc, output, stuck = _start_two_ranks(pretraining_data, tmp_path, "--mpi")
  try:
    assert stuck, "rank 1 not found:\n" + "".join(output)
    _ptrace(PTRACE_SEIZE, stuck)
    _ptrace(PTRACE_INTERRUPT, stuck)
    stuck_at = time.time()
    error_after = None
    for line in proc.stdout:
      output.append(line)
      if error_after is None and "run_pretraining: error:" in line:
        error_after = time.time() - stuck_at
    status = proc.wait(timeout=STALL_TIMEOUT_S + 120)
    elapsed = time.time() - stuck_at
    text = "".join(output)
    print("exit status %d after %.1f s (error line after %s s); %s" % (
        status, elapsed, error_after, [l[:200] for l in text.splitlines() if "error:" in l
                                       or "Missing" in l or "<stderr>:1" in l]))
    assert status != 0
    # Horovod looks every HOROVOD_STALL_CHECK_TIME_SECONDS (half the timeout), so it
    # shuts down up to that much after the timeout; mpirun then takes a while to end
    # the ranks.
    assert error_after is not None and error_after < STALL_TIMEOUT_S * 1.5 + 40
    assert elapsed < STALL_TIMEOUT_S + 120
    by_horovod = "Missing ranks:" in text and re.search(r"<stderr>:1!?: \[", text)
    by_watch = "run_pretraining: error: rank 1 stalled: no sign of life" in text
    assert by_horovod or by_watch, text[-3000:]
    if not by_watch:
      assert "run_pretraining: error: Horovod stopped the job" in text
    # The stuck rank answers with its stack (faulthandler runs in its other threads): its
    # main thread inside the training loop.
    stuck_report = (tmp_path / "out" / "stall-rank-1.txt").read_text()
    print(stuck_report)
    assert "stall-rank-1.txt" in text
    assert re.search(UPDATE_DOING, stuck_report), stuck_report
    assert re.search(r'File ".*loop\.py", line \d+ in train', stuck_report), stuck_report
  finally:
    _end(proc, stuck)


def test_a_worker_that_ends_at_a_bad_record_is_named_with_its_error_by_its_peer(
    pretraining_data, tmp_path):
  """Worker 1 of a multi_worker_mirrored job reads its host's copy of the records, whose
  part-1 has a bad record (of the same size: the job's check of the files passes); worker
  0, with good records, waits for it in a collective. It said "rank 1 stalled: no sign of
  life" after the stall timeout (TensorFlow 1.15), or that some rank failed (2.15)."""
  from test_distribution import finish, start_workers  # pylint: disable=g-import-not-at-top
  folder, path, offset = damaged_copy(pretraining_data, tmp_path, "crc")
  flags = mid_run_flags(pretraining_data, pretraining_data["train"], tmp_path / "out",
                        stall_timeout_s=30)
  started = time.time()
  procs = start_workers(flags, tmp_path / "logs",
                        own_flags={1: ["--input_files_dir=%s" % folder]})
  results = finish(procs, tmp_path / "logs", timeout=300)
  (status0, output0), (status1, output1) = results
  assert status1 == 2, output1[-3000:]
  [line] = error_lines(output1)
  assert line.startswith("run_pretraining: error: bad TFRecord %s record %d (byte %d): "
                         % (path, BAD_INDEX, offset)), line
  assert status0 == 3, output0[-3000:]
  [peer_line] = error_lines(output0)
  message = line[len("run_pretraining: error: "):]
  assert re.search(r"worker 1 \(localhost:\d+\) ended at its error \(%s\), and the job "
                   r"cannot go on without it: do what it says$" % re.escape(message),
                   peer_line), peer_line
  assert "stalled" not in peer_line
  print("worker 0 ended after %.1f s with: %s" % (time.time() - started, peer_line))
