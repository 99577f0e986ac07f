"""horovodrun run in this process (Horovod's own run_commandline), and how its job ended
told in one last line: the rank that failed first with its error line, the signal the
job stopped at, a rank a kill or a crash ended.

  run_horovodrun(args, run_commandline, launcher_stop)  the job's exit status
  RankErrors                                            what the ranks' lines said
"""

import re
import signal
import sys

from bert_pretrain import errors


class _Read(object):
  """A text stream in front of another that passes everything on to it and to a reader."""

  def __init__(self, stream, reader):
    self.stream, self.reader = stream, reader

  def write(self, text):
    self.reader.read(text)
    return self.stream.write(text)

  def __getattr__(self, name):
    return getattr(self.stream, name)


class RankErrors(_Read):
  """A text stream in front of sys.stderr that passes everything on and keeps each rank's
  last error line, the signal a rank said it stops at, and whether the chief stopped
  with its peers gone (loop.last_barrier) or ended its stop after saving (loop.finish;
  that line from sys.stdout, through watching): horovodrun --gloo writes the ranks' lines
  as "[N]<stderr>:line" or "[N]<stdout>:line", each in one write."""

  _LINE = re.compile(r"^\[(\d+)\]<stderr>:(.*\berror: .*)$")
  _STOP = re.compile(r"^\[\d+\]<stderr>:\S+: (SIG[A-Z]+) received: finishing")
  _CHIEF_ALONE = re.compile(r"^\[0\]<stderr>:SIG[A-Z]+: rank 0: other ranks ended before "
                            r"the last barrier")
  _CHIEF_SAVED = re.compile(r"^\[0\]<stdout>:report: not drawn after SIG[A-Z]+;")
  _RESUME = re.compile(r"^\[0\]<stdout>:SIG[A-Z]+: rank 0 stops after step \d+; to resume, "
                       r"run the same command with (--output_dir=.*)$")

  def __init__(self, stream):
    super(RankErrors, self).__init__(stream, self)
    self.errors = {}  # rank -> its last line with "error: "
    self.stop_signal = None  # the signal a rank stops at (signals.py), e.g. "SIGTERM"
    self.chief_alone = False  # rank 0 saved at the stop, then found its peers gone
    self.chief_saved = False  # rank 0 saved at the stop and ended it
    self.output_dir_flag = None  # --output_dir=... that rank 0 said a resume needs

  def read(self, text):
    for line in text.splitlines():
      match = self._LINE.match(line)
      if match:
        self.errors[int(match.group(1))] = match.group(2).strip()
      stop = self._STOP.match(line)
      if stop and self.stop_signal is None:
        self.stop_signal = stop.group(1)
      self.chief_alone = self.chief_alone or bool(self._CHIEF_ALONE.match(line))
      self.chief_saved = self.chief_saved or bool(self._CHIEF_SAVED.match(line))
      resume = self._RESUME.match(line)
      if resume:
        self.output_dir_flag = resume.group(1)

  def watching(self, stream):
    """stream, whose text this also reads."""
    return _Read(stream, self)


