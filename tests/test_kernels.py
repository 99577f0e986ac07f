"""The fused CPU kernels (bert_pretrain/model/kernels.cc): built here with the compiler
init_tf.sh uses, checked against TensorFlow's ops and float64, and the fallback without
them."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain.distributed import device as device_lib
from bert_pretrain.model import dropout, kernels, modeling, precision

GELU_A = 2 * np.sqrt(2 / np.pi)
GELU_B = GELU_A * 0.044715


@pytest.fixture(scope="module")
def fused():
  """The kernels' op module, built as init_tf.sh builds it where it is not yet."""
  kernels.build()
  assert kernels.load() is not None, kernels.why_unavailable()
  return kernels.load()


@pytest.fixture
def without_library(monkeypatch):
  """The process as one where the kernels are not built."""
  monkeypatch.setattr(kernels, "_loaded", {})
  monkeypatch.setattr(kernels, "library_path", lambda: "/nonexistent/kernels.so")


def _gelu_values(gelu, x, upstream):
  """GELU and its gradient of bfloat16 x, as float32 numpy."""
  with tf.Graph().as_default():
    xs = tf.cast(tf.constant(x), tf.bfloat16)
    y = gelu(xs)
    dx = tf.gradients(y, xs, tf.cast(tf.constant(upstream), tf.bfloat16))[0]
    op_types = {op.type for op in tf.get_default_graph().get_operations()}
    with tf.Session() as session:
      values = session.run([tf.cast(y, tf.float32), tf.cast(dx, tf.float32)])
  return values, op_types


def _bfloat16(values):
  """float32 numpy rounded to bfloat16 (to nearest even), as float32."""
  with tf.Graph().as_default(), tf.Session() as session:
    return session.run(tf.cast(tf.cast(values, tf.bfloat16), tf.float32))


def test_the_fused_gelu_is_within_a_bfloat16_rounding_of_float64_both_ways(fused):
  rng = np.random.RandomState(0)
  x = np.concatenate([rng.randn(30000) * 3, np.linspace(-12, 12, 2001)]).astype(np.float32)
  upstream = rng.randn(x.size).astype(np.float32)
  (y, dx), op_types = _gelu_values(lambda v: precision._fused_gelu(v, fused), x, upstream)
  assert {"BertGelu", "BertGeluGrad"} <= op_types

  v = _bfloat16(x).astype(np.float64)
  s = 1 / (1 + np.exp(-v * (GELU_A + GELU_B * v * v)))
  truth = v * s
  normal = np.abs(truth) > 1e-30  # below, float32's own subnormals
  # A bfloat16 unit in the last place is 2^-8 to 2^-7 of a value: at most one off.
  assert np.all(np.abs(y - truth)[normal] <= 2.0 ** -7 * np.abs(truth)[normal])
  # The gradient multiplies the bfloat16 upstream by the slope rounded to bfloat16.
  term = s * (1 - s) * v * (GELU_A + 3 * GELU_B * v * v)
  up = _bfloat16(upstream).astype(np.float64)
  true_dx = up * _bfloat16((s + term).astype(np.float32))
  # Two roundings to bfloat16 (the slope's can land a unit off where float32's slope and
  # float64's straddle a rounding boundary, the product's half a unit), and float32's
  # rounding of the slope's two terms, which cancel near x = -0.75; below 1e-30, subnormals.
  tolerance = (2.0 ** -6 * np.abs(true_dx) + 2.0 ** -20 * np.abs(up) * (s + np.abs(term))
               + 1e-30)
  assert np.all(np.abs(dx - true_dx) <= tolerance)


def test_the_fused_gelu_gives_tensorflows_numbers(fused):
  rng = np.random.RandomState(1)
  x = (rng.randn(50000) * 3).astype(np.float32)
  upstream = rng.randn(x.size).astype(np.float32)
  (y, dx), _ = _gelu_values(lambda v: precision._fused_gelu(v, fused), x, upstream)
  (y_ops, dx_ops), op_types = _gelu_values(precision._gelu_ops, x, upstream)
  assert "BertGelu" not in op_types
  if not tf.__version__.startswith("1."):
    np.testing.assert_array_equal(y, y_ops)  # every bit
    np.testing.assert_array_equal(dx, dx_ops)
  else:
    # TensorFlow 1.15's sigmoid is less exact (below x = -3 it loses the relative
    # precision the test above holds the kernel to): above, a bfloat16 unit at most.
    above = x > -3
    for ours, theirs in ((y, y_ops), (dx, dx_ops)):
      assert np.all(np.abs(ours - theirs)[above] <= 2.0 ** -7 * np.abs(theirs)[above])
      assert np.mean(ours[above] != theirs[above]) < 0.01


def test_non_finite_values_stay_non_finite_through_the_fused_gelu(fused):
  x = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
  (y, dx), _ = _gelu_values(lambda v: precision._fused_gelu(v, fused), x, np.ones(4, np.float32))
  assert np.isnan(y[0]) and y[1] == np.inf and not np.isfinite(y[2]) and y[3] > 0.8
  assert np.isnan(dx[0]) and np.isfinite(dx[3])


def test_gelu_runs_the_fused_kernels_in_bfloat16_only(fused):
  x = np.linspace(-4, 4, 64).astype(np.float32)
  _, op_types = _gelu_values(precision.gelu, x, np.ones(64, np.float32))
  assert {"BertGelu", "BertGeluGrad"} <= op_types
  with tf.Graph().as_default():
    precision.gelu(tf.constant(x))
    assert "BertGelu" not in {op.type for op in tf.get_default_graph().get_operations()}


def test_without_the_library_gelu_runs_tensorflows_ops_and_the_device_line_says_why(
    without_library):
  x = np.linspace(-4, 4, 64).astype(np.float32)
  (y, _), op_types = _gelu_values(precision.gelu, x, np.ones(64, np.float32))
  assert "BertGelu" not in op_types and "Sigmoid" in op_types and y[-1] > 3.9
  cpu = device_lib.Device("CPU", [], tf.bfloat16)
  assert device_lib.compute_text(cpu) == (
      "compute bfloat16 (fused kernels not built for this TensorFlow; bash init_tf.sh "
      "builds them)")
  # float32 runs the optimizer's kernel without it too.
  assert device_lib.compute_text(device_lib.Device("CPU", [], tf.float32)) == (
      "compute float32 (fused kernels not built for this TensorFlow; bash init_tf.sh "
      "builds them)")
  assert device_lib.compute_text(device_lib.Device("GPU", [], tf.float32)) == "compute float32"


def test_the_kernels_can_be_turned_off_for_a_comparison(fused, monkeypatch):
  monkeypatch.setattr(kernels, "_loaded", {})
  monkeypatch.setenv(kernels.ENABLE_VARIABLE, "0")
  assert kernels.load() is None
  assert kernels.why_unavailable() == "off (BERT_PRETRAIN_FUSED_KERNELS=0)"


