"""One-line messages for OS errors, shared by the command-line tools.

run_pretraining, run_classifier, export, create_pretraining_data, the demo and the
Wikipedia pipeline print `TOOL: error: <os_error_message(e)>` for an OSError or a
TensorFlow file error (a read-only disk, a missing file, a folder where a file should
be, a full disk) instead of a traceback. No TensorFlow import here: the pipeline's main
process runs without it.
"""

import contextlib
import errno
import os
import re
import signal
import sys
import tempfile
import threading

# What to do about an OS error, by errno.
_FIXES = {
    errno.EROFS: "pass paths on a disk you can write to",
    errno.EACCES: "check its permissions, or pass paths you can read and write",
    errno.EPERM: "check its permissions, or pass paths you can read and write",
    errno.ENOENT: "check the path",
    errno.EISDIR: "it is a folder: pass a file there",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.EEXIST: "a file of that name is in the way: pass another path",
}
# TensorFlow's file errors carry no errno; the words of their message tell.
_WORDS = (("Read-only file system", errno.EROFS), ("Permission denied", errno.EACCES),
          ("Is a directory", errno.EISDIR), ("Not a directory", errno.ENOTDIR),
          ("No such file or directory", errno.ENOENT), ("File exists", errno.EEXIST))


def is_disk_full(error):
  """Whether an exception, TensorFlow's or Python's, means "No space left on device"."""
  if isinstance(error, EnvironmentError) and error.errno == errno.ENOSPC:
    return True
  return "No space left on device" in str(getattr(error, "message", None) or error)


def is_file_error(error):
  """Whether an exception is an OSError or a TensorFlow error about a file (its message
  names a read-only disk, a missing file, a folder where a file should be...)."""
  if isinstance(error, EnvironmentError) or is_disk_full(error):
    return True
  message = str(getattr(error, "message", None) or "")
  return any(words in message for words, _ in _WORDS)


def os_error_message(error, disk_full=None):
  """One line for an OSError or a TensorFlow file error (tf.errors.OpError): the file,
  what went wrong and what to do.

  Args:
    error: the exception.
    disk_full: (optional) function of what was being written (a file name) -> the
      tool's line for a full disk (run_pretraining's names its checkpoints); default:
      free space and run the same command again.

  Returns:
    str, one line.
  """
  if isinstance(error, EnvironmentError):
    number, text, filename = error.errno, error.strerror or str(error), error.filename
  else:
    lines = [l.strip() for l in (getattr(error, "message", None) or str(error)).splitlines()
             if l.strip()] or [type(error).__name__]
    # In a session's error the file's line may follow "Graph execution error:".
    text = next((l for l in lines for words, _ in _WORDS if words in l), lines[0])
    number = next((n for words, n in _WORDS if words in text), None)
    filename = None
  if is_disk_full(error):
    what = filename or "its files"
    if disk_full is not None:
      return disk_full(what)
    try:
      stat = os.statvfs(os.path.dirname(os.path.abspath(filename)) if filename else ".")
      free = ", %.1f MB free" % (stat.f_bavail * stat.f_frsize / 1e6)
    except OSError:
      free = ""
    return ("the disk is full (no space left on the device%s) while writing %s; free space "
            "there and run the same command again" % (free, what))
  what = "%s: %s" % (filename, text) if filename else text
  fix = _FIXES.get(number)
  return "%s; %s" % (what, fix) if fix else what


def unwritable_folder(folder):
  """Why files cannot be made in the local folder (made as needed), known before any is:
  None when they can, else the reason at the nearest part of it that exists, with the
  fix ("/d is a file, not a folder; pass another path", or os_error_message's)."""
  above = os.path.abspath(folder)
  while not os.path.exists(above):
    above = os.path.dirname(above)
  if not os.path.isdir(above):
    return "%s is a file, not a folder; pass another path" % above
  if not os.access(above, os.W_OK | os.X_OK):
    number = errno.EROFS if os.statvfs(above).f_flag & os.ST_RDONLY else errno.EACCES
    return os_error_message(OSError(number, os.strerror(number), above))
  try:  # what access() cannot tell (/proc, a squashed root on NFS): a file, unnamed or gone
    tempfile.TemporaryFile(dir=above).close()
  except OSError as e:
    return "%s: no file can be made there (%s); pass another path" % (above, e.strerror)
  return None