def run_horovodrun(args, run_commandline, launcher_stop=lambda: None):
  """Runs horovodrun ARGS in this process; returns its exit status.

  Args:
    args: horovodrun's arguments (after the word horovodrun).
    run_commandline: horovod.runner.launch.run_commandline.
    launcher_stop: returns the first stop signal the launcher got (StopRanksFirst.signum,
      passed on to the ranks as SIGTERM), or None: the job's signal, when there is one.

  Returns:
    0; 128 + the signal for a job its ranks stopped at a signal; 2 for arguments
    horovodrun refuses; or the exit status of the rank that failed first, after a last
    line naming it with its error line.
  """
  rank_errors, argv, stdout = RankErrors(sys.stderr), sys.argv, sys.stdout
  sys.argv, sys.stderr = ["horovodrun"] + list(args), rank_errors
  sys.stdout = rank_errors.watching(stdout)
  try:
    run_commandline()
    # horovodrun can return normally for ranks it killed after its 5 s grace (its
    # middleman reaps their shell before Popen.wait does, which then reads 0).
    stop = _job_stop(rank_errors, launcher_stop)
    return 128 + stop if stop else 0
  except ValueError as e:
    # horovodrun's own checks (a --network-interface this host lacks, say), before any rank.
    sys.stderr, sys.stdout = rank_errors.stream, stdout
    message = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")
    errors.print_error("horovodrun", "%s; check HOROVOD_RUN_ARGS%s" % (message, (
        " (its --network-interface: ip -brief address lists this host's)"
        if "interface" in message else "")))
    return 2
  except RuntimeError as e:
    failed = re.search(r"Process name: (\d+)\s+Exit code: (-?\d+)", str(e))
    sys.stderr, sys.stdout = rank_errors.stream, stdout
    if not failed:
      errors.print_error("horovodrun", str(e).strip().splitlines()[0])
      return 1
    rank, status = int(failed.group(1)), int(failed.group(2))
    stop = _job_stop(rank_errors, launcher_stop)
    if stop and not rank_errors.errors and (rank_errors.chief_alone or
                                            rank_errors.chief_saved):
      # Rank 0 saved at the agreed update, and ended its stop or found the others gone
      # (under horovodrun --gloo the ranks of other hosts end with their ssh session).
      passed_on = errors.signal_name(stop) != rank_errors.stop_signal
      # A demo's folder is the launch's own: the same command would start a new one.
      named = any(arg == "--output_dir" or arg.startswith("--output_dir=") for arg in args)
      print("rank %d exited with status %d after the job's %s%s; run the same command again"
            "%s to resume from its last checkpoint" % (
                rank, status, errors.signal_name(stop),
                " (passed on to the ranks as %s)" % rank_errors.stop_signal if passed_on
                else "", " with " + rank_errors.output_dir_flag
                if rank_errors.output_dir_flag and not named else ""), file=sys.stderr)
      return 128 + stop
    cause = _ended_by_itself(status)  # a kill or a crash: this rank's, not a peer's error
    if rank not in rank_errors.errors and rank_errors.errors and not cause:
      # The first to exit can be a peer of the rank that failed: name the one that said.
      failing = min(rank_errors.errors)
      print("rank %d %s; rank %d: %s" % (rank, _how_it_ended(status), failing,
                                         rank_errors.errors[failing]), file=sys.stderr)
      return status if 0 < status < 128 else 1
    print("rank %d %s%s" % (rank, _how_it_ended(status), ": " + rank_errors.errors[rank]
                            if rank in rank_errors.errors else "; its lines are above"),
          file=sys.stderr)
    if cause:
      return 128 + cause  # as a shell says a command a signal ended
    return status if 0 < status < 256 else 1
  finally:
    sys.argv, sys.stderr, sys.stdout = argv, rank_errors.stream, stdout


def _job_stop(rank_errors, launcher_stop):
  """The signal number a job stopped at: the launcher's, else the one its ranks said they
  stopped at; None for a job no rank said it stopped."""
  if not rank_errors.stop_signal:
    return None
  return launcher_stop() or getattr(signal, rank_errors.stop_signal)


# The signals that end a rank by themselves (a kill, a crash), not as a peer's end does:
# the rank they end is the job's cause.
_CAUSE_SIGNALS = (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE,
                  signal.SIGABRT)


def _ended_by_itself(status):
  """The signal of _CAUSE_SIGNALS that ended a rank of exit status `status` (horovodrun's
  negative one, or 128 + it from the rank's shell under Gloo); None for another end."""
  signum = -status if status < 0 else status - 128
  return signum if signum in _CAUSE_SIGNALS else None


def _how_it_ended(status):
  """'exited with status 2', or for a rank a signal ended (horovodrun's negative status;
  128 + a crash's or SIGKILL's from its shell) 'was ended by SIGKILL (the OOM killer or
  kill -9: dmesg says which)'."""
  if _ended_by_itself(status):
    status = -_ended_by_itself(status)
  if status >= 0:
    return "exited with status %d" % status
  return "was ended by %s%s" % (errors.signal_name(-status), " (the OOM killer or kill -9: "
                                "dmesg says which)" if -status == signal.SIGKILL else "")
