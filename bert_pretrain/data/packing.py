"""Histogram packing: which sequences of a set of lengths share a pack.

Shortest-pack-first histogram packing (SPFHP, Krell et al., arXiv 2107.02027) and its
variants work on the histogram of lengths alone (plan_strategies picks the one with the
fewest packs); deal_sequences then hands the sequences of each length to the pack slots
of that length in a seeded order. pack_records runs them on a whole training set.
"""

import collections
import math

import numpy as np


def histogram_packing(histogram, max_predictions, max_predictions_per_pack,
                      max_sequences_per_pack, shortest_first=True, fill_new=False):
  """Packs a histogram of sequence lengths, longest lengths first.

  Each length's sequences go, as many as fit, into the open packs with the most room
  (shortest_first: SPFHP) or the least room that fits (best fit), the rest into new
  packs: one each, or (fill_new) as many as fit in one pack, so that sequences of one
  length can share a pack too. A pack is open while it has fewer than
  max_sequences_per_pack sequences and room left; a sequence fits when its tokens and
  the most predictions a sequence of its length has fit.

  Args:
    histogram: int array [max_seq_length + 1], histogram[L] sequences of L tokens
      (histogram[0] is 0).
    max_predictions: int array like histogram: the most masked-LM predictions a
      sequence of each length has.
    max_predictions_per_pack: int, the predictions a pack holds.
    max_sequences_per_pack: int.
    shortest_first: SPFHP; False: best fit.
    fill_new: fill new packs with copies of the length.

  Returns:
    list of (lengths, count): `count` packs of sequences of these lengths (a tuple,
    longest first), sorted by lengths.
  """
  max_seq_length = len(histogram) - 1
  # Room left -> {lengths: [count, predictions]}, in the order the groups were made.
  open_packs = collections.defaultdict(collections.OrderedDict)
  finished = collections.Counter()

  def add(lengths, count, predictions):
    room = max_seq_length - sum(lengths)
    if len(lengths) == max_sequences_per_pack or room == 0:
      finished[lengths] += count
      return
    group = open_packs[room].setdefault(lengths, [0, predictions])
    group[0] += count

  for length in range(max_seq_length, 0, -1):
    left = int(histogram[length])
    need = int(max_predictions[length])
    while left:
      rooms = sorted((room for room in open_packs if room >= length),
                     reverse=shortest_first)
      chosen = None
      for room in rooms:
        # The newest group first, as SPFHP takes the last pack of its list.
        for lengths, (count, predictions) in reversed(open_packs[room].items()):
          if predictions + need <= max_predictions_per_pack:
            chosen = room, lengths, count, predictions
            break
        if chosen:
          break
      if chosen is None:
        copies = 1
        if fill_new:
          copies = min(max_sequences_per_pack, max_seq_length // length,
                       max_predictions_per_pack // max(need, 1), left)
        add((length,) * copies, left // copies, need * copies)
        if left % copies:
          add((length,) * (left % copies), 1, need * (left % copies))
        break
      room, lengths, count, predictions = chosen
      taken = min(count, left)
      if taken == count:
        del open_packs[room][lengths]
        if not open_packs[room]:
          del open_packs[room]
      else:
        open_packs[room][lengths][0] -= taken
      add(lengths + (length,), taken, predictions + need)
      left -= taken
  for groups in open_packs.values():
    for lengths, (count, _) in groups.items():
      finished[lengths] += count
  return sorted(finished.items())


def plan_strategies(histogram, max_predictions, max_predictions_per_pack,
                    max_sequences_per_pack):
  """SPFHP and best fit, each with and without filling new packs (histogram_packing),
  on the histogram; the one with the fewest packs (the first of them on a tie).

  Args:
    histogram, max_predictions, max_predictions_per_pack, max_sequences_per_pack: as
      histogram_packing.

  Returns:
    (strategies, name): the list of (lengths, count), and the variant's name, e.g.
    "SPFHP" or "best fit, new packs filled".

  Raises:
    AssertionError: a strategy set that does not hold every sequence once.
  """
  results = []
  for fill_new in (False, True):
    for name, shortest_first in (("SPFHP", True), ("best fit", False)):
      strategies = histogram_packing(histogram, max_predictions, max_predictions_per_pack,
                                     max_sequences_per_pack, shortest_first, fill_new)
      results.append((sum(count for _, count in strategies), len(results),
                      name + (", new packs filled" if fill_new else ""), strategies))
  packs, _, name, strategies = min(results, key=lambda result: result[:2])
  used = np.zeros(len(histogram), np.int64)
  for lengths, count in strategies:
    for length in lengths:
      used[length] += count
  assert np.array_equal(used, np.asarray(histogram, np.int64)), "packing lost sequences"
  del packs
  return strategies, name


# ----------------------------------------------------------------------------------------
# Dealing the sequences to the packs.
# ----------------------------------------------------------------------------------------


def index_dtype(count):
  """The smallest unsigned dtype of numpy that counts to `count`."""
  return np.uint32 if count < 2 ** 32 else np.uint64


class Slots(object):
  """Where each strategy's packs sit: packs numbered strategy by strategy, their
  sequences' slots pack by pack (a `members` array in that order)."""

  def __init__(self, strategies):
    self.sizes = np.array([len(lengths) for lengths, _ in strategies], np.int64)
    counts = np.array([count for _, count in strategies], np.int64)
    self.first_pack = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    self.first_slot = np.concatenate([[0], np.cumsum(counts * self.sizes)[:-1]]).astype(
        np.int64)
    self.num_packs = int(counts.sum())
    self.num_slots = int((counts * self.sizes).sum())

  def members(self, packs):
    """The slots of some packs, pack by pack.

    Args:
      packs: int array of pack numbers.

    Returns:
      (slots, sizes): int64 arrays, the slots of the packs one after the other and
      the number of sequences of each pack.
    """
    strategy = np.searchsorted(self.first_pack, packs, side="right") - 1
    sizes = self.sizes[strategy]
    starts = self.first_slot[strategy] + (packs - self.first_pack[strategy]) * sizes
    ends = np.cumsum(sizes)
    within = np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - sizes, sizes)
    return np.repeat(starts, sizes) + within, sizes


def deal_sequences(length_chunks, strategies, histogram, seed):
  """Deals the sequences to the packs' slots: which sequences share a pack.

  The sequences of length L, in input order, are numbered r = 0, 1, ...; r goes to the
  (a r + b) mod n_L -th slot of length L (a coprime to n_L and b drawn with the seed),
  the slots of L taken strategy by strategy, pack by pack. So neighbouring input
  sequences land in packs far apart, and the seed changes who shares a pack.

  Args:
    length_chunks: iterable of uint16 arrays, the lengths of all sequences in input
      order, in pieces (pack_records deals 2^20 at a time).
    strategies: list of (lengths, count) from plan_strategies.
    histogram: its histogram.
    seed: int.

  Returns:
    (members, rng): members[slot] is the input index of the sequence in that slot
    (Slots order); the RandomState after its draws, for the packs' order.
  """
  max_seq_length = len(histogram) - 1
  total = int(np.sum(histogram))
  rng = np.random.RandomState(seed)
  multiplier = np.ones(max_seq_length + 1, np.int64)
  shift = np.zeros(max_seq_length + 1, np.int64)
  for length in range(1, max_seq_length + 1):
    n = int(histogram[length])
    if n > 1:
      while True:
        a = int(rng.randint(1, min(n, 2 ** 31)))
        if math.gcd(a, n) == 1:
          break
      multiplier[length] = a
      shift[length] = int(rng.randint(0, n))
  # The slots of each length: one entry per (strategy, position in it), by length.
  slots = Slots(strategies)
  entries = []
  for index, (lengths, count) in enumerate(strategies):
    for position, length in enumerate(lengths):
      entries.append((length, index, position, count))
  entries.sort()
  entry_length = np.array([e[0] for e in entries], np.int64)
  entry_count = np.array([e[3] for e in entries], np.int64)
  entry_strategy = np.array([e[1] for e in entries], np.int64)
  entry_first = np.concatenate([[0], np.cumsum(entry_count)[:-1]]).astype(np.int64)
  entry_base = slots.first_slot[entry_strategy] + np.array([e[2] for e in entries],
                                                           np.int64)
  entry_stride = slots.sizes[entry_strategy]
  length_first = np.concatenate([[0], np.cumsum(histogram)[:-1]]).astype(np.int64)
  assert np.array_equal(np.bincount(entry_length, entry_count, max_seq_length + 1),
                        np.asarray(histogram, np.float64))
  members = np.zeros(total, index_dtype(total))
  seen = np.zeros(max_seq_length + 1, np.int64)
  done = 0
  for chunk in length_chunks:
    chunk = np.asarray(chunk, np.int64)
    order = np.argsort(chunk, kind="stable")
    counts = np.bincount(chunk, minlength=max_seq_length + 1)
    first = np.cumsum(counts) - counts
    rank = np.empty(len(chunk), np.int64)
    rank[order] = np.arange(len(chunk)) - first[chunk[order]]
    number = seen[chunk] + rank
    seen += counts
    dealt = (multiplier[chunk] * number + shift[chunk]) % histogram[chunk]
    place = length_first[chunk] + dealt
    entry = np.searchsorted(entry_first, place, side="right") - 1
    slot = entry_base[entry] + (place - entry_first[entry]) * entry_stride[entry]
    members[slot] = np.arange(done, done + len(chunk))
    done += len(chunk)
  assert done == total and np.array_equal(seen, histogram)
  return members, rng