def signal_name(signum):
  """SIGTERM for 15; "signal N" for a number that names no signal."""
  try:
    return signal.Signals(signum).name
  except ValueError:
    return "signal %d" % signum


def print_error(tool, message):
  """Prints `TOOL: error: MESSAGE` to stderr in one write: Python 3.7's stderr writes
  each piece of a print at once, and mpirun --tag-output would tag the newline apart."""
  sys.stderr.write("%s: error: %s\n" % (tool, message))
  sys.stderr.flush()


def usage_error(tool, message):
  """Prints `TOOL: error: MESSAGE` and exits with status 2: what absl's app.UsageError
  does, without the module's help that it prints first and that hides the line."""
  print_error(tool, message)
  sys.exit(2)


def require_flags(tool, flag_values, wanted):
  """usage_error naming the first flag of `wanted` ((name, what to pass) pairs) that is
  not given: absl's required flags print two lines and exit 1."""
  for name, what in wanted:
    if flag_values[name].value is None:  # an empty one: the tool says what it needs
      usage_error(tool, "--%s is required; pass %s" % (name, what))


def make_output_folders(tool, flag, folder, subfolders=()):
  """Makes `folder` and its subfolders and writes a file in each, or usage_error in one
  line naming the folder: a bad path (under a file, in /proc, read-only) is said before
  any work, not by a traceback once the work is done."""
  for path in [folder] + [os.path.join(folder, sub) for sub in subfolders]:
    try:
      os.makedirs(path, exist_ok=True)
      probe = os.path.join(path, ".write-test-%d" % os.getpid())
      with open(probe, "w"):
        pass
      os.remove(probe)
    except OSError as e:
      usage_error(tool, "%s=%s: cannot write %s (%s); pass a folder you can write to" % (
          flag, folder, e.filename or path, e.strerror or e))


def run_main(tool, main):
  """absl's app.run(main), with a bad command line (an unknown flag, a value of the wrong
  kind, a required flag missing) one line `TOOL: error: ...` and exit status 2, the
  status of bad input for the tools whose 1 says what they found (absl exits 1). A reader
  that stops reading (`| head`) ends the tool as it ends a C tool: quietly, 128 + SIGPIPE.
  `kill -USR2 <pid>` prints the tool's Python stacks and lets it go on (processes.arm_stacks)."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  # processes imports this module: imported here, not at the top.
  from bert_pretrain import processes  # pylint: disable=g-import-not-at-top

  def parse(argv):
    try:
      return flags.FLAGS(argv)
    except flags.UnrecognizedFlagError as e:
      usage_error(tool, unknown_flag_text(None, e.flagname, argv[1:], str(e)))
    except flags.Error as e:
      usage_error(tool, "%s; --helpfull lists the flags"
                  % str(e).splitlines()[0].rstrip("."))

  def main_until_the_reader_stops(argv):
    try:
      status = main(argv)
      sys.stdout.flush()  # what a pipe's buffer holds, written here, not at exit
      return status
    except BrokenPipeError:
      # What is left to print, and the flush at exit, go nowhere (not into a traceback).
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
      return 128 + signal.SIGPIPE

  processes.arm_stacks()
  app.run(main_until_the_reader_stops, flags_parser=parse)


def unknown_flag_text(tool, name, args, absl_message):
  """`TOOL has no flag --NAME; did you mean --A or --B?` for absl's UnrecognizedFlagError
  (its message holds the guesses), the flag spelled as in `args`; `no flag ...` when
  tool is None (the line names it already)."""
  spelled = next((word.split("=", 1)[0] for word in args
                  if word.startswith("-") and word.split("=", 1)[0].lstrip("-") == name),
                 "--" + name)
  guesses = re.search(r"Did you mean: (.+?) ?\?", absl_message)
  subject = "%s has" % tool if tool else "there is"
  if not guesses:
    return "%s no flag %s; --helpfull lists %s flags" % (subject, spelled,
                                                          "its" if tool else "the")
  return "%s no flag %s; did you mean %s?" % (
      subject, spelled, " or ".join("--" + guess for guess in guesses.group(1).split(", ")))


def unexpected_arguments(tool, arguments):
  """usage_error for words on the command line that are no flag, such as the `false` of
  `--amp false` (a true/false flag takes no value) or a path without its --flag=."""
  usage_error(tool, unexpected_arguments_text(arguments))


def unexpected_arguments_text(arguments):
  """unexpected_arguments' message."""
  return ("unexpected arguments: %s; pass everything as --flags: --name=value, and a "
          "true/false flag as --name or --noname (e.g. --noamp)" % " ".join(arguments))


