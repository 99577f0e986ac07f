"""The launch plan of run_multi_card_FPS.sh: hosts, ranks per host and horovodrun's arguments.

The number of ranks per host (IX_NUM_CUDA_VISIBLE_DEVICES, as in the anchor recipe) comes from
the script; the hosts come from HOROVOD_RUN_ARGS (`-H h1:8,h2:8`, `-H h1,h2`, `--hosts=...`,
`--hostfile F` in Horovod's format `host slots=N`). The plan gives horovodrun a total -np and
a host list that agree with each other and with the count per host; any contradiction is an
error before anything starts. horovodrun (or mpirun under it) does the launching.

  python3 -m bert_pretrain.launch PER_HOST
prints the summary line, then horovodrun's arguments one a line, with HOROVOD_RUN_ARGS read
from the environment; on a contradiction it prints a one-line error and exits 2.
"""

import collections
import os
import re
import shlex
import sys

Plan = collections.namedtuple("Plan", ["ranks", "hosts", "per_host", "args"])

_HOST = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*)(?::([0-9]+))?$")
_OPTIONS = {"-H": "hosts", "--hosts": "hosts", "--hostfile": "hostfile",
            "-np": "np", "--num-proc": "np"}


class LaunchError(ValueError):
  """A host list that contradicts itself or the count per host; the text names the fix."""


def _split_options(run_args):
  """Takes -H/--hosts, --hostfile and -np/--num-proc (`-H X`, `-H=X`, `--hosts=X`) out of
  run_args; returns ({"hosts"|"hostfile"|"np": value}, the other arguments in order)."""
  found, rest, i = {}, [], 0
  while i < len(run_args):
    arg = run_args[i]
    name, value = arg.split("=", 1) if "=" in arg else (arg, None)
    if name not in _OPTIONS:
      rest.append(arg)
      i += 1
      continue
    if value is None:
      if i + 1 >= len(run_args):
        raise LaunchError("%s in HOROVOD_RUN_ARGS has no value; give it one, e.g. "
                          "-H h1:8,h2:8 or --hostfile hosts.txt" % name)
      value = run_args[i + 1]
      i += 1
    key = _OPTIONS[name]
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


def plan(run_args, per_host):
  """The job horovodrun is to start.

  Args:
    run_args: list of str, HOROVOD_RUN_ARGS split like a shell does (e.g. ["--gloo", "-H",
      "h1:8,h2:8"]); no hosts means this machine alone (localhost).
    per_host: int, ranks (cards) per host.

  Returns:
    Plan(ranks=total ranks, hosts=list of host names, per_host, args=horovodrun's arguments:
    -np TOTAL -H h1:C,h2:C, then the other arguments of run_args in their order).

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
                        "export IX_NUM_CUDA_VISIBLE_DEVICES=%d or give %s:%d"
                        % (host, slots, where, per_host, slots, host, per_host))
  ranks = per_host * len(hosts)
  if "np" in found and found["np"] != str(ranks):
    raise LaunchError("-np %s in HOROVOD_RUN_ARGS but %d hosts x %d per host = %d ranks; drop -np "
                      "(the script computes it) or change the hosts" % (found["np"], len(hosts),
                                                                        per_host, ranks))
  host_list = ",".join("%s:%d" % (host, per_host) for host in names)
  return Plan(ranks, names, per_host, ["-np", str(ranks), "-H", host_list] + rest)


def summary(job):
  """'Launching 16 ranks on 2 hosts (8 per host)'."""
  return "Launching %d rank%s on %d host%s (%d per host)" % (
      job.ranks, "" if job.ranks == 1 else "s", len(job.hosts),
      "" if len(job.hosts) == 1 else "s", job.per_host)


def main(argv):
  if len(argv) != 2 or not re.match(r"^[1-9][0-9]*$", argv[1]):
    print("usage: python3 -m bert_pretrain.launch RANKS_PER_HOST", file=sys.stderr)
    return 2
  try:
    try:
      run_args = shlex.split(os.environ.get("HOROVOD_RUN_ARGS") or "--gloo")
    except ValueError as e:
      raise LaunchError("HOROVOD_RUN_ARGS cannot be split into arguments (%s); check its "
                        "quotes" % e)
    job = plan(run_args, int(argv[1]))
  except LaunchError as e:
    print("run_multi_card_FPS: error: %s" % e, file=sys.stderr)
    return 2
  print("\n".join([summary(job)] + job.args))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