def test_a_library_is_named_for_its_source_and_tensorflow(tmp_path, monkeypatch):
  path = kernels.library_path()
  assert os.path.dirname(path) == os.path.dirname(kernels.SOURCE)
  edited = tmp_path / "kernels.cc"
  edited.write_text(open(kernels.SOURCE).read() + "// edited\n")
  monkeypatch.setattr(kernels, "SOURCE", str(edited))
  kernels.library_path.cache_clear()
  try:
    assert os.path.basename(kernels.library_path()) != os.path.basename(path)
    # The same source elsewhere (a checkout moved or copied) keeps the library's name.
    edited.write_text(open(os.path.join(os.path.dirname(path), "kernels.cc")).read())
    kernels.library_path.cache_clear()
    assert os.path.basename(kernels.library_path()) == os.path.basename(path)
    assert os.path.dirname(kernels.library_path()) == str(tmp_path)
  finally:
    kernels.library_path.cache_clear()


def test_a_build_makes_a_library_that_loads_and_runs_in_a_new_process(tmp_path, monkeypatch):
  monkeypatch.setattr(kernels, "_loaded", {})
  monkeypatch.setattr(kernels, "library_path", lambda: str(tmp_path / "kernels.so"))
  monkeypatch.delenv(kernels.ENABLE_VARIABLE, raising=False)
  assert kernels.load() is None and "not built" in kernels.why_unavailable()
  path, seconds = kernels.build(str(tmp_path / "kernels.so"))
  # A load() before the build does not keep later ones from loading it (here, a stand-in
  # for tf.load_op_library: this process has a library with the same ops loaded).
  monkeypatch.setattr(kernels.tf, "load_op_library", lambda library: ("ops of", library))
  assert kernels.load() == ("ops of", path) and kernels.why_unavailable() == ""
  monkeypatch.undo()
  assert seconds > 0 and os.listdir(str(tmp_path)) == ["kernels.so"]
  assert kernels.build(path) == (path, 0.0)  # kept, not built again
  script = ("import tensorflow.compat.v1 as tf; tf.disable_eager_execution(); "
            "ops = tf.load_op_library(%r); x = tf.constant([-1.0, 0.0, 2.0], tf.bfloat16); "
            "print(tf.Session().run(tf.cast(ops.bert_gelu(x), tf.float32)).tolist())" % path)
  result = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert [round(v, 2) for v in eval(result.stdout.strip().splitlines()[-1])] == [-0.16, 0.0, 1.95]


# Every kernel but the mask's and LAMB's (their own tests compare their loops) on rows of
# odd lengths, all 65,536 bfloat16 values among the inputs; prints a digest of the outputs.
_EVERY_LOOP = """
import hashlib, numpy as np, tensorflow.compat.v1 as tf
from bert_pretrain.model import kernels
tf.disable_eager_execution()
ops = kernels.load()
rng = np.random.RandomState(0)
every = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)
x = tf.cast(np.concatenate([every, rng.randn(5094).astype(np.float32)]).reshape(70, 1009),
            tf.bfloat16)
up = tf.cast(tf.constant(rng.randn(70, 1009)), tf.bfloat16)
keep = tf.constant(rng.rand(70, 1009) > 0.1)
f32 = tf.constant(rng.randn(70, 1009).astype(np.float32))
gamma, beta = (tf.constant(rng.randn(1009).astype(np.float32)) for _ in range(2))
probs, dropped = ops.bert_attention_probs(x, keep, scale=1.25)
y, x_hat, inverse_std, y_half = ops.bert_dropout_add_layer_norm(x, f32, keep, gamma, beta,
                                                                scale=1.25)
outputs = [ops.bert_gelu(x), ops.bert_gelu_grad(x, up), probs, dropped,
           ops.bert_attention_probs_grad(probs, keep, up, scale=1.25, T=tf.float32),
           ops.bert_dropout(x, keep, scale=1.25), y, x_hat, inverse_std, y_half,
           ops.bert_bias_add_grad(x)]
outputs += ops.bert_dropout_add_layer_norm_grad(f32, x_hat, inverse_std, gamma, keep, up,
                                                scale=1.25)
values = tf.Session().run(outputs)
print(hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in values)).hexdigest())
"""


def test_the_kernels_loops_give_the_same_bits_with_avx512_or_without(fused):
  digests = []
  for avx512 in ("1", "0"):
    env = dict(os.environ, **{kernels.AVX512_VARIABLE: avx512})
    result = subprocess.run([sys.executable, "-c", _EVERY_LOOP], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True, timeout=300,
                            env=env)
    assert result.returncode == 0, result.stderr
    digests.append(result.stdout.split()[-1])
  assert digests[0] == digests[1]


def test_a_new_build_deletes_the_one_its_tensorflow_made_from_an_older_source(
    tmp_path, monkeypatch):
  # A stand-in compiler that writes the library it is asked for.
  compiler = tmp_path / "g++"
  compiler.write_text('#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\necho lib > "$2"\n')
  compiler.chmod(0o755)
  monkeypatch.setenv("CXX", str(compiler))
  monkeypatch.setattr(kernels, "SOURCE", str(tmp_path / "kernels.cc"))
  kernels.library_path.cache_clear()
  try:
    (tmp_path / "kernels.cc").write_text("// the older source\n")
    older = os.path.basename(kernels.build()[0])
    other_tensorflow = "_kernels-00000000-%s" % older.rsplit("-", 1)[1]
    old_naming = "_kernels-0123456789abcdef.so"
    for name in (other_tensorflow, old_naming, older + ".77.partial"):
      (tmp_path / name).write_text("lib")
    (tmp_path / "kernels.cc").write_text("// the newer source\n")
    kernels.library_path.cache_clear()
    newer = os.path.basename(kernels.build()[0])
  finally:
    kernels.library_path.cache_clear()
  assert newer != older and newer.rsplit("-", 1)[0] == older.rsplit("-", 1)[0]
  assert sorted(os.listdir(str(tmp_path))) == sorted(
      ["g++", "kernels.cc", newer, other_tensorflow, older + ".77.partial"])


def test_a_missing_compiler_is_one_line_with_the_fix(tmp_path, monkeypatch):
  monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
  with pytest.raises(kernels.BuildError) as error:
    kernels.build(str(tmp_path / "kernels.so"))
  message = str(error.value)
  assert "\n" not in message and "no C++ compiler" in message and "apt-get install -y g++" in message
  assert not os.listdir(str(tmp_path))


def test_a_failed_compilation_names_its_first_error_and_leaves_no_library(tmp_path, monkeypatch):
  broken = tmp_path / "kernels.cc"
  broken.write_text("this is not C++;\n")
  monkeypatch.setattr(kernels, "SOURCE", str(broken))
  with pytest.raises(kernels.BuildError) as error:
    kernels.build(str(tmp_path / "out.so"))
  assert "\n" not in str(error.value) and "error" in str(error.value)
  assert sorted(os.listdir(str(tmp_path))) == ["kernels.cc"]


# A build stopped by SIGTERM while its compiler (a stand-in that makes its output file and
# waits) runs.
STOPPED_BUILD = """
import sys
from bert_pretrain import errors
from bert_pretrain.model import kernels
errors.take_stop_signals()
try:
  kernels.build(sys.argv[1])
except errors.Terminated:
  print("terminated")
"""