class Terminated(KeyboardInterrupt):
  """SIGTERM in a tool's main process (take_stop_signals): raised as Ctrl-C's
  KeyboardInterrupt is, so the same cleanup runs (temporary files, worker processes)."""


def stopped_by_signal(tool, error, fix, stream=None):
  """Says `TOOL: terminated (SIGTERM); FIX` for Terminated, `TOOL: interrupted; FIX` for
  Ctrl-C's KeyboardInterrupt; returns the exit status a shell gives a process the signal
  ended, so a scheduler or a script still sees what ended it: 128 + 15, or 128 + 2."""
  stream = stream or sys.stderr
  # A Ctrl-C raised in code exec/eval ran from a string (dataclasses, namedtuple) makes
  # Python 3.8+ die of SIGINT at exit whatever status -m returns; a string exec clears it.
  exec("")  # pylint: disable=exec-used
  if isinstance(error, Terminated):
    stream.write("%s: terminated (SIGTERM); %s\n" % (tool, fix))
    return 128 + signal.SIGTERM
  stream.write("%s: interrupted; %s\n" % (tool, fix))
  return 128 + signal.SIGINT


def take_stop_signals():
  """Makes SIGTERM raise Terminated in this process, once (a second one must not cut the
  cleanup short; a forked child that has not set its own handler dies as by default),
  and SIGINT raise KeyboardInterrupt even when the tool started with it ignored: a
  script's `&` starts it so, and a kill -INT to it is meant (run_pretraining's way)."""
  if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  main_pid = os.getpid()

  def handler(signum, unused_frame):
    if os.getpid() != main_pid:
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    signal.signal(signum, signal.SIG_IGN)
    raise Terminated()

  signal.signal(signal.SIGTERM, handler)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stops_held():
  """Holds Ctrl-C and SIGTERM while the block runs (a fork), then acts on the first that
  came (the tool is stopping; a second would cut its cleanup short).

  Python drops an exception raised in an at-fork callback, such as logging's, which runs
  in every os.fork (multiprocessing's too) and every Popen with a preexec_fn: a stop whose
  handler ran there would be lost. Blocked in this thread, a stop waits; one the kernel
  gives another thread is recorded instead. A child forked in the block starts with the
  stops blocked and recorded: a Popen's preexec_fn calls stops_to_default().
  """
  came, handlers, released = [], {}, []

  def hold(signum, frame):
    if not released:
      came.append((signum, frame))
      return
    if signal.getsignal(signum) is hold:  # left by a stop that came as they were put back
      signal.signal(signum, handlers[signum])
    handlers[signum](signum, frame)

  # Handlers swapped before the mask, and the mask restored before them, so that a stop
  # at any point between is recorded or acted on, never left blocked. Another handler
  # (any signal's) may raise as the mask changes: the rest is done all the same.
  mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
  try:
    if threading.current_thread() is threading.main_thread():
      for signum in STOP_SIGNALS:
        handler = signal.getsignal(signum)
        if callable(handler):
          handlers[signum] = handler
          signal.signal(signum, hold)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    yield
  finally:
    try:
      signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    finally:
      released.append(True)
      for signum, handler in handlers.items():
        # Not over what a stop's handler set meanwhile (take_stop_signals's SIG_IGN).
        if signal.getsignal(signum) is hold:
          signal.signal(signum, handler)
      for signum, frame in came[:1]:
        handlers[signum](signum, frame)


def stops_to_default():
  """In a child forked in stops_held() (a Popen's preexec_fn): Ctrl-C and SIGTERM end it
  as by default until its exec (one ignored stays ignored), and are no longer held."""
  for signum in STOP_SIGNALS:
    if callable(signal.getsignal(signum)):
      signal.signal(signum, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
