r"""Packs pretraining TFRecords: up to --max_sequences_per_pack sequences in each record.

  python3 -m bert_pretrain.pack_records --input=/data/bert_wiki/train_data \
      --output_dir=/data/bert_wiki/packed_train_data [--max_sequences_per_pack=3] \
      [--seed=12345] [--num_output_files=N] [--jobs=N]

The input: records of create_pretraining_data (this repository's or MLCommons'), the
feature spec of records.py, one max_seq_length and max_predictions_per_seq. The output:
packed records (records.py, the packed format), part-00000-of-NNNNN ... (as many files
as the input has, or --num_output_files), and pack_records.json with the settings and,
once done, the summary. The output folder can be read as a training folder as it is.

Three steps, each resumable:

  lengths  reads every record once (TensorFlow's reader checks its CRC) and keeps each
           input file's token counts and record byte offsets -> work/index/NNNNN.npz,
           and the most masked-LM predictions a sequence of each length has.
  plan     from the histogram of lengths alone: the packs, by shortest-pack-first
           histogram packing (SPFHP, Krell et al., arXiv 2107.02027), its best-fit
           twin (longest pack first), and both with new packs filled with copies of a
           length (SPFHP opens one pack per sequence, so sequences of one length never
           share), whichever makes the fewest packs, every pack within
           max_seq_length tokens and max_predictions_per_pack predictions
           (records.max_predictions_per_pack); which sequences fill each pack (the
           sequences of one length dealt to the pack slots of that length in a
           seeded order); and the packs' order, a seeded shuffle -> work/plan/.
  write    output file j takes the next run of packs in that order, reads their
           sequences at their byte offsets (a batch of packs at a time, in file and
           offset order), checks each against the spec, packs and writes them,
           --jobs files at once.

Every input sequence goes into exactly one pack (MLPerf's rule for packing: each sample
is seen once), and the output's order is random. At the end it prints sequences in and
out (equal: out counts the written packs' sequences), packs, sequences per pack and the
share of padding tokens before and after. The same input, --seed and settings give
byte-identical files, whatever --jobs.

Memory is bounded by the number of sequences, not by the data: the plan and the write
steps hold 10 bytes per sequence (its slot in the packs, uint32; its record's byte
offset, uint32 when every input file is below 4 GiB, else uint64: 14 bytes; the packs'
order, uint32 a pack, 2 bytes a sequence at 2 sequences a pack). Besides those, the
lengths step holds one input file's lengths and offsets (10 bytes a record) and the
plan deals at most 2^20 lengths at a time (temporaries under 100 MB); each process
holds one batch of PACKS_PER_BATCH records or packs (about 140 MB at 512 tokens) and
TensorFlow; the write step maps the plan's arrays from work/plan/, so the --jobs
processes share one copy. For MLPerf's 156,726,829 sequences the plan is 1.6 GB. The
write step reads each sequence with a seek: fast on a local SSD or from the page cache,
slow on a disk or a network file system (copy the data to an SSD first).

Every file is written under a temporary name and renamed when complete; each finished
unit (an input file's index, the plan, an output file) leaves a done-marker in
work/done/, and a run started again skips them. The big arrays of work/ are deleted at
the end; the markers stay. pack_records.json records the settings; a folder made with
other ones, or holding other files, is refused.
"""

import collections
import hashlib
import json
import os
import shutil
import sys
import time

from absl import flags
import numpy as np

from bert_pretrain import errors
from bert_pretrain.data import packing
from bert_pretrain.processes import WorkerDied, run_tasks
from bert_pretrain.wiki.workdir import (Layout, PrepareError, Progress, atomic_output,
                                        atomic_records, file_digest, locked,
                                        marker_is_valid, read_json, remove_quietly,
                                        remove_stale_temporaries, say, step_settings,
                                        write_json)

TOOL = "pack_records"
MAX_SEQUENCES_PER_PACK = 3
SEED = 12345
# Bumped when the output for the same input and settings changes.
PACK_VERSION = 1
SETTINGS_FILE = "pack_records.json"
# Packs read and written together by a write task (and records read together by step
# lengths): their values are held in memory, about 140 MB at 512 tokens.
PACKS_PER_BATCH = 1024
# Lengths dealt to packs at a time in the plan step (bounds its temporaries).
ASSIGN_CHUNK = 1 << 20
# Input files a write task keeps open at once.
OPEN_FILES = 64


class PackError(PrepareError):
  """Bad input or output folder; the message names the problem and the fix."""


# ----------------------------------------------------------------------------------------
# The steps.
# ----------------------------------------------------------------------------------------


