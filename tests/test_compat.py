"""The code must run on a vendor TensorFlow 1.15 and Python 3.7, which CI does not have.

- Every `tf.x.y` the code uses (tf = tensorflow.compat.v1) must exist in TensorFlow 1.15
  (tests/data/tf115_compat_v1_api.txt lists its public names), unless the line says
  `# tf-compat: guarded` because the code checks for the name first.
- TensorFlow is imported only as tensorflow.compat.v1, never tf.estimator / tf.contrib /
  tf.layers / Keras.
- vermin finds no syntax or library use newer than Python 3.7.
"""

import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
API_FILE = os.path.join(ROOT, "tests", "data", "tf115_compat_v1_api.txt")
CODE_DIRS = ("bert_pretrain", "tools", "bench")
GUARD = "tf-compat: guarded"
FORBIDDEN = ("estimator", "contrib", "layers", "keras")


def _python_files():
  for folder in CODE_DIRS:
    for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
      for name in sorted(names):
        if name.endswith(".py"):
          yield os.path.join(dirpath, name)


def _load_api():
  with open(API_FILE) as f:
    names = {line.strip() for line in f if line.strip() and not line.startswith("#")}
  modules = {name.rsplit(".", 1)[0] for name in names if "." in name}
  return names, modules


def _attribute_chain(node):
  """tf.a.b.c -> ("tf", ["a", "b", "c"]); None for anything else."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name):
    return node.id, list(reversed(parts))
  return None


def find_tf_uses(source):
  """Yields (line number, dotted name, line text) of each tf.* use in a module whose
  tensorflow.compat.v1 alias is imported."""
  tree = ast.parse(source)
  aliases = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name == "tensorflow.compat.v1":
          aliases.add(alias.asname or alias.name)
  lines = source.splitlines()
  seen = set()
  for node in ast.walk(tree):
    if not isinstance(node, ast.Attribute) or id(node) in seen:
      continue
    chain = _attribute_chain(node)
    if chain is None or chain[0] not in aliases:
      continue
    # Mark the inner attributes of this chain so only the longest one is checked.
    inner = node.value
    while isinstance(inner, ast.Attribute):
      seen.add(id(inner))
      inner = inner.value
    yield node.lineno, ".".join(chain[1]), lines[node.lineno - 1]


def unknown_in_tf115(dotted, names, modules):
  """Whether tf.<dotted> is missing from TensorFlow 1.15's tf.compat.v1."""
  parts = dotted.split(".")
  for length in range(len(parts), 0, -1):
    prefix = ".".join(parts[:length])
    if prefix in names:
      # A name under a listed class or function (tf.OptimizerOptions.ON_1) is a member;
      # a name under a listed module must itself be listed.
      return length < len(parts) and prefix in modules
  return True


def test_the_api_list_is_tf115s():
  names, modules = _load_api()
  assert len(names) > 3000
  assert "train.Saver" in names and "data.experimental.AUTOTUNE" in names
  assert "train" in modules
  # Names that arrived after 1.15 are not there.
  assert unknown_in_tf115("nn.gelu", names, modules)
  assert unknown_in_tf115("data.AUTOTUNE", names, modules)
  assert not unknown_in_tf115("OptimizerOptions.ON_1", names, modules)


def test_checker_finds_a_post_115_name(tmp_path):
  names, modules = _load_api()
  source = "import tensorflow.compat.v1 as tf\nx = tf.nn.gelu(1)\ny = tf.nn.relu(2)\n"
  uses = [u for u in find_tf_uses(source) if unknown_in_tf115(u[1], names, modules)]
  assert [u[1] for u in uses] == ["nn.gelu"]


def test_code_uses_only_tf115_names():
  names, modules = _load_api()
  problems = []
  files = list(_python_files())
  assert any(f.endswith("modeling.py") for f in files)
  for path in files:
    with open(path, encoding="utf-8") as f:
      source = f.read()
    for lineno, dotted, line in find_tf_uses(source):
      if GUARD in line or dotted.startswith("__"):  # tf.__version__ is in every release
        continue
      if unknown_in_tf115(dotted, names, modules):
        problems.append("%s:%d tf.%s" % (os.path.relpath(path, ROOT), lineno, dotted))
      if dotted.split(".")[0] in FORBIDDEN:
        problems.append("%s:%d tf.%s is not allowed" % (os.path.relpath(path, ROOT), lineno,
                                                         dotted))
  assert not problems, "names missing in TensorFlow 1.15:\n" + "\n".join(problems)


# What the build does at run time, which no public API says: whether it computes with
# oneDNN (device.tensorflow_uses_onednn), in TensorFlow 2 and in 1.15.
RUNTIME_QUERIES = ("tensorflow.python.util._pywrap_util_port",
                   "tensorflow.python.pywrap_tensorflow")


def test_tensorflow_is_imported_as_compat_v1_only():
  problems = []
  for path in _python_files():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      modules = []
      if isinstance(node, ast.Import):
        modules = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module:
        modules = [node.module]
      for module in modules:
        if module.split(".")[0] == "tensorflow" and not module.startswith(
            ("tensorflow.compat.v1", "tensorflow.python.client") + RUNTIME_QUERIES):
          problems.append("%s:%d imports %s" % (os.path.relpath(path, ROOT), node.lineno, module))
        if module.split(".")[0] in ("keras", "tf_keras"):
          problems.append("%s:%d imports %s" % (os.path.relpath(path, ROOT), node.lineno, module))
  assert not problems, "\n".join(problems)


def run_vermin(paths):
  """Runs vermin on `paths`.

  vermin reads the code with the running Python's parser: on Python 3.11 it names syntax
  newer than 3.7 and exits non-zero; on Python 3.7 such syntax does not parse, which it
  reports as "error: invalid syntax" but with exit status 0. Both count.

  Returns:
    (bool: whether everything is valid Python 3.7, str: vermin's report).
  """
  result = subprocess.run(
      [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())",
       "--target=3.7-", "--violations", "--no-tips",
       "--eval-annotations", "--backport", "typing"] + paths,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
  return result.returncode == 0 and "error:" not in result.stdout, result.stdout


def test_vermin_flags_python_38_syntax(tmp_path):
  newer = tmp_path / "newer.py"
  newer.write_text("if (n := 3) > 2:\n  print(n)\n")
  valid, report = run_vermin([str(newer)])
  assert not valid, report


def test_vermin_flags_a_python_38_library_name(tmp_path):
  newer = tmp_path / "newer.py"
  newer.write_text("import math\nprint(math.prod([2, 3]))\n")
  valid, report = run_vermin([str(newer)])
  assert not valid and "math.prod" in report, report


def test_code_is_valid_python_37():
  folders = [os.path.join(ROOT, d) for d in CODE_DIRS if os.path.isdir(os.path.join(ROOT, d))]
  valid, report = run_vermin(folders)
  assert valid, report
