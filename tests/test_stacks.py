"""distributed/stacks.py: the stall reports, from processes that answer with their stack
and from one that is stopped."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

from bert_pretrain.distributed import ranks as ranks_lib
from bert_pretrain.distributed import stacks
from conftest import ROOT

# A rank stand-in: arms the stack signal, writes its heartbeat, then waits inside
# a function whose name the report must show.
CHILD = """
import os, sys, time
from bert_pretrain.distributed import stacks
folder, rank = sys.argv[1], int(sys.argv[2])
stacks.arm(folder, rank)
with open(os.path.join(folder, "rank-%d" % rank), "w") as f:
  f.write(stacks.heartbeat_text(os.getpid(), 1, "update 7: the gradients' all-reduce"))
def waiting_in_the_all_reduce():
  print("ready", flush=True)
  time.sleep(600)
waiting_in_the_all_reduce()
"""


def _start(folder, rank):
  child = subprocess.Popen([sys.executable, "-c", CHILD, str(folder), str(rank)],
                           stdout=subprocess.PIPE, universal_newlines=True,
                           env=dict(os.environ, PYTHONPATH=ROOT))
  assert child.stdout.readline().strip() == "ready"
  return child


def test_each_rank_of_the_host_reports_its_stack_and_a_stopped_one_its_last_heartbeat(
    tmp_path):
  folder = tmp_path / ".ranks"
  folder.mkdir()
  children = [_start(folder, 0), _start(folder, 1)]
  try:
    os.kill(children[1].pid, signal.SIGSTOP)
    started = time.time()
    written = stacks.write_reports(str(folder), str(tmp_path), 3, seen_by=0, stalled=[1],
                                   since=started - 60, wait_s=2.0)
    # Rank 2 never wrote a heartbeat: nothing to report of it.
    assert sorted(written) == [0, 1]
    assert written[0] == str(tmp_path / "stall-rank-0.txt")
    answered = (tmp_path / "stall-rank-0.txt").read_text()
    stopped = (tmp_path / "stall-rank-1.txt").read_text()
    print(answered, stopped)
    assert answered.startswith("rank 0 (pid %d on " % children[0].pid)
    assert re.search(r"seen by rank 0 at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: running$",
                     answered.splitlines()[0]), answered
    assert "doing: update 7: the gradients' all-reduce" in answered
    assert "in waiting_in_the_all_reduce" in answered
    assert "stalled, its last heartbeat" in stopped.splitlines()[0]
    assert "doing at its last heartbeat: update 7: the gradients' all-reduce" in stopped
    assert "no answer to SIGUSR2 within 2 s" in stopped
    assert "waiting_in_the_all_reduce" not in stopped
    assert time.time() - started < 10
  finally:
    for child in children:
      child.kill()
      child.wait()


def test_a_heartbeat_says_pid_host_and_what_the_rank_does():
  text = stacks.heartbeat_text(42, 3, "evaluation after update 8")
  pid, host, doing = stacks.parse_heartbeat(text)
  assert (pid, host, doing) == (42, socket.gethostname(), "evaluation after update 8")
  assert stacks.parse_heartbeat("done\n") is None


def test_a_heartbeat_left_by_an_earlier_run_or_naming_another_process_gets_no_signal(
    tmp_path):
  # Another program under a pid a heartbeat names (pids are reused): the signal's
  # default action would end it.
  folder = tmp_path / ".ranks"
  folder.mkdir()
  other = subprocess.Popen(["sleep", "60"])
  try:
    (folder / "rank-0").write_text(stacks.heartbeat_text(other.pid, 5, "update 3: ..."))
    (folder / "rank-1").write_text(stacks.heartbeat_text(other.pid, 5, "update 3: ..."))
    os.utime(str(folder / "rank-1"), (time.time() - 600, time.time() - 600))
    written = stacks.write_reports(str(folder), str(tmp_path), 2, seen_by=1, stalled=[0],
                                   since=time.time() - 60, wait_s=0.5)
    assert sorted(written) == [0]  # rank 1's heartbeat is from before the job
    assert other.poll() is None  # not signalled
    assert ("(no stack: pid %d is gone or not armed for SIGUSR2)" % other.pid) in (
        tmp_path / "stall-rank-0.txt").read_text()
  finally:
    other.kill()
    other.wait()


# A rank stand-in whose dump takes a while between its first thread and its last, as
# faulthandler's can on a loaded machine.
SLOW_CHILD = """
import os, signal, sys, time
from bert_pretrain.distributed import stacks
folder = sys.argv[1]
def dump(*_):
  with open(os.path.join(folder, "stack-rank-0"), "a") as f:
    f.write("Thread 0x1 (most recent call first):\\n  File x, line 1 in a_worker_thread\\n")
    f.flush()
    time.sleep(0.5)
    f.write("Current thread 0x2 (most recent call first):\\n  File y, line 2 in main\\n")
signal.signal(stacks.STACK_SIGNAL, dump)
with open(os.path.join(folder, "rank-0"), "w") as f:
  f.write(stacks.heartbeat_text(os.getpid(), 1, "update 7"))
print("ready", flush=True)
time.sleep(600)
"""


def test_a_stack_whose_dump_pauses_between_threads_is_reported_whole(tmp_path):
  folder = tmp_path / ".ranks"
  folder.mkdir()
  (folder / "stack-rank-0").write_text("")
  child = subprocess.Popen([sys.executable, "-c", SLOW_CHILD, str(folder)],
                           stdout=subprocess.PIPE, universal_newlines=True,
                           env=dict(os.environ, PYTHONPATH=ROOT))
  try:
    assert child.stdout.readline().strip() == "ready"
    stacks.write_reports(str(folder), str(tmp_path), 1, seen_by=0, stalled=[],
                         since=time.time() - 60, wait_s=5.0)
    report = (tmp_path / "stall-rank-0.txt").read_text()
    assert "in a_worker_thread" in report and "in main" in report, report
  finally:
    child.kill()
    child.wait()


def test_a_peer_that_ended_at_an_error_is_named_with_it_from_this_jobs_file_only(tmp_path):
  """Ranks.stop(error=...) writes the rank's error line into its heartbeat file; a peer
  names it with its error (not as stalled), but not from a file an earlier run left."""
  folder = tmp_path / ".ranks"
  folder.mkdir()
  line = "bad TFRecord train/part-1 record 50 (byte 23468): the CRC does not match the data"
  one = ranks_lib.Ranks("none")
  one.rank, one.size, one._folder = 1, 2, str(folder)
  one.stop(error=line)
  assert (folder / "rank-1").read_text() == ranks_lib.ENDED + line + "\n"
  assert not (folder / "rank-1.tmp").exists()
  zero = ranks_lib.Ranks("none")
  zero.size, zero._folder = 2, str(folder)
  zero.stall_timeout_s = 300
  early = time.time() - 100  # a run that failed before this one started, and was fixed
  os.utime(str(folder / "rank-1"), (early, early))
  assert zero.ended_ranks() == {}
  assert zero.absent_ranks() == [1]
  zero._started -= 1  # a file system's coarse clock must not make the next file older
  one.stop(error=line)  # during this job
  assert zero.ended_ranks() == {1: line}
  assert zero.ended_ranks([0]) == {}
  one.stop(error="bad TFRecord /data/caf\udce9/part-1")  # a name that is not UTF-8
  assert zero.ended_ranks() == {1: "bad TFRecord /data/caf\\udce9/part-1"}
  one.stop(error=line)
  assert zero.ended_words(zero.ended_ranks()) == (
      "rank 1 ended at its error (%s), and the job cannot go on without it: do what it "
      "says" % line)