class PackLayout(Layout):
  """The paths of a packer's output folder (Layout's markers and lock)."""

  def __init__(self, output_dir):
    super(PackLayout, self).__init__(output_dir)
    self.settings = os.path.join(output_dir, SETTINGS_FILE)
    self.index = os.path.join(self.work, "index")
    self.plan = os.path.join(self.work, "plan")

  def index_file(self, number):
    return os.path.join(self.index, "%05d.npz" % number)

  def plan_file(self, name):
    return os.path.join(self.plan, name)


def input_identity(path):
  """{"bytes", "mtime_ns"} of a file: a changed file is indexed again."""
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  stat = tf.gfile.Stat(path)
  return {"bytes": int(stat.length), "mtime_ns": int(stat.mtime_nsec)}


class _Parser(object):
  """Reads a file's records in batches (TFRecordDataset checks each CRC) and parses
  batches with tf.io.parse_example (C++); names the first bad record of a batch."""

  def __init__(self, max_seq_length, max_predictions_per_seq):
    from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
    import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
    self.max_seq_length = max_seq_length
    self.max_predictions_per_seq = max_predictions_per_seq
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.path = tf.placeholder(tf.string, [])
      self.batches = tf.data.make_initializable_iterator(
          tf.data.TFRecordDataset(self.path).batch(PACKS_PER_BATCH))
      self.next_batch = self.batches.get_next()
      self.serialized = tf.placeholder(tf.string, [None])
      self.parsed = tf.io.parse_example(
          self.serialized, records.feature_spec(max_seq_length, max_predictions_per_seq))
    # One thread: --jobs processes share the cores.
    self.session = tf.Session(graph=self.graph, config=tf.ConfigProto(
        intra_op_parallelism_threads=1, inter_op_parallelism_threads=1))

  def read(self, path):
    """Yields the records of a file in batches: lists of bytes.

    Raises:
      tf.errors.DataLossError: a record whose CRC does not match, or a file cut short.
    """
    import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
    self.session.run(self.batches.initializer, {self.path: path})
    while True:
      try:
        yield self.session.run(self.next_batch).tolist()
      except tf.errors.OutOfRangeError:
        return

  def parse(self, serialized, where):
    """The batch's values, checked against the spec.

    Args:
      serialized: list of bytes.
      where: function from an index in the batch to "FILE record N (byte B)".

    Returns:
      dict from each name of records.FEATURE_NAMES to a 2-D numpy array [records, its
      length].

    Raises:
      PackError: the first record that is not a valid pretraining example of the
        set's lengths, with where it is and what is wrong.
    """
    from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
    import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
    try:
      values = self.session.run(self.parsed, {self.serialized: serialized})
    except tf.errors.InvalidArgumentError:
      values = None
    if values is not None:
      problems = records.example_problems(values)
      for index, problem in enumerate(problems):
        if problem:
          raise PackError("%s: %s; pass the records of create_pretraining_data"
                          % (where(index), problem))
      return values
    for index, record in enumerate(serialized):
      try:
        problem = records.example_problem(records.parse_example(record),
                                          self.max_seq_length, self.max_predictions_per_seq)
      except records.RecordError as e:
        raise PackError("%s is not a pretraining example: it %s; pass the records of "
                        "create_pretraining_data" % (where(index), e))
      if problem:
        raise PackError("%s: %s, where the first record of the input has max_seq_length "
                        "%d and max_predictions_per_seq %d; pass files of one "
                        "max_seq_length and max_predictions_per_seq"
                        % (where(index), problem, self.max_seq_length,
                           self.max_predictions_per_seq))
    raise PackError("%s: TensorFlow cannot parse these records; check them with python3 -m "
                    "bert_pretrain.inspect_records" % where(0))


