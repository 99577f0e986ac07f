"""Classification data for fine-tuning: GLUE's task files as published, or a plain TSV,
turned into BERT's input features.

  examples = read_examples("mrpc", data_dir, "train")       # [Example(text_a, text_b, label)]
  labels = task_labels("mrpc", data_dir)                     # ["0", "1"]
  features = convert_examples(examples, labels, tokenizer, 128)  # dict of numpy arrays

Tasks and their files (in --data_dir; the columns are those of the GLUE download):

  mrpc   train.tsv dev.tsv test.tsv           header; label, id, id, sentence 1, sentence 2
  sst2   train.tsv dev.tsv test.tsv           header; sentence, label (test: index, sentence)
  cola   train.tsv dev.tsv test.tsv           no header; source, label, mark, sentence
                                              (test: header; index, sentence)
  mnli   train.tsv dev_matched.tsv test_matched.tsv
                                              header; premise in the 9th column,
                                              hypothesis in the 10th, label last
  tsv    train.tsv dev.tsv test.tsv           no header; text_a[<TAB>text_b]<TAB>label; the
                                              labels are those of train.tsv (else dev.tsv),
                                              without the spaces around them; test.tsv
                                              has train.tsv's columns, its label column
                                              left out or not read

Test files carry no labels: their examples get the first label, and only predictions
are made from them.
"""

import collections
import csv
import os

import numpy as np

Example = collections.namedtuple("Example", ["text_a", "text_b", "label"])

# Per task: file name per split, and per split kind ("labelled" for train/dev, "test"):
# (header lines to skip, column of text_a, column of text_b or None, column of the label
# or None).
_GLUE_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
TASKS = {
    "mrpc": dict(files=_GLUE_FILES, labels=["0", "1"],
                 labelled=(1, 3, 4, 0), test=(1, 3, 4, None)),
    "sst2": dict(files=_GLUE_FILES, labels=["0", "1"],
                 labelled=(1, 0, None, 1), test=(1, 1, None, None)),
    "cola": dict(files=_GLUE_FILES, labels=["0", "1"],
                 labelled=(0, 3, None, 1), test=(1, 1, None, None)),
    "mnli": dict(files={"train": "train.tsv", "dev": "dev_matched.tsv",
                        "test": "test_matched.tsv"},
                 labels=["contradiction", "entailment", "neutral"],
                 labelled=(1, 8, 9, -1), test=(1, 8, 9, None)),
    "tsv": dict(files=_GLUE_FILES, labels=None, labelled=None, test=None),
}


# The largest field csv reads here: any line (a C long on every platform, Windows' too).
_FIELD_LIMIT = 2 ** 31 - 1


def task_file(task_name, data_dir, split):
  """The path of a task's split ("train", "dev" or "test") in data_dir."""
  return os.path.join(data_dir, TASKS[task_name]["files"][split])


def _read_rows(path, task_name):
  if not os.path.isfile(path):
    files = " ".join(sorted(set(TASKS[task_name]["files"].values())))
    raise ValueError("%s does not exist; --data_dir must hold the %s files (%s)"
                     % (path, task_name, files))
  # csv's limit of 131072 characters a field guards against an unclosed quote swallowing
  # the file; quoting is off here, so a field ends at a tab or a line's end, and a long
  # text is input like any other (cut to --max_seq_length tokens). Restored after.
  limit = csv.field_size_limit(_FIELD_LIMIT)
  rows = []
  try:
    with open(path, encoding="utf-8", newline="") as f:
      reader = csv.reader(f, delimiter="\t", quotechar=None)
      try:
        for row in reader:
          rows.append(row)
      except csv.Error as e:
        raise ValueError("%s line %d cannot be read as tab-separated text (%s); correct the "
                         "line" % (path, reader.line_num, e))
  except UnicodeDecodeError as e:
    raise ValueError("%s cannot be read as tab-separated UTF-8 text (%s); save it as UTF-8 "
                     "TSV" % (path, e))
  finally:
    csv.field_size_limit(limit)
  return rows


