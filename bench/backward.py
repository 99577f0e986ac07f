"""Which tensors the forward pass of a graph leaves in memory for its backward pass:
what bench/profile_step.py --memory sizes, and what tests/test_modeling.py checks of the
gradients written out by hand."""

import re


def gradient_seeds(graph):
  """The ops tf.gradients starts the backward pass from (it names them grad_ys_<i>)."""
  return [op for op in graph.get_operations()
          if re.search(r"(^|/)gradients(_\d+)?/grad_ys_\d+$", op.name)]


def ops_after(seeds):
  """The ops that depend on one of `seeds` (the seeds included), by data or control."""
  after, todo = set(), list(seeds)
  while todo:
    op = todo.pop()
    if op not in after:
      after.add(op)
      todo.extend(c for t in op.outputs for c in t.consumers())
      todo.extend(op._control_outputs)  # pylint: disable=protected-access
  return after


def kept_tensors(seeds):
  """For a list of ops `seeds`, the tensors computed before the backward pass that ops of it read: list of
  (tensor, slot), the backward pass being ops_after(seeds)."""
  if not seeds:
    return []
  backward = ops_after(seeds)
  graph = seeds[0].graph
  return [(t, slot) for op in graph.get_operations() if op not in backward
          for slot, t in enumerate(op.outputs)
          if any(c in backward for c in t.consumers())]
