"""What each rank of a stalled job was doing: output_dir/stall-rank-N.txt, one file a
rank, with the step and collective it last said it was in and its Python stack.

  arm(folder, rank)   at the start of a job: SIGUSR2 makes this process write the stacks
                      of all its threads to folder/stack-rank-N (faulthandler, so it works
                      while the main thread is stuck inside TensorFlow or a read)
  write_reports(...)  when a stall ends the job: asks every rank of this host for its
                      stack and writes the stall-rank-N.txt files

A rank that is stopped (SIGSTOP, a debugger) or frozen cannot answer; its file then says
so and keeps what its last heartbeat said (ranks.Ranks writes the heartbeats).
"""

import faulthandler
import os
import signal
import socket
import time

STACK_SIGNAL = signal.SIGUSR2
REPORT_NAME = "stall-rank-%d.txt"

_armed = []  # The open stack files: faulthandler writes to their descriptors.


def arm(folder, rank):
  """Makes STACK_SIGNAL write this process's Python stacks (every thread) to
  folder/stack-rank-<rank>, emptied now. Returns that file's path."""
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, "stack-rank-%d" % rank)
  stack_file = open(path, "w")
  faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
  _armed.append(stack_file)
  return path


def heartbeat_text(pid, beats, doing):
  """A heartbeat file's content: "pid beats host", then what the rank is doing."""
  return "%d %d %s\n%s\n" % (pid, beats, socket.gethostname(), doing)


def parse_heartbeat(content):
  """(pid, host, doing) of a heartbeat_text; None for another content ("done")."""
  head, _, doing = content.partition("\n")
  words = head.split()
  if len(words) != 3 or not words[0].isdigit():
    return None
  return int(words[0]), words[2], doing.strip()


def write_reports(folder, output_dir, size, seen_by, stalled, since, wait_s=3.0):
  """Asks each rank of this host for its stack (STACK_SIGNAL, to its pid in its
  heartbeat), waits up to wait_s for the answers, and writes output_dir/stall-rank-N.txt
  for those ranks and for the stalled ones of other hosts.

  Args:
    folder: the heartbeat folder (output_dir/.ranks).
    output_dir: where the reports go.
    size: the number of ranks.
    seen_by: the rank writing the reports.
    stalled: the ranks named as stalled.
    since: heartbeats written before this time (time.time()) were left by an earlier
      run: their pid may be another process now, which the signal would end.
    wait_s: how long to wait for the stacks.

  Returns:
    The paths written, by rank.
  """
  host = socket.gethostname()
  beats = {}
  for rank in range(size):
    try:
      with open(os.path.join(folder, "rank-%d" % rank)) as f:
        content = f.read()
      written = os.path.getmtime(os.path.join(folder, "rank-%d" % rank))
    except OSError:
      continue
    age = time.time() - written
    beat = parse_heartbeat(content)
    if written < since:
      continue
    if beat is not None:
      beats[rank] = beat + (age,)
  asked = {}
  for rank, (pid, rank_host, _, _) in sorted(beats.items()):
    if rank_host != host or not _runs_bert_pretrain(pid):
      continue
    stack_path = os.path.join(folder, "stack-rank-%d" % rank)
    try:
      done = os.path.getsize(stack_path)
      os.kill(pid, STACK_SIGNAL)
      asked[rank] = (stack_path, done)
    except OSError:
      pass
  deadline = time.time() + wait_s
  while time.time() < deadline and any(_size(p) <= done for p, done in asked.values()):
    time.sleep(0.1)
  time.sleep(0.2)  # a dump being written finishes
  written = {}
  for rank, (pid, rank_host, doing, age) in sorted(beats.items()):
    if rank_host != host and rank not in stalled:
      continue  # Its own host's ranks write it.
    lines = ["rank %d (pid %d on %s), seen by rank %d: %s" % (
        rank, pid, rank_host, seen_by,
        "stalled, its last heartbeat %.0f s ago" % age if rank in stalled else "running"),
             "doing: %s" % (doing or "(not said)")]
    if rank in asked:
      stack_path, done = asked[rank]
      with open(stack_path) as f:
        f.seek(done)
        stack = f.read().strip()
      lines.append("Python stack of each thread (most recent call first):")
      lines.append(stack or "(no answer to SIGUSR2 within %.0f s: the process is stopped "
                   "(SIGSTOP, a debugger) or frozen)" % wait_s)
    elif rank_host == host:
      lines.append("(no stack: pid %d no longer runs bert_pretrain)" % pid)
    else:
      lines.append("(no stack: the rank runs on %s; its own host's ranks write it)"
                   % rank_host)
    path = os.path.join(output_dir, REPORT_NAME % rank)
    try:
      with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
      os.replace(path + ".tmp", path)
      written[rank] = path
    except OSError:
      pass  # The error line still names the stalled rank.
  return written


def _runs_bert_pretrain(pid):
  """Whether process `pid` runs this package (its command line names it): only such a
  process has the signal armed."""
  try:
    with open("/proc/%d/cmdline" % pid, "rb") as f:
      return b"bert_pretrain" in f.read()
  except OSError:
    return False


def _size(path):
  try:
    return os.path.getsize(path)
  except OSError:
    return 0