def lengths_task(task):
  """Step lengths for one input file: its records' token counts and byte offsets.

  Args:
    task: (output folder, settings, file number, input path, its identity,
      max_seq_length, max_predictions_per_seq).

  Returns:
    dict: the file number and its bytes.
  """
  root, settings, number, path, identity, max_seq_length, max_predictions_per_seq = task
  from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  layout = PackLayout(root)
  parser = _Parser(max_seq_length, max_predictions_per_seq)
  lengths, offsets = [], []
  max_predictions = np.zeros(max_seq_length + 1, np.int64)
  count = offset = 0
  try:
    for batch in parser.read(path):
      sizes = np.array([len(serialized) for serialized in batch], np.int64) + (
          records.HEADER_BYTES + records.FOOTER_BYTES)
      starts = offset + np.cumsum(sizes) - sizes
      first = count
      values = parser.parse(batch, lambda index: "%s record %d (byte %d)" % (
          path, first + index, starts[index]))
      found = values["input_mask"].sum(axis=1)
      np.maximum.at(max_predictions, found,
                    np.count_nonzero(values["masked_lm_weights"], axis=1))
      lengths.append(found.astype(np.uint16))
      offsets.append(starts.astype(np.uint64))
      count += len(batch)
      offset += int(sizes.sum())
  except tf.errors.DataLossError as e:
    # The reader stops at the first bad record without saying which: the framing and
    # the CRCs record by record do.
    found, framing_error = records.record_offsets(path)
    corrupt = records.corrupt_records(path, found)
    if corrupt:
      where = "record %d at byte %d: %s" % corrupt[0]
    else:
      where = framing_error or e.message.splitlines()[0]
    raise PackError("%s is corrupt: %s; make it again (python3 -m "
                    "bert_pretrain.inspect_records lists every bad record)" % (path, where))
  lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.uint16)
  offsets = np.concatenate(offsets) if offsets else np.zeros(0, np.uint64)
  output = layout.index_file(number)
  with atomic_output(output, binary=True) as writer:
    np.savez(writer, lengths=lengths, offsets=offsets, max_predictions=max_predictions)
  write_json(layout.marker("lengths", "%05d" % number), {
      "settings": step_settings(settings, "pack_lengths"),
      "inputs": {path: identity},
      "outputs": {layout.relative(output): {"bytes": os.path.getsize(output)}},
      "stats": {"records": len(lengths), "tokens": int(lengths.sum(dtype=np.int64))}})
  return {"number": number, "bytes": identity["bytes"]}


def run_lengths(layout, settings, files, identities, jobs):
  """Step lengths: indexes every input file whose index is missing or stale."""
  for folder in (layout.index, os.path.join(layout.done, "lengths")):
    os.makedirs(folder, exist_ok=True)
    remove_stale_temporaries(folder)
  tasks = []
  for number, path in enumerate(files):
    marker = read_json(layout.marker("lengths", "%05d" % number))
    if not marker_is_valid(layout, marker, settings, "pack_lengths",
                           {path: identities[path]}):
      tasks.append((layout.root, settings, number, path, identities[path],
                    settings["max_seq_length"], settings["max_predictions_per_seq"]))
  if not tasks:
    return
  total = sum(task[4]["bytes"] for task in tasks)
  progress = Progress("lengths", total, tool=TOOL)
  done = [0]
  started = time.time()

  def on_result(result):
    done[0] += result["bytes"]
    progress.update(done[0])

  # Largest first, so no big file is left alone at the end.
  tasks.sort(key=lambda task: -task[4]["bytes"])
  run_tasks(lengths_task, tasks, jobs, on_result, context="spawn")
  elapsed = time.time() - started
  say("lengths: %d files read (%d done before) in %.1f s, %.1f MB/s"
      % (len(tasks), len(files) - len(tasks), elapsed,
         total / 1e6 / elapsed if elapsed > 0 else 0.0), TOOL)


def plan_id(settings, identities, files):
  """The identity of a plan: its settings and its inputs, in order."""
  text = json.dumps([step_settings(settings, "pack_plan"),
                     [[path, identities[path]] for path in files]], sort_keys=True)
  return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _save_array(path, array):
  with atomic_output(path, binary=True) as writer:
    np.save(writer, array)