def test_a_build_stopped_by_sigterm_kills_its_compiler_and_leaves_no_part_of_a_library(tmp_path):
  pid_file, compiler, folder = tmp_path / "compiler.pid", tmp_path / "g++", tmp_path / "lib"
  compiler.write_text('#!/bin/sh\nwhile [ "$#" -gt 0 ]; do [ "$1" = -o ] && : > "$2"; shift; done\n'
                      'echo "$$" > "%s.new" && mv "%s.new" "%s"\nexec sleep 60\n'
                      % (pid_file, pid_file, pid_file))
  compiler.chmod(0o755)
  folder.mkdir()
  process = subprocess.Popen(
      [sys.executable, "-c", STOPPED_BUILD, str(folder / "kernels.so")],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
      env=dict(os.environ, CXX=str(compiler),
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  try:
    deadline = time.time() + 120
    while not pid_file.exists():
      assert process.poll() is None and time.time() < deadline, process.communicate()[0]
      time.sleep(0.05)
    assert os.listdir(str(folder)) != []  # the part it was writing
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=60)[0]
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  assert output.splitlines()[-1] == "terminated", output
  assert os.listdir(str(folder)) == []
  with pytest.raises(ProcessLookupError):  # killed and reaped, not left compiling
    os.kill(int(pid_file.read_text()), 0)


def _attention_values(attention, scores, value, keep, upstream, scores_dtype):
  """dropped_attention's output and gradients (scores, value) for bfloat16 value, as
  float32 numpy, and the graph's op types."""
  with tf.Graph().as_default():
    s = tf.cast(tf.constant(scores), scores_dtype)
    v = tf.cast(tf.constant(value), tf.bfloat16)
    out = attention(s, v, tf.constant(keep), 0.1)
    grads = tf.gradients(out, [s, v], tf.cast(tf.constant(upstream), tf.bfloat16))
    op_types = {op.type for op in tf.get_default_graph().get_operations()}
    with tf.Session() as session:
      values = session.run([tf.cast(t, tf.float32) for t in [out] + grads])
  return values, op_types


@pytest.mark.parametrize("scores_dtype", [tf.bfloat16, tf.float32])
def test_the_fused_attention_gives_tensorflows_numbers_to_a_bfloat16_unit(
    fused, monkeypatch, scores_dtype):
  # 37 and 130 keys: rows that are not a multiple of the kernels' 16 lanes.
  rng = np.random.RandomState(2)
  for shape in ([2, 3, 11, 37], [1, 2, 5, 130]):
    scores = (rng.randn(*shape) * 3).astype(np.float32)
    scores[..., -3:] -= 10000.0  # masked keys, as attend adds the mask
    value = rng.randn(*(shape[:2] + [shape[3], 8])).astype(np.float32)
    keep = rng.rand(*shape) >= 0.1
    upstream = rng.randn(*(shape[:3] + [8])).astype(np.float32)
    args = (scores, value, keep, upstream, scores_dtype)
    ours, op_types = _attention_values(precision.dropped_attention, *args)
    assert {"BertAttentionProbs", "BertAttentionProbsGrad", "BertDropout"} <= op_types
    monkeypatch.setattr(kernels, "_loaded", {kernels.library_path(): "off"})
    theirs, op_types = _attention_values(precision.dropped_attention, *args)
    monkeypatch.undo()
    assert "BertAttentionProbs" not in op_types
    # A probability a bfloat16 unit apart (float32's sums in another order) moves what
    # is computed from it by that much of its share.
    for got, want in zip(ours, theirs):
      assert np.all(np.abs(got - want) <= 2.0 ** -6 * np.abs(want).max())
    # In bfloat16, most values are the same bits (float32 gradients differ in the last
    # bits of float32 sums).
    for got, want in zip(ours, theirs) if scores_dtype == tf.bfloat16 else [(ours[0], theirs[0])]:
      assert np.mean(got != want) < 0.01


def test_the_fused_softmax_is_a_bfloat16_rounding_of_float64_and_zero_where_masked(fused):
  rng = np.random.RandomState(3)
  scores = (rng.randn(4, 77) * 4).astype(np.float32)
  scores[:, :5] -= 10000.0
  keep = rng.rand(4, 77) >= 0.25
  with tf.Graph().as_default(), tf.Session() as session:
    probs, dropped = session.run([tf.cast(t, tf.float32) for t in fused.bert_attention_probs(
        tf.constant(scores), tf.constant(keep), scale=1 / 0.75)])
  exact = np.exp(scores - scores.max(-1, keepdims=True))
  exact /= exact.sum(-1, keepdims=True)
  assert np.all(probs[:, :5] == 0) and np.all(dropped[:, :5] == 0)
  assert np.all(np.abs(probs - exact) <= 2.0 ** -8 * exact + 1e-30)
  np.testing.assert_array_equal(dropped, np.where(keep, _bfloat16(probs / 0.75), 0))


@pytest.mark.parametrize("adder_rows", [1, 11])
def test_the_fused_mask_gives_the_bits_of_tensorflows_add_to_the_scores_in_float32(
    fused, adder_rows):
  """dropped_attention with the mask's adder ([B, 1, 1 or F, T]) added in the kernel's
  pass over bfloat16 scores: the context and both gradients are the bits of the scores
  cast to float32, masked by TensorFlow's add and then given to the kernels."""
  rng = np.random.RandomState(4)
  shape = [2, 3, 11, 37]
  scores = (rng.randn(*shape) * 3).astype(np.float32)
  mask = rng.rand(shape[0], 1, adder_rows, shape[3]) >= 0.3
  adder = ((1.0 - mask) * -10000.0).astype(np.float32)
  value = rng.randn(*(shape[:2] + [shape[3], 8])).astype(np.float32)
  keep = rng.rand(*shape) >= 0.1
  upstream = rng.randn(*(shape[:3] + [8])).astype(np.float32)
  results = []
  with tf.Graph().as_default():
    s = tf.cast(tf.constant(scores), tf.bfloat16)
    v = tf.cast(tf.constant(value), tf.bfloat16)
    for masked in (precision.dropped_attention(s, v, tf.constant(keep), 0.1,
                                               tf.constant(adder)),
                   precision.dropped_attention(tf.cast(s, tf.float32) + adder, v,
                                               tf.constant(keep), 0.1),
                   precision.dropped_attention(s, v, tf.constant(keep), 0.1)):
      grads = tf.gradients(masked, [s, v], tf.cast(tf.constant(upstream), tf.bfloat16))
      results.append([_bits(t) for t in [masked] + grads])
    op_types = {op.type for op in tf.get_default_graph().get_operations()}
    with tf.Session() as session:
      (ours, theirs, unmasked) = session.run(results)
  assert "BertMaskedAttentionProbs" in op_types
  assert ours[1].dtype == np.uint16  # the scores' gradient in bfloat16, not float32
  for got, want in zip(ours, theirs):
    np.testing.assert_array_equal(got, want)
  assert np.mean(ours[0] != unmasked[0]) > 0.5


def test_the_fused_mask_names_an_adder_of_another_shape(fused):
  with tf.Graph().as_default(), tf.Session() as session:
    scores = tf.zeros([2, 3, 5, 7], tf.bfloat16)
    probs = fused.bert_masked_attention_probs(scores, tf.ones([2, 3, 5, 7], tf.bool),
                                              tf.zeros([2, 1, 2, 7]), scale=2.0)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="BertMaskedAttentionProbs: the mask's adder must be \\[batch, "
                       "1, 1 or from, to\\]"):
      session.run(probs)


