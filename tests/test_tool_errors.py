"""The command-line tools turn OS errors into one line: a read-only disk, an output path
that is a file, an input that is also an output. No traceback, a non-zero exit status,
the file named (bert_pretrain/errors.py maps them)."""

import ast
import errno
import glob
import os
import shlex
import subprocess
import sys

import pytest

from bert_pretrain import demo
from bert_pretrain import errors
from bert_pretrain.model import modeling
from bert_pretrain.data import tokenization
from conftest import (PREDICTIONS, ROOT, SAMPLE_TEXT, SEQ_LENGTH, TINY_CONFIG, base_flags,
                      tool_env)

WIKI_SAMPLE = os.path.join(ROOT, "tests", "data", "wiki_sample.xml")


def read_only(folder):
  """Makes `folder` read-only for a command run after the returned words: a read-only
  tmpfs mounted there in a mount namespace of the command's own (root only; the test
  process sees the folder as it was), or for a user, the folder's mode 555.

  Returns:
    list of words to put before the command (none for a user).
  """
  os.makedirs(folder, exist_ok=True)
  if os.geteuid() != 0:
    os.chmod(folder, 0o555)
    return []
  mount = "mount -t tmpfs -o ro none %s" % shlex.quote(folder)
  if subprocess.run(["unshare", "-m", "sh", "-c", mount]).returncode != 0:
    pytest.skip("root without mount namespaces (unshare -m): no read-only disk to test on")
  return ["unshare", "-m", "sh", "-c", mount + ' && exec "$@"', "sh"]


@pytest.fixture(scope="module")
def model(pretraining_data, tmp_path_factory):
  """A fresh checkpoint of the tiny BERT and a plain TSV task for it."""
  root = tmp_path_factory.mktemp("model")
  prefix = str(root / "init" / "model.ckpt-0")
  demo.write_fresh_checkpoint(modeling.BertConfig.from_dict(TINY_CONFIG), prefix)
  task = root / "task"
  task.mkdir()
  rows = ["a sentence with and\tand", "a sentence without\tnone"] * 8
  for split in ("train", "dev"):
    (task / ("%s.tsv" % split)).write_text("\n".join(rows) + "\n")
  return dict(pretraining_data, init=prefix, task=str(task))


def _wiki_vocab(folder):
  path = os.path.join(folder, "wiki_vocab.txt")
  tokenization.build_wordpiece_vocab([WIKI_SAMPLE], 1500, path)
  return path


# (tool, its command given the data and a folder to write: the read-only one, or an
# input's path where an output goes).
COMMANDS = {
    "run_pretraining": lambda d, out: ["-m", "bert_pretrain.run_pretraining"] + base_flags(
        d, out + "_run", dllog_path=os.path.join(out, "dllog.json"), nodo_eval=None,
        num_train_steps=1),
    "run_classifier": lambda d, out: [
        "-m", "bert_pretrain.run_classifier", "--task_name=tsv", "--data_dir=" + d["task"],
        "--vocab_file=" + d["vocab"], "--bert_config_file=" + d["config"],
        "--init_checkpoint=" + d["init"], "--max_seq_length=%d" % SEQ_LENGTH,
        "--train_batch_size=4", "--num_train_epochs=1", "--output_dir=" + out],
    "export": lambda d, out: [
        "-m", "bert_pretrain.export", "--checkpoint=" + d["init"], "--vocab_file=" + d["vocab"],
        "--bert_config_file=" + d["config"], "--output_dir=" + os.path.join(out, "hf")],
    "create_pretraining_data": lambda d, out: [
        "-m", "bert_pretrain.create_pretraining_data", "--input_file=" + SAMPLE_TEXT,
        "--vocab_file=" + d["vocab"], "--max_seq_length=%d" % SEQ_LENGTH,
        "--max_predictions_per_seq=%d" % PREDICTIONS, "--dupe_factor=1",
        "--output_file=" + os.path.join(out, "part-0")],
    "demo": lambda d, out: ["-m", "bert_pretrain.demo", "--demo_cache_dir=" + out],
    "pack_records": lambda d, out: [
        "-m", "bert_pretrain.pack_records", "--input=" + d["train"], "--output_dir=" + out,
        "--jobs=1"],
    "prepare_wiki": lambda d, out: [
        "-m", "bert_pretrain.wiki", "--dump=" + WIKI_SAMPLE, "--vocab=" + d["wiki_vocab"],
        "--output_dir=" + out, "--jobs=1"],
}