def run_plan(layout, settings, files, identities):
  """Step plan: the packs, who fills them and their order -> work/plan/.

  Returns:
    the plan marker (its stats: sequences, packs, tokens, algorithm).
  """
  identity = plan_id(settings, identities, files)
  marker = read_json(layout.marker("plan"))
  if marker_is_valid(layout, marker, settings, "pack_plan", {"plan": identity}):
    return marker
  os.makedirs(layout.plan, exist_ok=True)
  remove_stale_temporaries(layout.plan)
  started = time.time()
  max_seq_length = settings["max_seq_length"]
  histogram = np.zeros(max_seq_length + 1, np.int64)
  max_predictions = np.zeros(max_seq_length + 1, np.int64)
  counts = []
  sizes = []
  for number, path in enumerate(files):
    with np.load(layout.index_file(number)) as index:
      lengths = index["lengths"]
      histogram += np.bincount(lengths, minlength=max_seq_length + 1)
      max_predictions = np.maximum(max_predictions, index["max_predictions"])
      counts.append(len(lengths))
    sizes.append(identities[path]["bytes"])
  total = int(histogram.sum())
  max_per_pack = settings["max_predictions_per_pack"]
  strategies, algorithm = packing.plan_strategies(histogram, max_predictions, max_per_pack,
                                          settings["max_sequences_per_pack"])

  def length_chunks():
    for number in range(len(files)):
      with np.load(layout.index_file(number)) as index:
        lengths = index["lengths"]
      for start in range(0, len(lengths), ASSIGN_CHUNK):
        yield lengths[start:start + ASSIGN_CHUNK]

  members, rng = packing.deal_sequences(length_chunks(), strategies, histogram,
                                        settings["seed"])
  slots = packing.Slots(strategies)
  order = np.arange(slots.num_packs, dtype=packing.index_dtype(slots.num_packs))
  rng.shuffle(order)
  offsets = np.zeros(total, np.uint32 if max(sizes) < 2 ** 32 else np.uint64)
  start = 0
  for number in range(len(files)):
    with np.load(layout.index_file(number)) as index:
      offsets[start:start + counts[number]] = index["offsets"]
    start += counts[number]
  outputs = {}
  for name, array in (("members.npy", members), ("order.npy", order),
                      ("offsets.npy", offsets)):
    _save_array(layout.plan_file(name), array)
    outputs[layout.relative(layout.plan_file(name))] = {
        "bytes": os.path.getsize(layout.plan_file(name))}
  tokens = int(np.dot(np.arange(max_seq_length + 1), histogram))
  marker = {
      "settings": step_settings(settings, "pack_plan"), "inputs": {"plan": identity},
      "outputs": outputs,
      "strategies": [[list(lengths), count] for lengths, count in strategies],
      "file_starts": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist(),
      "stats": {"sequences": total, "packs": slots.num_packs, "tokens": tokens,
                "algorithm": algorithm, "strategies": len(strategies),
                "largest_file_bytes": max(sizes)}}
  write_json(layout.marker("plan"), marker)
  say("plan: %d sequences -> %d packs (%s, %d kinds of pack) in %.1f s"
      % (total, slots.num_packs, algorithm, len(strategies), time.time() - started), TOOL)
  return marker


class _OpenFiles(object):
  """Input files open for reading, at most OPEN_FILES at once (least recently used
  closed first)."""

  def __init__(self):
    self.handles = collections.OrderedDict()

  def get(self, path):
    import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
    if path in self.handles:
      self.handles.move_to_end(path)
      return self.handles[path]
    if len(self.handles) >= OPEN_FILES:
      self.handles.popitem(last=False)[1].close()
    # Python's own file for a local path: a seek and two reads cost less than gfile's.
    self.handles[path] = (tf.gfile.GFile(path, "rb") if "://" in path else
                          open(path, "rb"))
    return self.handles[path]

  def close(self):
    for handle in self.handles.values():
      handle.close()
    self.handles.clear()


def write_task(task):
  """Step write for one output file: its packs, in plan order.

  Args:
    task: (output folder, settings, output name, first pack, end pack (in the packs'
      order), plan marker, input paths, plan identity).

  Returns:
    dict: the output name and its sequences.
  """
  root, settings, name, first, end, plan, files, identity = task
  from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
  layout = PackLayout(root)
  members = np.load(layout.plan_file("members.npy"), mmap_mode="r")
  order = np.load(layout.plan_file("order.npy"), mmap_mode="r")
  offsets = np.load(layout.plan_file("offsets.npy"), mmap_mode="r")
  slots = packing.Slots([(tuple(lengths), count) for lengths, count in plan["strategies"]])
  file_starts = np.array(plan["file_starts"], np.int64)
  max_seq_length = settings["max_seq_length"]
  max_predictions_per_seq = settings["max_predictions_per_seq"]
  max_per_pack = settings["max_predictions_per_pack"]
  max_sequences = settings["max_sequences_per_pack"]
  output = os.path.join(layout.root, name)
  stats = collections.Counter()
  opened = _OpenFiles()
  parser = _Parser(max_seq_length, max_predictions_per_seq)
  try:
    with atomic_records(output) as writer:
      for batch in range(first, end, PACKS_PER_BATCH):
        packs = np.asarray(order[batch:min(batch + PACKS_PER_BATCH, end)], np.int64)
        slot_numbers, sizes = slots.members(packs)
        sequences = np.asarray(members[slot_numbers], np.int64)
        file_numbers = np.searchsorted(file_starts, sequences, side="right") - 1
        starts = np.asarray(offsets[sequences], np.int64)
        serialized = [None] * len(sequences)
        # Read in file and offset order: one forward pass over each file.
        for i in np.lexsort((starts, file_numbers)):
          reader = opened.get(files[file_numbers[i]])
          reader.seek(int(starts[i]))
          header = reader.read(records.HEADER_BYTES)
          serialized[i] = reader.read(int.from_bytes(header[:8], "little"))

        def where(index):
          number = file_numbers[index]
          return "%s record %d (byte %d)" % (files[number], sequences[index] -
                                             file_starts[number], starts[index])

        values = parser.parse(serialized, where)
        packed = records.pack_batch(values, np.repeat(np.arange(len(packs)), sizes),
                                    len(packs), max_seq_length, max_per_pack, max_sequences)
        for example in records.serialize_examples(packed):
          writer.write(example)
        stats["tokens"] += int(np.count_nonzero(values["input_mask"]))
        stats["packs"] += len(packs)
        stats["sequences"] += len(sequences)
  finally:
    opened.close()
  write_json(layout.marker("write", name), {
      "settings": step_settings(settings, "pack_write"), "inputs": {"plan": identity},
      "outputs": {name: file_digest(output)}, "stats": dict(stats)})
  return {"name": name, "sequences": stats["sequences"]}