def test_the_fused_attentions_kernels_name_mismatched_shapes(fused):
  with tf.Graph().as_default(), tf.Session() as session:
    probs = fused.bert_attention_probs(tf.zeros([2, 5]), tf.ones([2, 4], tf.bool), scale=2.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="BertAttentionProbs: the inputs "
                       "differ in shape"):
      session.run(probs)


@pytest.mark.parametrize("dtype, fused_ops", [(tf.bfloat16, 4), (tf.float32, 0)])
def test_every_layer_of_a_bfloat16_model_runs_the_fused_kernels(fused, dtype, fused_ops):
  config = modeling.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3,
                               num_attention_heads=2, intermediate_size=37)
  with tf.Graph().as_default():
    ids = tf.constant(np.arange(24).reshape(2, 12) % 99, tf.int32)
    # Seeded masks, as training makes them (TensorFlow 1.15 drops out unseeded values
    # with tf.nn.dropout).
    model = modeling.BertModel(config, True, ids, tf.ones([2, 12], tf.int32),
                               compute_type=dtype,
                               dropout_seeds=dropout.DropoutSeeds(1, tf.constant(0)))
    tf.gradients(tf.reduce_sum(tf.cast(model.get_sequence_output(), tf.float32)),
                 tf.trainable_variables())
    ops = tf.get_default_graph().get_operations()
    names = [op.name for op in ops
             if op.type in ("BertGelu", "BertMaskedAttentionProbs", "BertDropoutAddLayerNorm")]
    bias_adds = [op.name for op in ops if op.type == ("BertBiasAdd" if fused_ops else "BiasAdd")]
    bias_gradients = [op.name for op in ops if op.type == "BertBiasAddGrad"]
    weight_casts = [op.name for op in ops if op.type in ("BertToBfloat16", "BertToFloat")]
    # The residual stream [rows, 32] cast to bfloat16 for a matmul, or its gradient back.
    stream_casts = [op.name for op in ops if op.type == "Cast" and
                    op.outputs[0].shape.as_list()[-1:] == [32] and "/layer_" in op.name]
    # The attention scores [2, 2, 12, 12] to float32 for the mask, or their gradient back.
    score_casts = [op.name for op in ops if op.type == "Cast" and
                   op.outputs[0].shape.as_list() == [2, 2, 12, 12]]
  assert not score_casts, score_casts
  # After the first layer the sublayer kernel's bfloat16 output feeds the matmuls.
  assert not [n for n in stream_casts if "layer_0" not in n], stream_casts
  for layer in range(3):
    assert len([n for n in names if "/layer_%d/" % layer in n]) == fused_ops, names
    # Of the query/key/value, attention output, intermediate and output biases.
    assert len([n for n in bias_gradients if "/layer_%d/" % layer in n]) == fused_ops
    assert len([n for n in bias_adds if "/layer_%d/" % layer in n]) == 4
    # Its 6 kernels and 6 biases to bfloat16, and their gradients back.
    assert len([n for n in weight_casts if "/layer_%d/" % layer in n]) == 6 * fused_ops


def _bits(tensor):
  return tf.bitcast(tensor, tf.uint16 if tensor.dtype == tf.bfloat16 else tf.uint32)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_fused_casts_give_tensorflows_bits_both_ways(fused, threads):
  rng = np.random.RandomState(threads)
  every_bfloat16 = np.arange(65536, dtype=np.uint16)
  # Ties, one float32 unit either side of them, infinities, NaNs, denormals, and
  # lengths that are not a multiple of the 16 lanes; one long enough to be sharded.
  ties = (rng.randint(0, 65536, 999).astype(np.uint32) << 16) | 0x8000
  special = np.array([0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0x7f7fffff,
                      0x00000001, 0x807fffff, 0x80000000], np.uint32)
  float_bits = np.concatenate([special, ties, ties - 1, ties + 1,
                               rng.randint(0, 2 ** 32, 300_001, dtype=np.uint64)])
  floats = float_bits.astype(np.uint32).view(np.float32)
  with tf.Graph().as_default():
    halves = tf.bitcast(tf.constant(every_bfloat16), tf.bfloat16)
    wides = tf.constant(floats)
    pairs = [(fused.bert_to_float(halves), tf.cast(halves, tf.float32)),
             (fused.bert_to_bfloat16(wides), tf.cast(wides, tf.bfloat16)),
             (fused.bert_to_bfloat16(wides[:19]), tf.cast(wides[:19], tf.bfloat16))]
    config = tf.ConfigProto(intra_op_parallelism_threads=threads)
    with tf.Session(config=config) as session:
      results = session.run([(_bits(a), _bits(b), tf.is_nan(tf.cast(b, tf.float32)))
                             for a, b in pairs])
  # A NaN stays a NaN (TensorFlow 1.15 and 2.15 give NaNs different bits).
  for ours, theirs, nan in results:
    assert nan.sum() > 0
    np.testing.assert_array_equal(ours[~nan], theirs[~nan])
    exponent, mantissa = (0x7f80, 0x7f) if ours.dtype == np.uint16 else (0x7f800000, 0x7fffff)
    assert np.all((ours[nan] & exponent == exponent) & (ours[nan] & mantissa != 0))


def test_a_bfloat16_weights_gradient_comes_back_in_float32_dense_or_gathered(fused):
  with tf.Graph().as_default():
    with tf.variable_scope("", custom_getter=precision.get_custom_getter(tf.bfloat16)):
      table = tf.get_variable("table", [7, 5], tf.bfloat16,
                              initializer=tf.random_normal_initializer(seed=1))
    assert table.op.type == "BertToBfloat16"
    rows = tf.gather(table, [1, 1, 4])
    upstream = tf.cast(tf.reshape(tf.range(15, dtype=tf.float32) / 7, [3, 5]), tf.bfloat16)
    gathered = tf.gradients(rows, tf.trainable_variables(), upstream)[0]
    dense = tf.gradients(table * 3, tf.trainable_variables())[0]
    assert isinstance(gathered, tf.IndexedSlices) and gathered.values.dtype == tf.float32
    assert gathered.values.op.type == "BertToFloat" and dense.op.type == "BertToFloat"
    with tf.Session() as session:
      values, indices, dense = session.run([gathered.values, gathered.indices, dense])
  np.testing.assert_array_equal(indices, [1, 1, 4])
  np.testing.assert_array_equal(values, _bfloat16(np.arange(15).reshape(3, 5) / 7))
  np.testing.assert_array_equal(dense, np.full([7, 5], 3.0))