def _run(words, cwd=None):
  # read_only's commands run in a mount namespace of their own: they must not fork.
  env = tool_env() if words[0] == sys.executable else dict(
      os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.run(words, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        universal_newlines=True, timeout=300, cwd=cwd, env=env)


def _error_line(result, tool):
  """The failed run's last line, which must be its one error line."""
  assert result.returncode != 0, result.stdout[-2000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("%s: error: " % tool), result.stderr[-3000:]
  assert [l for l in result.stderr.splitlines() if "error:" in l] == [last]
  return last


@pytest.mark.parametrize("tool", sorted(COMMANDS))
def test_a_read_only_disk_is_one_line_naming_the_file(model, tmp_path, tool):
  data = dict(model, wiki_vocab=_wiki_vocab(str(tmp_path)) if tool == "prepare_wiki" else None)
  folder = str(tmp_path / "read_only")
  prefix = read_only(folder)
  line = _error_line(_run(prefix + [sys.executable] + COMMANDS[tool](data, folder)), tool)
  assert folder in line
  assert line.endswith(("Read-only file system; pass paths on a disk you can write to",
                        "Permission denied; check its permissions, or pass paths you can "
                        "read and write")), line


def test_check_only_names_a_read_only_disk_under_the_output_folder_to_be_made(model, tmp_path):
  folder = str(tmp_path / "read_only")
  prefix = read_only(folder)
  output_dir = os.path.join(folder, "runs", "run-1")
  line = _error_line(_run(prefix + [sys.executable, "-m", "bert_pretrain.run_pretraining"] +
                          base_flags(model, output_dir, nodo_eval=None) + ["--check_only"]),
                     "run_pretraining")
  assert line.startswith("run_pretraining: error: --output_dir=%s cannot be written: %s: "
                         % (output_dir, folder)), line
  assert line.endswith(("Read-only file system; pass paths on a disk you can write to",
                        "Permission denied; check its permissions, or pass paths you can "
                        "read and write")), line


@pytest.mark.parametrize("tool", ["run_classifier", "demo", "prepare_wiki", "pack_records"])
def test_an_output_folder_that_is_an_input_file_is_one_line(model, tmp_path, tool):
  data = dict(model, wiki_vocab=_wiki_vocab(str(tmp_path)) if tool == "prepare_wiki" else None)
  an_input = {"run_classifier": os.path.join(model["task"], "train.tsv"),
              "demo": demo.CORPUS, "prepare_wiki": WIKI_SAMPLE,
              "pack_records": os.path.join(model["train"], "part-0")}[tool]
  before = open(an_input, "rb").read()
  line = _error_line(_run([sys.executable] + COMMANDS[tool](data, an_input)), tool)
  assert line.endswith("%s: File exists; a file of that name is in the way: pass another "
                       "path" % an_input), line
  assert open(an_input, "rb").read() == before


STRAY_WORDS = {
    "run_pretraining": ["bert_pretrain.run_pretraining", "--amp", "false"],
    "conformance": ["bert_pretrain.conformance", "--amp", "false"],
    "export": ["bert_pretrain.export", "--checkpoint=c", "--bert_config_file=b",
               "--vocab_file=v", "--output_dir=o", "false"],
    "benchmark": ["bench.benchmark", "--noxla", "false"],
    "benchmark_data": ["bench.benchmark_data", "--synthesize_mb=1", "false"],
    "run_classifier": ["bert_pretrain.run_classifier", "--amp", "false"],
    "create_pretraining_data": ["bert_pretrain.create_pretraining_data", "--input_file=i",
                                "--output_file=o", "--vocab_file=v", "false"],
    "pack_records": ["bert_pretrain.pack_records", "--input=i", "--output_dir=o", "false"],
    "inspect_tfrecords": ["bert_pretrain.inspect_records", "--input=i", "false"],
}


@pytest.mark.parametrize("tool", sorted(STRAY_WORDS))
def test_a_word_that_is_no_flag_is_one_line_without_the_modules_help(tool, tmp_path):
  result = _run([sys.executable, "-m"] + STRAY_WORDS[tool], cwd=str(tmp_path))
  assert (result.returncode, result.stdout) == (2, "")
  assert result.stderr == (
      "%s: error: unexpected arguments: false; pass everything as --flags: --name=value, and "
      "a true/false flag as --name or --noname (e.g. --noamp)\n" % tool)
  assert os.listdir(str(tmp_path)) == []


@pytest.mark.parametrize("module,tool,words,message", [
    ("bert_pretrain.inspect_records", "inspect_tfrecords", ["--input=i", "--bogus"],
     "there is no flag --bogus; --helpfull lists the flags"),
    ("bert_pretrain.pack_records", "pack_records", ["--input=i", "--output_dir=o",
                                                    "--jobs=two"],
     "flag --jobs=two: invalid literal for int() with base 10: 'two'; --helpfull lists the "
     "flags"),
    ("bert_pretrain.run_pretraining", "run_pretraining", ["--num_train_step=3"],
     "there is no flag --num_train_step; did you mean --num_train_steps?"),
    ("bert_pretrain.run_pretraining", "run_pretraining", ["--train_batch_size=six"],
     "flag --train_batch_size=six: invalid literal for int() with base 10: 'six'; "
     "--helpfull lists the flags"),
    ("bert_pretrain.run_classifier", "run_classifier", ["--output-dir=o"],
     "there is no flag --output-dir; did you mean --output_dir?"),
    ("bert_pretrain.export", "export", ["--checkpont=c"],
     "there is no flag --checkpont; did you mean --checkpoint?"),
    ("bert_pretrain.create_pretraining_data", "create_pretraining_data", ["--dupe_factor=x"],
     "flag --dupe_factor=x: invalid literal for int() with base 10: 'x'; --helpfull lists "
     "the flags"),
    ("bert_pretrain.conformance", "conformance", ["--amp_dtpye=float16"],
     "there is no flag --amp_dtpye; did you mean --amp_dtype?"),
    ("bert_pretrain.demo", "demo", ["--finetune_form=r"],
     "there is no flag --finetune_form; did you mean --finetune_from?"),
    ("bert_pretrain.wiki", "prepare_wiki", ["--dumpp=d"],
     "there is no flag --dumpp; did you mean --dump?"),
    ("bench.benchmark", "benchmark", ["--round=2"],
     "there is no flag --round; did you mean --rounds?"),
])
def test_a_bad_command_line_is_one_line_and_exit_2(module, tool, words, message, tmp_path):
  """Not absl's `FATAL Flags parsing error` and its second line, with status 1."""
  result = _run([sys.executable, "-m", module] + words, cwd=str(tmp_path))
  assert (result.returncode, result.stdout) == (2, "")
  assert result.stderr == "%s: error: %s\n" % (tool, message)
  assert os.listdir(str(tmp_path)) == []


@pytest.mark.parametrize("module,line", [
    ("bert_pretrain.inspect_records", "inspect_tfrecords: error: --input is required; pass "
     "TFRecord files, folders or globs, comma-separated"),
    ("bert_pretrain.export", "export: error: --checkpoint is required; pass the checkpoint to "
     "export (a prefix, or a run's folder)"),
    ("bert_pretrain.create_pretraining_data", "create_pretraining_data: error: --input_file "
     "is required; pass the text files (one sentence a line, documents split by blank "
     "lines)"),
])
def test_a_tool_without_a_required_flag_says_in_one_line_what_to_pass(module, line, tmp_path):
  result = _run([sys.executable, "-m", module], cwd=str(tmp_path))
  assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n")


def test_the_report_without_its_run_folder_is_one_line_without_the_modules_help():
  result = _run([sys.executable, "-m", "bert_pretrain.training.report"])
  assert (result.returncode, result.stdout) == (2, "")
  assert result.stderr == ("report: error: give one run folder: python3 -m "
                           "bert_pretrain.training.report OUTPUT_DIR\n")


def test_each_os_error_reads_as_the_file_the_problem_and_the_fix():
  assert errors.os_error_message(OSError(errno.ENOTDIR, "Not a directory", "/a/f/x")) == (
      "/a/f/x: Not a directory; a part of the path is a file, not a folder: check the path")
  assert errors.os_error_message(OSError(errno.EIO, "Input/output error", "/d")) == (
      "/d: Input/output error")

  class SessionError(Exception):  # As TensorFlow's tf.errors.OpError: a message, no errno.
    message = "Graph execution error:\n\n/x/part-1; Permission denied\n\t [[node]]"

  assert errors.is_file_error(SessionError())
  assert errors.os_error_message(SessionError()) == (
      "/x/part-1; Permission denied; check its permissions, or pass paths you can read and "
      "write")
  full = OSError(errno.ENOSPC, "No space left on device", "/x/part-1")
  assert errors.os_error_message(full).startswith(
      "the disk is full (no space left on the device")
  assert errors.os_error_message(full).endswith(
      "while writing /x/part-1; free space there and run the same command again")
  assert errors.os_error_message(full, lambda what: "full: " + what) == "full: /x/part-1"
  assert not errors.is_file_error(ValueError("not a file's"))


def test_every_commands_usage_keeps_the_line_breaks_of_its_source():
  """absl prints a module's docstring as its --help usage: a usage line continued with a
  backslash must keep it (a raw docstring), not run the next line into it."""
  checked = 0
  for path in sorted(glob.glob(os.path.join(ROOT, "bert_pretrain", "**", "*.py"),
                               recursive=True) + glob.glob(os.path.join(ROOT, "bench", "*.py")) +
                     glob.glob(os.path.join(ROOT, "tools", "*.py"))):
    with open(path, encoding="utf-8") as f:
      source = f.read()
    doc = ast.get_docstring(ast.parse(source), clean=False)
    if not doc:
      continue
    written = source[source.index('"""') + 3:]
    written = written[:written.index('"""')]
    if "\\\n" in written:
      checked += 1
      assert doc.count("\\\n") == written.count("\\\n"), path
  assert checked >= 5