def read_examples(task_name, data_dir, split, labels=None, labels_from="train.tsv"):
  """Reads one split of a task.

  Args:
    task_name: a key of TASKS.
    data_dir: the task's folder.
    split: "train", "dev" or "test".
    labels: the task's labels (task_labels); test examples get the first one.
    labels_from: where a plain TSV task's labels came from, for the error of a label
      not among them.

  Returns:
    list of Example (text_b None for single sentences).

  Raises:
    ValueError: a missing file or a line without the task's columns (names file and
      line).
  """
  path = task_file(task_name, data_dir, split)
  rows = _read_rows(path, task_name)
  task = TASKS[task_name]
  if labels is None:
    labels = task_labels(task_name, data_dir)
  examples = []
  if task_name == "tsv":
    if split == "test":
      return [Example(text_a, text_b, labels[0])
              for text_a, text_b in _tsv_test_texts(rows, path, data_dir)]
    for number, row in enumerate(rows, 1):
      if not row:
        continue
      label = _tsv_label(row, path, number)
      _check_label(label, labels, path, number, "the labels of " + labels_from)
      examples.append(Example(row[0], row[1] if len(row) == 3 else None, label))
    return examples
  (skip, a, b, label_column) = task["test" if split == "test" else "labelled"]
  needed = max(a, b or 0, label_column if label_column is not None and label_column >= 0
               else 0) + 1
  for number, row in enumerate(rows[skip:], skip + 1):
    if not row:
      continue
    if len(row) < needed:
      raise ValueError("%s line %d has %d columns, %s needs %d; is --task_name=%s the "
                       "task of --data_dir?" % (path, number, len(row), task_name, needed,
                                                task_name))
    label = labels[0] if label_column is None else row[label_column]
    _check_label(label, labels, path, number, "GLUE's %s labels" % task_name)
    examples.append(Example(row[a], row[b] if b is not None else None, label))
  return examples


def _tsv_test_texts(rows, path, data_dir):
  """(text_a, text_b or None) of each test.tsv line of a plain TSV task, which has
  train.tsv's columns (else dev.tsv's) with or without the label (not read).

  Raises:
    ValueError: a line of another number of columns; or of two, text_a<TAB>text_b or
      text<TAB>label, when no file of one layout tells which.
  """
  labelled, known = set(), None
  for split in ("train", "dev"):
    known = task_file("tsv", data_dir, split)
    if os.path.isfile(known):
      labelled = {len(row) for row in _read_rows(known, "tsv") if row}
      break
  texts = []
  for number, row in enumerate(rows, 1):
    if not row:
      continue
    if len(labelled) == 1:
      (columns,) = labelled
      if len(row) not in (columns - 1, columns):
        raise ValueError("%s line %d has %d columns but the lines of %s have %d; give a test "
                         "line those columns without the label (%d) or with it (%d, not read)"
                         % (path, number, len(row), os.path.basename(known), columns,
                            columns - 1, columns))
      pair = columns == 3
    elif len(row) == 2:
      why = ("%s has lines of both 2 and 3 columns" % os.path.basename(known) if labelled
             else "there is no train.tsv or dev.tsv beside it")
      raise ValueError("%s line %d has 2 columns: text_a<TAB>text_b, or text<TAB>label? %s "
                       "to tell; give its lines the label column too (any label, it is not "
                       "read)" % (path, number, why))
    elif len(row) not in (1, 3):
      raise ValueError("%s line %d has %d columns; a plain TSV test line is "
                       "text_a[<TAB>text_b][<TAB>label]" % (path, number, len(row)))
    else:
      pair = len(row) == 3
    texts.append((row[0], row[1] if pair else None))
  return texts


def _check_label(label, labels, path, number, known):
  if label not in labels:
    raise ValueError("%s line %d has the label %r, which is not one of %s %s; correct the "
                     "line or the task" % (path, number, label, known, labels))


def _tsv_label(row, path, number):
  """A plain TSV line's label: its last column, without the spaces around it (an editor's
  trailing space would make another class). A line must be text_a[<TAB>text_b]<TAB>label."""
  if len(row) not in (2, 3):
    raise ValueError("%s line %d has %d columns; a plain TSV line is "
                     "text_a[<TAB>text_b]<TAB>label" % (path, number, len(row)))
  label = row[-1].strip()
  if not label:
    raise ValueError("%s line %d has an empty label (the last column); give it its label or "
                     "remove the line" % (path, number))
  return label


def task_labels(task_name, data_dir, warn=None):
  """The task's labels in id order: GLUE's, or for a plain TSV the sorted labels of
  train.tsv (dev.tsv when there is no train.tsv).

  warn: (optional) function taking a line: then train.tsv's last column is also checked
  to look like labels (check_label_counts), as a fine-tune must."""
  labels = TASKS[task_name]["labels"]
  if labels is not None:
    return list(labels)
  for split in ("train", "dev"):
    path = task_file(task_name, data_dir, split)
    if os.path.isfile(path):
      lines = _label_lines(path, task_name)
      if warn is not None and split == "train":
        dev = task_file(task_name, data_dir, "dev")
        check_label_counts(lines, path, _label_lines(dev, task_name) if os.path.isfile(dev)
                           else {}, warn)
      return sorted(lines)
  raise ValueError("%s has neither train.tsv nor dev.tsv; the labels of a plain TSV task "
                   "come from them" % data_dir)