@pytest.mark.parametrize("shape", [(1, 1), (70, 130), (3, 5, 37)])
def test_the_fused_bias_add_gives_tensorflows_bits_and_leaves_a_read_input_alone(fused, shape):
  rng = np.random.RandomState(len(shape))
  with tf.Graph().as_default():
    value = tf.cast(tf.constant(rng.randn(*shape).astype(np.float32)), tf.bfloat16)
    bias = tf.cast(tf.constant(rng.randn(shape[-1]).astype(np.float32)), tf.bfloat16)
    value = value * 3  # an intermediate tensor, which the kernel may overwrite if unread
    ours, theirs = fused.bert_bias_add(value, bias), tf.nn.bias_add(value, bias)
    with tf.Session() as session:
      (ours, theirs, value), twice = session.run(
          [_bits(t) for t in (ours, theirs, value)]), session.run(_bits(value))
  np.testing.assert_array_equal(ours, theirs)
  np.testing.assert_array_equal(value, twice)
  assert np.mean(ours != value) > 0.9


def test_the_fused_bias_add_names_a_bias_that_does_not_fit(fused):
  with tf.Graph().as_default(), tf.Session() as session:
    with pytest.raises(ValueError, match="Dimensions must be equal"):
      fused.bert_bias_add(tf.zeros([2, 5], tf.bfloat16), tf.zeros([4], tf.bfloat16))
    shape = tf.placeholder(tf.int32, [2])
    y = fused.bert_bias_add(tf.zeros(shape, tf.bfloat16), tf.zeros([4], tf.bfloat16))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="BertBiasAdd: bias must be \\[width\\] of value's last axis"):
      session.run(y, {shape: [2, 5]})


def _bias_gradients(fused, dy, threads):
  """BertBiasAddGrad of bfloat16 dy (given as float32 numpy) on `threads` threads, as
  float32 numpy."""
  with tf.Graph().as_default():
    sums = fused.bert_bias_add_grad(tf.cast(tf.constant(dy), tf.bfloat16))
    config = tf.ConfigProto(intra_op_parallelism_threads=threads)
    with tf.Session(config=config) as session:
      return session.run(tf.cast(sums, tf.float32))


@pytest.mark.parametrize("rows, width", [(1, 3), (63, 130), (64, 129), (1000, 517)])
def test_the_fused_bias_gradient_is_float64s_column_sums_rounded_once_on_any_threads(
    fused, rows, width):
  dy = _bfloat16(np.random.RandomState(rows).randn(rows, width).astype(np.float32))
  ours = _bias_gradients(fused, dy, threads=2)
  np.testing.assert_array_equal(_bias_gradients(fused, dy, threads=1), ours)
  want = dy.astype(np.float64).sum(axis=0)
  # A bfloat16 rounding of the float64 sum: the float32 sums' own error is far below.
  ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 1e-30))) - 7)
  assert np.all(np.abs(ours - want) <= 0.5 * ulp + 1e-3 * ulp)


def test_the_fused_bias_gradient_of_no_rows_is_zeros_and_of_a_vector_an_error(fused):
  assert _bias_gradients(fused, np.zeros([0, 5], np.float32), threads=2).tolist() == [0] * 5
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="must be at least rank 2"):
      fused.bert_bias_add_grad(tf.zeros([5], tf.bfloat16))


def _sublayer_end_inputs(rows, width, seed):
  """x (bfloat16 values), residual, gamma, beta, and the upstream gradients of the
  output and of its bfloat16 copy (bfloat16 values) of a sublayer's end."""
  rng = np.random.RandomState(seed)
  return (_bfloat16(rng.randn(rows, width).astype(np.float32)),
          (rng.randn(rows, width) * 2 + 0.5).astype(np.float32),
          (1 + 0.3 * rng.randn(width)).astype(np.float32),
          (0.1 * rng.randn(width)).astype(np.float32),
          rng.randn(rows, width).astype(np.float32),
          _bfloat16(rng.randn(rows, width).astype(np.float32)))


def _sublayer_end_values(x, residual, gamma, beta, upstream, upstream_half):
  """dropout_add_layer_norm(x, residual) at 0.1 with gamma and beta: its output, the
  gradients (x, residual, gamma, beta) of both its outputs, as float32 numpy, and its
  bfloat16 output's bits; the keep mask its seed draws, and the graph's op types."""
  with tf.Graph().as_default():
    xs = tf.cast(tf.constant(x), tf.bfloat16)
    res = tf.constant(residual)
    y, y_half = modeling.dropout_add_layer_norm(
        xs, res, 0.1, seeds=dropout.DropoutSeeds(3, tf.constant(5)))
    with tf.variable_scope("LayerNorm", reuse=True):
      variables = [tf.get_variable("gamma"), tf.get_variable("beta")]
    # The mask the layer drew: the same seed (site 1 of DropoutSeeds(3, 5)) again.
    keep = dropout.keep_mask(tf.shape(xs), 0.1, dropout.DropoutSeeds(3, tf.constant(5)))
    grads = tf.gradients([y, y_half], [xs, res] + variables,
                         [tf.constant(upstream), tf.cast(upstream_half, tf.bfloat16)])
    op_types = {op.type for op in tf.get_default_graph().get_operations()}
    with tf.Session() as session:
      session.run([v.assign(value) for v, value in zip(variables, (gamma, beta))])
      values = session.run([y] + [tf.cast(g, tf.float32) for g in grads] +
                           [tf.bitcast(y_half, tf.uint16), tf.bitcast(tf.cast(y, tf.bfloat16),
                                                                      tf.uint16), keep])
  np.testing.assert_array_equal(values[-3], values[-2])  # y_half is y in bfloat16
  return values[:-3], values[-1], op_types


@pytest.mark.parametrize("rows, width", [(70, 37), (5, 130), (33, 1024)])
def test_the_fused_dropout_add_layer_norm_gives_tensorflows_numbers(
    fused, monkeypatch, rows, width):
  # Widths that are not a multiple of the kernels' 16 lanes, and rows that leave the
  # gradient's 32 chunks uneven.
  inputs = _sublayer_end_inputs(rows, width, rows)
  ours, keep, op_types = _sublayer_end_values(*inputs)
  assert {"BertDropoutAddLayerNorm", "BertDropoutAddLayerNormGrad"} <= op_types
  monkeypatch.setattr(kernels, "_loaded", {kernels.library_path(): "off"})
  theirs, keep_ops, op_types = _sublayer_end_values(*inputs)
  assert "BertDropoutAddLayerNorm" not in op_types
  assert 0.8 < keep.mean() < 0.97
  (y, dx, d_residual, d_gamma, d_beta), (y_ops, dx_ops) = ours, theirs[:2]
  # float32 sums in another order: a few float32 units of the largest value.
  for got, want in zip([y, d_residual, d_gamma, d_beta], [y_ops] + theirs[2:]):
    assert np.all(np.abs(got - want) <= 1e-5 * np.abs(want).max())
  # x's gradient in bfloat16: where the float32 values straddle a rounding boundary,
  # one unit apart.
  assert np.all(dx[~keep] == 0)
  assert np.all(np.abs(dx - dx_ops) <= 2.0 ** -7 * np.abs(dx_ops) + 1e-5 * np.abs(dx_ops).max())
  assert np.mean(dx != dx_ops) < 0.01