def output_names(num_files):
  return ["part-%05d-of-%05d" % (index, num_files) for index in range(num_files)]


def run_write(layout, settings, files, identities, jobs, plan):
  """Step write: every output file whose marker is missing or stale."""
  identity = plan_id(settings, identities, files)
  num_packs = plan["stats"]["packs"]
  num_files = min(settings["num_output_files"], num_packs)
  os.makedirs(os.path.join(layout.done, "write"), exist_ok=True)
  tasks = []
  for index, name in enumerate(output_names(num_files)):
    marker = read_json(layout.marker("write", name))
    if not marker_is_valid(layout, marker, settings, "pack_write", {"plan": identity}):
      first, end = num_packs * index // num_files, num_packs * (index + 1) // num_files
      tasks.append((layout.root, settings, name, first, end, plan, files, identity))
  if not tasks:
    return
  # The sequences each task writes, from the packs' sizes (for the progress line).
  slots = packing.Slots([(tuple(lengths), count) for lengths, count in plan["strategies"]])
  order = np.load(layout.plan_file("order.npy"), mmap_mode="r")
  expected = {}
  for task in tasks:
    expected[task[2]] = 0
    for start in range(task[3], task[4], ASSIGN_CHUNK):
      packs = np.asarray(order[start:min(start + ASSIGN_CHUNK, task[4])], np.int64)
      expected[task[2]] += int(slots.members(packs)[1].sum())
  del order
  total = sum(expected.values())
  unit, scale = ("M seq", 1e6) if total >= 1e6 else ("k seq", 1e3)
  progress = Progress("write", total, unit=unit, scale=scale, tool=TOOL)
  done = [0]
  started = time.time()

  def on_result(result):
    done[0] += result["sequences"]
    progress.update(done[0])

  run_tasks(write_task, tasks, jobs, on_result, context="spawn")
  elapsed = time.time() - started
  say("write: %d files written (%d done before) in %.1f s, %.0f sequences/s"
      % (len(tasks), num_files - len(tasks), elapsed,
         total / elapsed if elapsed > 0 else 0.0), TOOL)


# ----------------------------------------------------------------------------------------
# Checks before any work, and the run.
# ----------------------------------------------------------------------------------------


def list_inputs(inputs):
  """The input files of comma-separated folders, globs or files, in order.

  Raises:
    PackError: one is missing or holds no record file.
  """
  from bert_pretrain.data import input_pipeline  # pylint: disable=g-import-not-at-top
  files = []
  for pattern in (inputs or "").split(","):
    if pattern.strip():
      try:
        files.extend(input_pipeline.list_record_files(pattern.strip(), "--input"))
      except ValueError as e:
        raise PackError(str(e))
  if not files:
    raise PackError("--input is empty; pass --input=<folder, glob or files of "
                    "pretraining TFRecords>")
  duplicates = [path for path, count in collections.Counter(files).items() if count > 1]
  if duplicates:
    raise PackError("%s is given twice in --input; pass each file once (every sequence "
                    "must be packed once)" % duplicates[0])
  return files