def _label_lines(path, task_name):
  """dict label -> the numbers of its lines in a plain TSV file."""
  lines = collections.defaultdict(list)
  for number, row in enumerate(_read_rows(path, task_name), 1):
    if row:
      lines[_tsv_label(row, path, number)].append(number)
  return lines


# Fewer training lines than this are too few to tell swapped columns from a small task.
_MIN_LINES_FOR_SWAPPED = 10


def check_label_counts(lines, path, dev_lines, warn):
  """Checks that the last column of the training lines holds labels. Refused: about as
  many labels as lines (the columns swapped), a first line whose label is the only one
  of its kind and not in dev.tsv (a header). Said in a warning: other labels of one line
  while the others have more (a rare class, or a typo the classifier would learn).

  Args:
    lines: dict label -> the numbers of its lines in path.
    path: the training file, for the messages.
    dev_lines: dict label -> its lines in dev.tsv ({} without one).
    warn: function taking a line.

  Raises:
    ValueError: naming the file (and the line) and the fix.
  """
  total = sum(len(numbers) for numbers in lines.values())
  if len(lines) > 1 and total >= _MIN_LINES_FOR_SWAPPED and 2 * len(lines) > total:
    raise ValueError("%s has %d different labels in %d lines: columns swapped, or a file "
                     "without labels? the label is the last column "
                     "(text_a[<TAB>text_b]<TAB>label); correct the file"
                     % (path, len(lines), total))
  single = sorted((numbers[0], label) for label, numbers in lines.items()
                  if len(numbers) == 1)
  others = [len(numbers) for numbers in lines.values() if len(numbers) > 1]
  if not single or not others:
    return
  number, label = single[0]
  more = {1: "", 2: ", and 1 more label has one line"}.get(
      len(single), ", and %d more labels have one line each" % (len(single) - 1))
  said = ("%s line %d holds the only example of the label %r%s (the others have %d lines "
          "or more)" % (path, number, label, more, min(others)))
  first = min(n for numbers in lines.values() for n in numbers)
  if number == first and label not in dev_lines:
    raise ValueError("%s: a header line? remove it; a plain TSV has none, its lines are "
                     "text_a[<TAB>text_b]<TAB>label" % said)
  warn("%s: a typo, or columns swapped? the label is the last column "
       "(text_a[<TAB>text_b]<TAB>label); correct the line if so" % said)


def _truncate_pair(tokens_a, tokens_b, max_length):
  """Shortens the longer of the two token lists, one token at a time, from the end (as
  Google's run_classifier does), until together they fit max_length."""
  while len(tokens_a) + len(tokens_b) > max_length:
    longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    longer.pop()


def convert_examples(examples, labels, tokenizer, max_seq_length):
  """Tokenizes examples into BERT's classification inputs.

  [CLS] text_a [SEP] (text_b [SEP]), segment 0 for the first part and 1 for text_b,
  padded with 0 to max_seq_length.

  Args:
    examples: list of Example.
    labels: the task's labels in id order.
    tokenizer: tokenization.FullTokenizer.
    max_seq_length: tokens per sequence.

  Returns:
    dict of numpy int32 arrays: input_ids, input_mask, segment_ids of shape
    [num_examples, max_seq_length] and label_ids of shape [num_examples].

  Raises:
    ValueError: an example's label is not one of labels.
  """
  label_ids = {label: i for i, label in enumerate(labels)}
  shape = (len(examples), max_seq_length)
  features = {"input_ids": np.zeros(shape, np.int32), "input_mask": np.zeros(shape, np.int32),
              "segment_ids": np.zeros(shape, np.int32),
              "label_ids": np.zeros(len(examples), np.int32)}
  for i, example in enumerate(examples):
    if example.label not in label_ids:
      raise ValueError("label %r of example %d (%r) is not one of the task's labels %s"
                       % (example.label, i, example.text_a[:40], labels))
    tokens_a = tokenizer.tokenize(example.text_a)
    tokens_b = tokenizer.tokenize(example.text_b) if example.text_b is not None else []
    if example.text_b is not None:
      _truncate_pair(tokens_a, tokens_b, max_seq_length - 3)
    else:
      tokens_a = tokens_a[:max_seq_length - 2]
    tokens = ["[CLS]"] + tokens_a + ["[SEP]"]
    segments = [0] * len(tokens)
    if tokens_b:
      tokens += tokens_b + ["[SEP]"]
      segments += [1] * (len(tokens_b) + 1)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    features["input_ids"][i, :len(ids)] = ids
    features["input_mask"][i, :len(ids)] = 1
    features["segment_ids"][i, :len(ids)] = segments
    features["label_ids"][i] = label_ids[example.label]
  return features
