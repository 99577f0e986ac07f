"""Which tensors the forward pass of a graph leaves in memory for its backward pass:
what bench/profile_step.py --memory sizes, and what tests/test_modeling.py checks of the
gradients written out by hand."""

import re

# Grappler removes these; the tensor they pass on is what stays in memory.
FORWARDING_OPS = ("Identity", "IdentityN")


def gradient_seeds(graph):
  """The ops tf.gradients starts the backward pass from (it names them grad_ys_<i>)."""
  return [op for op in graph.get_operations()
          if re.search(r"(^|/)gradients(_\d+)?/grad_ys_\d+$", op.name)]


def ops_after(seeds):
  """The ops that depend on one of the ops `seeds` (them included), by data or control."""
  after, todo = set(), list(seeds)
  while todo:
    op = todo.pop()
    if op not in after:
      after.add(op)
      todo.extend(c for t in op.outputs for c in t.consumers())
      todo.extend(op._control_outputs)  # pylint: disable=protected-access
  return after


def ops_before(fetches):
  """The ops that running `fetches` (Tensors or ops) runs: their inputs' closure."""
  before, todo = set(), [getattr(f, "op", f) for f in fetches]
  while todo:
    op = todo.pop()
    if op not in before:
      before.add(op)
      todo.extend(t.op for t in op.inputs)
      todo.extend(op.control_inputs)
  return before


def passed_on(tensor):
  """The tensor a chain of forwarding ops ending in `tensor` passes on."""
  while tensor.op.type in FORWARDING_OPS:
    tensor = tensor.op.inputs[tensor.value_index]
  return tensor


def kept_tensors(seeds, fetches, sources=None):
  """The tensors the forward pass leaves for the backward pass: computed before it (the
  ops after `seeds`) and read by one of its ops that running `fetches` runs.

  Args:
    seeds: list of ops the backward pass starts from.
    fetches: list of Tensors or ops, what a step runs.
    sources: (optional) list of ops; if given, only tensors that depend on one of them
      (the input batch's: activations, not weights and their casts).

  Returns:
    set of Tensors, forwarding ops followed to the tensor they pass on.
  """
  backward = ops_after(seeds) & ops_before(fetches)
  computed_from = ops_after(sources) if sources is not None else None
  kept = set()
  for op in backward:
    for tensor in op.inputs:
      tensor = passed_on(tensor)
      if tensor.op not in backward and (computed_from is None or tensor.op in computed_from):
        kept.add(tensor)
  return kept
