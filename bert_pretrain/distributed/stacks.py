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


def write_heartbeat(folder, rank, content):
  """Replaces rank's heartbeat file in folder with `content` in one step (a reader never
  sees half of it); raises OSError."""
  path = os.path.join(folder, "rank-%d" % rank)
  with open(path + ".tmp", "w", encoding="utf-8", errors="backslashreplace") as f:
    f.write(content)
  os.replace(path + ".tmp", path)


def read_heartbeat(folder, rank):
  """(content, time written) of rank's heartbeat file in folder; None when there is none."""
  path = os.path.join(folder, "rank-%d" % rank)
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      content = f.read()
    return content, os.path.getmtime(path)
  except OSError:
    return None


def parse_heartbeat(content):
  """(pid, host, doing) of a heartbeat_text; None for another content ("done")."""
  head, _, doing = content.partition("\n")
  words = head.split()
  if len(words) != 3 or not words[0].isdigit():
    return None
  return int(words[0]), words[2], doing.strip()


def write_reports(folder, output_dir, size, seen_by, stalled, since, wait_s=3.0):
  """Asks each rank of this host for its stack (STACK_SIGNAL, to its pid in its
  heartbeat), waits up to wait_s for the answers and then, up to wait_s more, until they
  have not grown for a second, and writes output_dir/stall-rank-N.txt for those ranks
  and for the stalled ones of other hosts.

  Args:
    folder: the heartbeat folder (output_dir/.ranks).
    output_dir: where the reports go.
    size: the number of ranks.
    seen_by: the rank writing the reports.
    stalled: the ranks named as stalled.
    since: heartbeats written before this time (time.time()) were left by an earlier
      run: their pid may be another process now, which the signal would end.
    wait_s: how long to wait for the stacks to start, and to finish.

  Returns:
    The paths written, by rank.
  """
  host = socket.gethostname()
  beats = {}
  for rank in range(size):
    heartbeat = read_heartbeat(folder, rank)
    beat = parse_heartbeat(heartbeat[0]) if heartbeat else None
    if beat is not None and heartbeat[1] >= since:
      beats[rank] = beat + (time.time() - heartbeat[1],)
  asked = {}
  for rank, (pid, rank_host, _, _) in sorted(beats.items()):
    if rank_host != host or not _catches_stack_signal(pid):
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
  # A dump is written thread by thread, the main thread last: read it once its size has
  # held for a second.
  sizes = None
  while asked and time.time() < deadline + wait_s:
    now = [_size(p) for p, _ in asked.values()]
    if now == sizes:
      break
    sizes = now
    time.sleep(1.0)
  written = {}
  for rank, (pid, rank_host, doing, age) in sorted(beats.items()):
    path = os.path.join(output_dir, REPORT_NAME % rank)
    if rank_host != host and (rank not in stalled or os.path.exists(path)):
      continue  # Its own host's ranks write it, with its stack.
    # The time tells a report of this stall from one an earlier run of the folder left.
    lines = ["rank %d (pid %d on %s), seen by rank %d at %s: %s" % (
        rank, pid, rank_host, seen_by, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "stalled, its last heartbeat %.0f s ago" % age if rank in stalled else "running"),
             # A heartbeat is written every few seconds: a stalled rank's can be behind.
             "doing%s: %s" % (" at its last heartbeat" if rank in stalled else "",
                              doing or "(not said)")]
    if rank in asked:
      stack_path, done = asked[rank]
      with open(stack_path) as f:
        f.seek(done)
        stack = f.read().strip()
      lines.append("Python stack of each thread (most recent call first):")
      lines.append(stack or "(no answer to SIGUSR2 within %.0f s: the process is stopped "
                   "(SIGSTOP, a debugger) or frozen)" % wait_s)
    elif rank_host == host:
      lines.append("(no stack: pid %d is gone or not armed for SIGUSR2)" % pid)
    else:
      lines.append("(no stack: the rank runs on %s; its own host's ranks write it)"
                   % rank_host)
    # Each rank that sees the stall writes: a temporary file of its own, the last wins.
    temporary = "%s.tmp-%d" % (path, os.getpid())
    try:
      with open(temporary, "w") as f:
        f.write("\n".join(lines) + "\n")
      os.replace(temporary, path)
      written[rank] = path
    except OSError:
      pass  # The error line still names the stalled rank.
  return written


def _catches_stack_signal(pid):
  """Whether process `pid` has a handler for STACK_SIGNAL (SigCgt in /proc): an armed
  rank does, a reused pid most likely not, and the signal would end it."""
  try:
    with open("/proc/%d/status" % pid) as f:
      for line in f:
        if line.startswith("SigCgt:"):
          return bool(int(line.split()[1], 16) >> (STACK_SIGNAL - 1) & 1)
  except (OSError, ValueError):
    pass
  return False


def _size(path):
  try:
    return os.path.getsize(path)
  except OSError:
    return 0