def test_the_fused_dropout_add_layer_norm_is_float64s_layer_norm(fused):
  x, residual, gamma, beta, upstream, upstream_half = _sublayer_end_inputs(9, 300, 7)
  (y, dx, d_residual, d_gamma, d_beta), keep, _ = _sublayer_end_values(
      x, residual, gamma, beta, upstream, upstream_half)
  upstream = upstream.astype(np.float64) + upstream_half  # the two outputs' gradients
  summed = np.where(keep, x.astype(np.float64) / 0.9, 0) + residual
  centered = summed - summed.mean(-1, keepdims=True)
  inverse_std = 1 / np.sqrt((centered ** 2).mean(-1, keepdims=True) + 1e-12)
  x_hat = centered * inverse_std
  np.testing.assert_allclose(y, x_hat * gamma + beta, rtol=0, atol=1e-5)
  g = upstream * gamma
  d = inverse_std * (g - g.mean(-1, keepdims=True)
                     - x_hat * (g * x_hat).mean(-1, keepdims=True))
  np.testing.assert_allclose(d_residual, d, rtol=0, atol=1e-5 * np.abs(d).max())
  np.testing.assert_allclose(dx, np.where(keep, d / 0.9, 0), rtol=2.0 ** -7,
                             atol=1e-5 * np.abs(d).max())
  np.testing.assert_allclose(d_gamma, (upstream * x_hat).sum(0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d_beta, upstream.sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("read", [0, 1])
def test_the_fused_dropout_add_layer_norms_gradient_of_one_output_is_the_others_at_zero(
    fused, read):
  # The last layer's bfloat16 copy is read by nothing in the pretraining graph:
  # TensorFlow 1.15 gives its gradient as None.
  x, residual, _, _, upstream, upstream_half = _sublayer_end_inputs(6, 40, 11)
  with tf.Graph().as_default():
    xs = tf.cast(tf.constant(x), tf.bfloat16)
    res = tf.constant(residual)
    outputs = modeling.dropout_add_layer_norm(
        xs, res, 0.1, seeds=dropout.DropoutSeeds(3, tf.constant(5)))
    upstreams = [tf.constant(upstream), tf.cast(upstream_half, tf.bfloat16)]
    alone = tf.gradients(outputs[read], [xs, res], upstreams[read])
    upstreams[1 - read] = tf.zeros_like(outputs[1 - read])
    both = tf.gradients(list(outputs), [xs, res], upstreams)
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      alone, both = session.run([[tf.cast(g, tf.float32) for g in alone],
                                 [tf.cast(g, tf.float32) for g in both]])
  for got, want in zip(alone, both):
    assert np.abs(want).max() > 0
    np.testing.assert_array_equal(got, want)


def test_the_fused_layer_norms_kernels_name_a_mismatched_width(fused):
  with tf.Graph().as_default(), tf.Session() as session:
    keep = tf.ones([2, 5], tf.bool)
    y = fused.bert_dropout_add_layer_norm(tf.zeros([2, 5], tf.bfloat16), tf.zeros([2, 5]),
                                          keep, tf.ones([4]), tf.zeros([4]), scale=1.0)
    grads = fused.bert_dropout_add_layer_norm_grad(
        tf.zeros([2, 5]), tf.zeros([2, 5]), tf.ones([2]), tf.ones([4]), keep,
        tf.zeros([2, 5], tf.bfloat16), scale=1.0)
    for op, output in (("BertDropoutAddLayerNorm", y), ("BertDropoutAddLayerNormGrad", grads)):
      with pytest.raises(tf.errors.InvalidArgumentError, match=op + ": gamma and beta must "
                         "be \\[width\\] of the rows' last axis"):
        session.run(output)


def test_the_fused_layer_norm_of_no_rows_has_zero_gradients_for_gamma_and_beta(fused):
  with tf.Graph().as_default(), tf.Session() as session:
    y, _, inverse_std, _ = fused.bert_dropout_add_layer_norm(
        tf.zeros([0, 6], tf.bfloat16), tf.zeros([0, 6]), tf.ones([0, 6], tf.bool),
        tf.ones([6]), tf.zeros([6]), scale=1.0)
    grads = fused.bert_dropout_add_layer_norm_grad(
        tf.zeros([0, 6]), tf.zeros([0, 6]), tf.zeros([0]), tf.ones([6]),
        tf.ones([0, 6], tf.bool), tf.zeros([0, 6], tf.bfloat16), scale=1.0)
    y, inverse_std, (_, _, d_gamma, d_beta) = session.run([y, inverse_std, grads])
  assert y.shape == (0, 6) and inverse_std.shape == (0,)
  assert d_gamma.tolist() == [0.0] * 6 and d_beta.tolist() == [0.0] * 6


def _bfloat16_model_values(values=None):
  """A seeded bfloat16 BertModel in training: its sequence output and the gradient of
  its weighted sum, as float32 numpy, and its variables' values by name (`values`: set
  them). Weighted: the sum of a layer norm's squares (gamma 1, beta 0) is its width, so
  every gradient below the last one would be rounding noise."""
  config = modeling.BertConfig(vocab_size=99, hidden_size=48, num_hidden_layers=3,
                               num_attention_heads=2, intermediate_size=64)
  with tf.Graph().as_default():
    tf.set_random_seed(1)
    ids = tf.constant(np.arange(40).reshape(2, 20) * 7 % 99, tf.int32)
    model = modeling.BertModel(config, True, ids, tf.ones([2, 20], tf.int32),
                               compute_type=tf.bfloat16,
                               dropout_seeds=dropout.DropoutSeeds(1, tf.constant(0)))
    output = tf.cast(model.get_sequence_output(), tf.float32)
    variables = [v for v in tf.trainable_variables() if "pooler" not in v.op.name]
    grads = [tf.convert_to_tensor(g)  # the embeddings' IndexedSlices as a whole Tensor
             for g in tf.gradients(tf.reduce_sum(output * tf.constant(np.random.RandomState(
                 0).standard_normal([2, 20, 48]), tf.float32)), variables)]
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      if values is not None:
        session.run([v.assign(values[v.op.name]) for v in variables])
      out, grad_values, variable_values = session.run([output, grads, variables])
  return out, dict(zip([v.op.name for v in variables], grad_values)), dict(
      zip([v.op.name for v in variables], variable_values))


def test_a_bfloat16_model_trains_with_the_same_masks_and_numbers_with_the_kernels_or_without(
    fused, monkeypatch):
  ours, grads, values = _bfloat16_model_values()
  monkeypatch.setattr(kernels, "_loaded", {kernels.library_path(): "off"})
  theirs, their_grads, _ = _bfloat16_model_values(values)
  # Another mask at any dropout site (masks drawn in another order) would move outputs
  # by whole values.
  assert np.all(np.abs(ours - theirs) <= 2.0 ** -6 * np.abs(theirs).max())
  assert sorted(grads) == sorted(their_grads)
  for name, grad in grads.items():
    want = their_grads[name]
    # The keys' bias moves all scores of a query alike, which the softmax ignores: its
    # gradient is zero but for rounding, held to its kernel's scale.
    scale = their_grads[name[:-len("bias")] + "kernel"] if name.endswith("key/bias") else want
    assert np.all(np.abs(grad - want) <= 2.0 ** -5 * np.abs(scale).max() + 1e-6), name


def _philox(c0, c1, c2, c3, k0, k1):
  """Philox4x32-10 of numpy uint64 arrays holding 32-bit counters, under the key (k0, k1),
  as the Philox paper (Salmon et al. 2011) and TensorFlow's random::PhiloxRandom define it."""
  mask = np.uint64(0xFFFFFFFF)
  (k0, k1) = (np.uint64(k0), np.uint64(k1))
  for _ in range(10):
    p0 = np.uint64(0xD2511F53) * c0
    p1 = np.uint64(0xCD9E8D57) * c2
    (c0, c1, c2, c3) = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & mask,
                        (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & mask)
    (k0, k1) = ((k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask)
  return c0, c1, c2, c3


def _keep_mask_in_numpy(size, seed, threshold):
  """The keep mask of `size` values for the stateless seed [s0, s1]: the key and the
  counter's high half from Philox of the seed under a fixed key, then draw g's four words
  give values 8g..8g+7, two 16-bit halves each (low first), kept where >= threshold."""
  (s0, s1) = [np.uint64(s % 2 ** 64) for s in seed]
  words = [np.array([w], np.uint64) for w in (s0 & np.uint64(0xFFFFFFFF), s0 >> np.uint64(32),
                                             s1 & np.uint64(0xFFFFFFFF), s1 >> np.uint64(32))]
  (k0, k1, c2, c3) = [int(w[0]) for w in _philox(*words, 0x3ec8f720, 0x02461e29)]
  groups = np.arange((size + 7) // 8, dtype=np.uint64)
  draws = _philox(groups, np.zeros_like(groups), np.full_like(groups, c2),
                  np.full_like(groups, c3), k0, k1)
  halves = np.stack([h for w in draws for h in (w & np.uint64(0xFFFF), w >> np.uint64(16))],
                    axis=1).reshape(-1)[:size]
  return halves >= threshold


@pytest.mark.parametrize("shape, seed, dropout_prob", [
    ([1], [0, 0], 0.1),
    ([3, 5, 7], [5, 2 ** 40 + 3], 0.1),
    ([2, 4099], [2 ** 59 + 12345, -1], 0.5),
    ([16, 300, 300], [987654321, 77], 0.1),
    ([2, 9], [1, 2], 0.99999),
])
def test_the_fused_keep_mask_is_the_masks_bits_for_bit(fused, monkeypatch, shape, seed,
                                                      dropout_prob):
  size = int(np.prod(shape))
  threshold = int(round(dropout_prob * 65536))
  with tf.Graph().as_default(), tf.Session() as session:
    mask = session.run(dropout.random_keep_mask(tf.constant(shape), dropout_prob,
                                                tf.constant(seed, tf.int64)))
    op_types = {op.type for op in tf.get_default_graph().get_operations()}
  assert mask.shape == tuple(shape)
  if hasattr(tf.raw_ops, "StatelessRandomUniformFullInt"):
    assert "BertKeepMask" in op_types
    monkeypatch.setattr(kernels, "_loaded", {kernels.library_path(): "off"})
    with tf.Graph().as_default(), tf.Session() as session:
      ops_mask = session.run(dropout.random_keep_mask(tf.constant(shape), dropout_prob,
                                                      tf.constant(seed, tf.int64)))
    np.testing.assert_array_equal(mask, ops_mask)
  else:  # TensorFlow 1.15's masks compare float32 draws: the kernel is checked alone
    with tf.Graph().as_default(), tf.Session() as session:
      mask = session.run(fused.bert_keep_mask(shape, seed, threshold=threshold))
  np.testing.assert_array_equal(mask.reshape(-1), _keep_mask_in_numpy(size, seed, threshold))
  assert abs(mask.mean() - (1 - threshold / 65536)) < 5 / np.sqrt(size) + 1e-9
  # The loop every CPU runs gives the mask of the AVX-512 one (where this CPU has it).
  with tf.Graph().as_default(), tf.Session() as session:
    portable = session.run(fused.bert_keep_mask(shape, seed, threshold=threshold,
                                                portable=True))
  np.testing.assert_array_equal(portable, mask)


@pytest.mark.parametrize("threshold, kept", [(0, True), (65536, False)])
def test_the_fused_keep_mask_keeps_all_or_nothing_at_the_ends(fused, threshold, kept):
  with tf.Graph().as_default(), tf.Session() as session:
    mask = session.run(fused.bert_keep_mask([5, 77], [3, 4], threshold=threshold))
  assert np.all(mask == kept)


def test_the_fused_keep_mask_of_no_values_is_empty(fused):
  with tf.Graph().as_default(), tf.Session() as session:
    mask = session.run(fused.bert_keep_mask([3, 0], [1, 2], threshold=6554))
  assert mask.shape == (3, 0)


def test_the_fused_keep_mask_names_a_seed_that_is_not_two_values(fused):
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="rank 1"):
      fused.bert_keep_mask([4], [[1, 2]], threshold=6554)
  with tf.Graph().as_default(), tf.Session() as session:
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="BertKeepMask: the seed must be a vector of 2 values, not \\[3\\]"):
      session.run(fused.bert_keep_mask([4], tf.constant([1, 2, 3], tf.int64), threshold=6554))


def _lamb_in_float64(w, m, v, g, hyper, adapt, weight_decay):
  """BertLambApply's update in float64: (w, m, v) after it."""
  lr, grad_scale, one_minus_b1, one_minus_b2, scale, epsilon = hyper
  g = g * grad_scale
  m = m + (g - m) * one_minus_b1
  v = v + (g * g - v) * one_minus_b2
  u = m * scale / (np.sqrt(v) + epsilon) + weight_decay * w
  (w_norm, u_norm) = (np.linalg.norm(w), np.linalg.norm(u))
  ratio = w_norm / u_norm if adapt and w_norm > 0 and u_norm > 0 else 1.0
  return w - lr * ratio * u, m, v


@pytest.mark.parametrize("adapt, weight_decay, start", [
    (True, 0.1, "random"), (False, 0.1, "random"), (False, 0.0, "random"),
    (True, 0.1, "zero")])
def test_the_lamb_kernel_updates_a_variable_of_many_blocks_as_float64_does(
    fused, adapt, weight_decay, start):
  """Two updates of a variable of 100,003 values (blocks of 4,096 shared by the threads,
  and a tail): the moments and the weights' change as float64 computes them, the same
  bits on 1 thread as on 2; a variable of zeros takes a trust ratio of 1."""
  rng = np.random.RandomState(5)
  n = 100003
  w0 = (rng.randn(n) if start == "random" else np.zeros(n)).astype(np.float32)
  grads = [(rng.randn(n) * 0.01).astype(np.float32) for _ in range(2)]
  hypers = [np.array([0.01, 0.5, 0.1, 0.001, 1.2, 1e-6], np.float32),
            np.array([0.009, 1.0, 0.1, 0.001, 1.1, 1e-6], np.float32)]
  with tf.Graph().as_default():
    w = tf.Variable(w0)
    (m, v) = (tf.Variable(np.zeros(n, np.float32)), tf.Variable(np.zeros(n, np.float32)))
    (g, hyper) = (tf.placeholder(tf.float32, [n]), tf.placeholder(tf.float32, [6]))
    update = fused.bert_lamb_apply(w, m, v, g, hyper, adapt=adapt, weight_decay=weight_decay)
    runs = []
    for threads in (2, 1):
      config = tf.ConfigProto(intra_op_parallelism_threads=threads)
      with tf.Session(config=config) as session:
        session.run(tf.global_variables_initializer())
        for grad, values in zip(grads, hypers):
          session.run(update, {g: grad, hyper: values})
        runs.append(session.run([w, m, v]))
  for one_thread, two_threads in zip(runs[1], runs[0]):
    np.testing.assert_array_equal(one_thread, two_threads)
  got = runs[0]
  want = [w0.astype(np.float64), 0.0, 0.0]
  for grad, values in zip(grads, hypers):
    want = _lamb_in_float64(want[0], want[1], want[2], grad.astype(np.float64),
                            values.astype(np.float64), adapt, weight_decay)
  for got_slot, want_slot in zip(got[1:], want[1:]):  # float32's rounding near 0
    np.testing.assert_allclose(got_slot, want_slot, rtol=1e-5,
                               atol=1e-6 * np.abs(want_slot).max())
  change, want_change = got[0] - w0, want[0] - w0
  assert np.abs(want_change).max() > 1e-4  # the weights moved
  np.testing.assert_allclose(change, want_change, rtol=1e-3, atol=1e-3 * np.abs(
      want_change).max())


@pytest.mark.parametrize("adapt", [True, False])
def test_the_lamb_kernel_reads_a_bfloat16_gradient_as_its_float32_cast(fused, adapt):
  """A gradient in bfloat16 (as the backward pass computed it) updates the variable and
  its moments bit for bit as the same values in float32 do."""
  rng = np.random.RandomState(6)
  n = 10007
  w0 = rng.randn(n).astype(np.float32)
  # Values bfloat16 holds exactly: float32's with the low 16 bits cleared.
  grad = ((rng.randn(n) * 0.01).astype(np.float32).view(np.uint32) & 0xffff0000).view(
      np.float32)
  results = []
  for dtype in (tf.float32, tf.bfloat16):
    with tf.Graph().as_default():
      w = tf.Variable(w0)
      (m, v) = (tf.Variable(np.full(n, 1e-3, np.float32)) for _ in range(2))
      g = tf.cast(tf.constant(grad), dtype)
      update = fused.bert_lamb_apply(w, m, v, g, [0.01, 0.5, 0.1, 0.001, 1.2, 1e-6],
                                     adapt=adapt, weight_decay=0.1)
      with tf.Session() as session:
        session.run(tf.global_variables_initializer())
        session.run(update)
        results.append(session.run([w, m, v]))
  assert np.abs(results[1][0] - w0).max() > 1e-4  # the weights moved
  for from_float, from_bfloat16 in zip(*results):
    np.testing.assert_array_equal(from_bfloat16, from_float)


@pytest.mark.parametrize("factor", [1.0, 0.37])
def test_the_fused_accumulation_of_a_bfloat16_gradient_gives_tensorflows_bits(fused, factor):
  """BertAccumulate(sum, grad, factor) adds grad * factor to the float32 sum in place, as
  TensorFlow's ApplyGradientDescent(sum, -factor, grad in float32) does, bit for bit."""
  rng = np.random.RandomState(8)
  n = 100003
  start = rng.randn(n).astype(np.float32)
  values = rng.randn(n).astype(np.float32)
  with tf.Graph().as_default() as graph:
    grad = tf.cast(tf.constant(values), tf.bfloat16)
    (ours, theirs) = (tf.Variable(start) for _ in range(2))
    twice = tf.group(fused.bert_accumulate(ours, grad, factor),
                     tf.raw_ops.ApplyGradientDescent(var=theirs, alpha=-factor,
                                                     delta=tf.cast(grad, tf.float32)))
    with tf.Session(graph=graph) as session:
      session.run(tf.global_variables_initializer())
      session.run(twice)
      session.run(twice)
      sums = session.run([ours, theirs])
  assert np.abs(sums[0] - start).max() > 0.1
  np.testing.assert_array_equal(sums[0], sums[1])


def test_the_fused_accumulation_names_a_gradient_of_another_shape(fused):
  with tf.Graph().as_default():
    total = tf.Variable(np.zeros([4, 3], np.float32))
    with pytest.raises(ValueError, match="Dimension 1 in both shapes must be equal"):
      fused.bert_accumulate(total, tf.zeros([4, 2], tf.bfloat16), 1.0)
    grad = tf.placeholder(tf.bfloat16, [None, 3])
    add = fused.bert_accumulate(total, grad, 1.0)
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match="BertAccumulate: sum and grad must have one shape"):
        session.run(add, {grad: np.zeros([5, 3], np.float32)})


@pytest.mark.parametrize("n", [0, 5, 100003])
def test_the_fused_square_sum_of_bfloat16_values_is_float64s_on_any_threads(fused, n):
  """BertSquareSum: the sum of the squares of bfloat16 values (blocks of 4,096 shared by
  the threads, and a tail), float64's sum rounded to float32 or within a few of its ulps,
  the same bits on 1 thread as on 2."""
  values = np.random.RandomState(7).randn(n).astype(np.float32)
  sums = []
  with tf.Graph().as_default():
    x = tf.cast(tf.constant(values), tf.bfloat16)
    square_sum = fused.bert_square_sum(x)
    assert square_sum.shape.as_list() == []
    for threads in (2, 1):
      config = tf.ConfigProto(intra_op_parallelism_threads=threads)
      with tf.Session(config=config) as session:
        (got, exact) = session.run([square_sum, tf.cast(x, tf.float64)])
        sums.append(got)
  assert sums[0] == sums[1] and sums[0].dtype == np.float32
  want = np.sum(exact * exact)
  np.testing.assert_allclose(sums[0], want, rtol=1e-6)
  assert (n == 0) == (want == 0.0)


def test_the_lamb_kernel_names_mismatched_shapes_and_hyperparameters(fused):
  with tf.Graph().as_default():
    (w, m, v) = (tf.Variable(np.zeros([4, 3], np.float32)) for _ in range(3))
    with pytest.raises(ValueError, match="Dimension 1 in both shapes must be equal"):
      fused.bert_lamb_apply(w, m, v, tf.zeros([4, 2]), tf.zeros([6]), adapt=True)
    with pytest.raises(ValueError, match="must be 6"):
      fused.bert_lamb_apply(w, m, v, tf.zeros([4, 3]), tf.zeros([5]), adapt=True)
    hyper = tf.placeholder(tf.float32, [None])
    update = fused.bert_lamb_apply(w, m, v, tf.zeros([4, 3]), hyper, adapt=True)
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match="BertLambApply: hyper must be a vector of 6 values, not \\[5\\]"):
        session.run(update, {hyper: np.zeros(5, np.float32)})