def _first_record(path):
  """The bytes of a file's first record, from the TFRecord framing (its CRC is checked
  by step lengths).

  Raises:
    PackError: the file holds no record, or is not a TFRecord file.
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
  size = tf.gfile.Stat(path).length
  with tf.gfile.GFile(path, "rb") as reader:
    header = reader.read(records.HEADER_BYTES)
    length = int.from_bytes(header[:8], "little")
    if (len(header) < records.HEADER_BYTES or
        records.HEADER_BYTES + length + records.FOOTER_BYTES > size):
      raise PackError("%s is not a TFRecord file (or is cut short in its first record); "
                      "pass MLPerf pretraining TFRecords" % path)
    return reader.read(length)


def check_inputs(files):
  """Reads the first record of every file: all unpacked, of one set of lengths.

  Returns:
    (max_seq_length, max_predictions_per_seq).

  Raises:
    PackError: a file is not pretraining records, holds packed ones, or has other
      lengths than the first file.
  """
  from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
  first = None
  for path in files:
    serialized = _first_record(path)
    try:
      layout = records.record_layout(serialized)
    except records.RecordError as e:
      raise PackError("%s is not MLPerf pretraining records: its first record %s%s; pass "
                      "the TFRecords of create_pretraining_data"
                      % (path, "is " if e.not_an_example else "", e))
    if layout.packed:
      raise PackError("%s holds packed records already; pass the unpacked records they "
                      "were made from" % path)
    if first is None:
      first = (path, layout)
    elif layout[1:3] != first[1][1:3]:
      raise PackError(
          "%s has max_seq_length %d and max_predictions_per_seq %d, %s has %d and %d; "
          "pack the files of each sequence length separately (one --input each)"
          % (path, layout.max_seq_length, layout.max_predictions, first[0],
             first[1].max_seq_length, first[1].max_predictions))
  return first[1].max_seq_length, first[1].max_predictions


def reconcile_settings(layout, settings):
  """Checks the folder against this run's settings and records them.

  Returns:
    the bytes of pack_records.json before (None: there was none), to put back when the
    run is refused before anything is written.

  Raises:
    PackError: the folder holds other files, or packs made with other settings.
  """
  stored = read_json(layout.settings)
  before = None
  if stored is None:
    own = [".lock"] + (["work"] if os.path.isdir(layout.done) else [])
    leftovers = [n for n in os.listdir(layout.root) if n not in own]
    if leftovers:
      raise PackError("output folder %s is not empty and holds no %s (it has %s); pass an "
                      "empty or new --output_dir" % (layout.root, SETTINGS_FILE,
                                                     ", ".join(sorted(leftovers)[:3])))
  else:
    with open(layout.settings, "rb") as reader:
      before = reader.read()
    differences = []
    for key, value in sorted(settings.items()):
      if stored.get("settings", {}).get(key) != value:
        there = stored.get("settings", {}).get(key)
        if key == "inputs":
          differences.append("other input files (%d there, %d now)"
                             % (len(there or []), len(value)))
        else:
          differences.append("%s=%s there, %s now" % (key, json.dumps(there),
                                                       json.dumps(value)))
    if differences:
      raise PackError("output folder %s holds packs made by another command (%s); pass "
                      "the same flags to resume it, or a new --output_dir"
                      % (layout.root, "; ".join(differences)))
  if stored is None or "settings" not in stored:
    write_json(layout.settings, {"tool": "python3 -m bert_pretrain.pack_records",
                                 "settings": settings})
  return before


def check_settings(max_sequences_per_pack, num_output_files, jobs, seed):
  if max_sequences_per_pack < 1:
    raise PackError("--max_sequences_per_pack=%d must be >= 1 (MLPerf's submitters: 3)"
                    % max_sequences_per_pack)
  if num_output_files < 0:
    raise PackError("--num_output_files=%d must be >= 0 (0: as many as input files)"
                    % num_output_files)
  if jobs < 1:
    raise PackError("--jobs=%d must be >= 1" % jobs)
  if not 0 <= seed < 2 ** 32:  # numpy's seeds
    raise PackError("--seed=%d must be from 0 to %d" % (seed, 2 ** 32 - 1))


def pack(inputs, output_dir, max_sequences_per_pack=MAX_SEQUENCES_PER_PACK, seed=SEED,
         num_output_files=0, jobs=1, identities=None):
  """Packs the records of `inputs` into output_dir; what is already done is skipped.

  Args:
    inputs: comma-separated folders, globs or files of unpacked pretraining TFRecords,
      or a list of files.
    output_dir: the output folder (created if missing).
    max_sequences_per_pack: int, k.
    seed: int, for who shares a pack and the packs' order.
    num_output_files: output files; 0: as many as input files.
    jobs: processes for the lengths and write steps.
    identities: (optional) dict input path -> a dict that tells its content from
      another's, with its "bytes" (the wiki pipeline's bytes and sha256); default:
      its bytes and modification time.

  Returns:
    dict, the summary: sequences_in, sequences_out, packs, sequences_per_pack,
    padding_before, padding_after, files, seconds, done_before.

  Raises:
    PackError: on bad input, before any work starts (or, for a record found bad while
      reading, with nothing written lost).
  """
  started = time.time()
  check_settings(max_sequences_per_pack, num_output_files, jobs, seed)
  files = list(inputs) if isinstance(inputs, (list, tuple)) else list_inputs(inputs)
  # Absolute, so that the same files named from another folder resume the same run.
  absolute = {path: path if "://" in path else os.path.abspath(path) for path in files}
  files = [absolute[path] for path in files]
  if identities is not None:
    identities = {absolute.get(path, path): value for path, value in identities.items()}
  if not output_dir:
    raise PackError("pass --output_dir=<folder for the packed records>")
  output_root = os.path.abspath(output_dir)
  inside = [path for path in files
            if os.path.abspath(path).startswith(output_root + os.sep)]
  if inside:
    raise PackError("input file %s is inside --output_dir=%s; pass another --output_dir"
                    % (inside[0], output_dir))
  max_seq_length, max_predictions_per_seq = check_inputs(files)
  if identities is None:
    identities = {path: input_identity(path) for path in files}
  settings = {
      "pack_version": PACK_VERSION, "inputs": files,
      "max_sequences_per_pack": max_sequences_per_pack, "seed": seed,
      "num_output_files": num_output_files or len(files),
      "max_seq_length": max_seq_length, "max_predictions_per_seq": max_predictions_per_seq,
      "max_predictions_per_pack": max_predictions_per_seq + max_sequences_per_pack}
  from bert_pretrain.data import records  # pylint: disable=g-import-not-at-top
  assert settings["max_predictions_per_pack"] == records.max_predictions_per_pack(
      max_predictions_per_seq, max_sequences_per_pack)
  layout = PackLayout(output_dir)
  with locked(layout, TOOL):
    remove_stale_temporaries(layout.root)
    before = reconcile_settings(layout, settings)
    try:
      summary = _run_steps(layout, settings, files, identities, jobs)
    except PackError:
      # A refused input must not bind the folder: the corrected command is accepted.
      if not any(name in os.listdir(layout.root) for name in
                 output_names(settings["num_output_files"])):
        _restore(layout.settings, before)
      raise
  summary["seconds"] = time.time() - started
  return summary


def _restore(path, content):
  if content is None:
    remove_quietly(path)
  else:
    with atomic_output(path, binary=True) as writer:
      writer.write(content)


def _run_steps(layout, settings, files, identities, jobs):
  """Runs the steps that are not done; returns the summary (see pack)."""
  stored = read_json(layout.settings)
  identity = plan_id(settings, identities, files)
  if stored.get("summary") and stored["summary"].get("plan") == identity and all(
      marker_is_valid(layout, read_json(layout.marker("write", name)), settings,
                      "pack_write", {"plan": identity})
      for name in output_names(stored["summary"]["files"])):
    summary = dict(stored["summary"], done_before=True)
    return summary
  plan = read_json(layout.marker("plan"))
  if not marker_is_valid(layout, plan, settings, "pack_plan", {"plan": identity}):
    run_lengths(layout, settings, files, identities, jobs)
    plan = run_plan(layout, settings, files, identities)
  run_write(layout, settings, files, identities, jobs, plan)
  num_files = min(settings["num_output_files"], plan["stats"]["packs"])
  written = collections.Counter()
  for name in output_names(num_files):
    marker = read_json(layout.marker("write", name))
    if not marker_is_valid(layout, marker, settings, "pack_write", {"plan": identity}):
      raise PackError("%s was not written; run the same command again" % name)
    written.update(marker["stats"])
  stats = plan["stats"]
  if written["sequences"] != stats["sequences"] or written["packs"] != stats["packs"]:
    raise PackError("the packs hold %d sequences in %d packs, the plan %d in %d; delete "
                    "%s and run again" % (written["sequences"], written["packs"],
                                          stats["sequences"], stats["packs"], layout.root))
  width = settings["max_seq_length"]
  summary = {
      "sequences_in": stats["sequences"], "sequences_out": written["sequences"],
      "packs": written["packs"],
      "sequences_per_pack": written["sequences"] / float(written["packs"]),
      "tokens": written["tokens"],
      "padding_before": 1.0 - stats["tokens"] / float(stats["sequences"] * width),
      "padding_after": 1.0 - written["tokens"] / float(written["packs"] * width),
      "algorithm": stats["algorithm"], "files": num_files,
      "max_seq_length": width,
      "max_predictions_per_pack": settings["max_predictions_per_pack"],
      "max_sequences_per_pack": settings["max_sequences_per_pack"],
      "plan": identity, "done_before": False}
  record = read_json(layout.settings)
  record["summary"] = {k: v for k, v in summary.items() if k != "done_before"}
  write_json(layout.settings, record)
  # The big arrays go; the markers stay, so a rerun finds the work done.
  for folder in (layout.index, layout.plan):
    shutil.rmtree(folder, ignore_errors=True)
  return summary


def read_summary(folder):
  """The summary (see pack) that pack_records.json in `folder` holds once the packing is
  done, or None (no such file, or the packing is not done)."""
  path = os.path.join(folder, SETTINGS_FILE)
  if not os.path.isfile(path):
    return None
  return read_json(path).get("summary")


def summary_line(summary, output_dir):
  """The line printed at the end."""
  return ("%s: %d sequences in, %d out, in %d packs (%.3f sequences a pack); padding "
          "%.1f%% of the tokens before, %.1f%% after; %d files in %s%s"
          % (TOOL, summary["sequences_in"], summary["sequences_out"], summary["packs"],
             summary["sequences_per_pack"], 100 * summary["padding_before"],
             100 * summary["padding_after"], summary["files"], output_dir,
             " (done before)" if summary.get("done_before") else
             ", %.1f s" % summary["seconds"]))


def describe_os_error(error):
  """One line for an OSError (errors.os_error_message); a full disk also says what the
  packs need."""
  return errors.os_error_message(error, disk_full=lambda what: (
      "the disk is full writing %s (No space left on device); free space there (the packs "
      "take about as much as the input) and run the same command again: finished files "
      "are kept" % what))


def define_flags():
  """Defines the command-line flags; only when run as a script."""
  flags.DEFINE_string("input", None, "Unpacked pretraining TFRecords: a folder, glob or "
                      "file (comma-separated for several).")
  flags.DEFINE_string("output_dir", None, "Folder for the packed records (created if "
                      "missing).")
  flags.DEFINE_integer("max_sequences_per_pack", MAX_SEQUENCES_PER_PACK,
                       "The most sequences in one packed record.")
  flags.DEFINE_integer("seed", SEED, "Seed of who shares a pack and of the packs' order.")
  flags.DEFINE_integer("num_output_files", 0, "Output files (0: as many as input files).")
  flags.DEFINE_integer("jobs", os.cpu_count() or 1,
                       "Processes for reading the lengths and writing the packs.")


def run_pack(inputs, output_dir, max_sequences_per_pack=MAX_SEQUENCES_PER_PACK, seed=SEED,
             num_output_files=0, jobs=1, out=None, err=None):
  """Packs and prints the summary line, as the command does.

  Args:
    inputs, output_dir, max_sequences_per_pack, seed, num_output_files, jobs: as pack.
    out: stream for the summary line (default stdout).
    err: stream for the error line (default stderr).

  Returns:
    the exit status: 0 done, 2 bad input, 1 interrupted, a write error or a worker
    process that died, 143 terminated (SIGTERM, with take_stop_signals).
  """
  out = out or sys.stdout
  err = err or sys.stderr
  try:
    summary = pack(inputs, output_dir, max_sequences_per_pack, seed, num_output_files, jobs)
  except (PrepareError, WorkerDied) as e:
    err.write("%s: error: %s\n" % (TOOL, e))
    return 1 if isinstance(e, WorkerDied) else 2
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM's errors.Terminated
    return errors.stopped_by_signal(
        TOOL, e, "run the same command again to go on where it stopped", err)
  except OSError as e:
    err.write("%s: error: %s\n" % (TOOL, describe_os_error(e)))
    return 1
  out.write(summary_line(summary, output_dir) + "\n")
  return 0


def main(argv):
  """Packs from the flags; exits 2 with one line on bad input."""
  if len(argv) > 1:
    errors.unexpected_arguments(TOOL, argv[1:])
  errors.take_stop_signals()
  flag_values = flags.FLAGS
  sys.exit(run_pack(flag_values.input, flag_values.output_dir,
                    flag_values.max_sequences_per_pack, flag_values.seed,
                    flag_values.num_output_files, flag_values.jobs))


if __name__ == "__main__":
  define_flags()
  errors.run_main(TOOL, main)
