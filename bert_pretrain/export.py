r"""Exports a BERT checkpoint to a folder that Hugging Face transformers loads.

  python3 -m bert_pretrain.export --checkpoint=results/model.ckpt-28252 \
      --bert_config_file=bert_config.json --vocab_file=vocab.txt --output_dir=hf_bert

writes, for `transformers.BertForPreTraining.from_pretrained(output_dir)` and
`BertTokenizer.from_pretrained(output_dir)`:

  config.json              the model's settings in transformers' names
  model.safetensors        the weights, float32, in transformers' names
  vocab.txt, tokenizer_config.json, special_tokens_map.json

Any checkpoint with Google's variable names works: this recipe's or Google's own, stored
in float32 or another float type. What is no weight of the model is left out and counted
(optimizer slots, global_step, a loss scale). The names map one to one
(bert/encoder/layer_3/attention/self/query/kernel -> bert.encoder.layer.3.attention.
self.query.weight); dense kernels are transposed, as torch.nn.Linear keeps [out, in]. The
masked-LM output projection is the word embedding table in both (transformers ties them).
Google BERT's GELU is the tanh approximation, transformers' "gelu_new".

safetensors is written here (8 bytes of header length, a JSON header, the raw tensors),
so the export needs neither torch nor the safetensors package.

Nothing is overwritten: --output_dir must be new or empty and hold none of the inputs;
the folder is written under a temporary name and renamed when complete. The config is
checked against the checkpoint (checkpoints.check_config, and every weight transformers
expects of it) before anything is written.
"""

import json
import os
import re
import shutil
import struct
import sys

from absl import flags
import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain.training import checkpoints
from bert_pretrain import errors
from bert_pretrain.data import tokenization
from bert_pretrain.model import heads
from bert_pretrain.model import modeling

FLAGS = flags.FLAGS

# A config's vocab_size pads the vocab's tokens with fewer rows than this (to a multiple
# of 1024 at most); more suggest another vocab.
_MOST_PADDING = 1024
# transformers' names of Google's hidden_act values.
ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu", "tanh": "tanh", "linear": "linear"}
# Google name (a regular expression) -> transformers name, and whether to transpose.
_RENAMES = [
    (r"bert/embeddings/(word|position|token_type)_embeddings",
     r"bert.embeddings.\1_embeddings.weight", False),
    (r"bert/embeddings/LayerNorm/gamma", r"bert.embeddings.LayerNorm.weight", False),
    (r"bert/embeddings/LayerNorm/beta", r"bert.embeddings.LayerNorm.bias", False),
    (r"bert/encoder/layer_(\d+)/(.*)/kernel", r"bert.encoder.layer.\1.\2.weight", True),
    (r"bert/encoder/layer_(\d+)/(.*)/bias", r"bert.encoder.layer.\1.\2.bias", False),
    (r"bert/encoder/layer_(\d+)/(.*)/LayerNorm/gamma", r"bert.encoder.layer.\1.\2.LayerNorm.weight",
     False),
    (r"bert/encoder/layer_(\d+)/(.*)/LayerNorm/beta", r"bert.encoder.layer.\1.\2.LayerNorm.bias",
     False),
    (r"bert/pooler/dense/kernel", r"bert.pooler.dense.weight", True),
    (r"bert/pooler/dense/bias", r"bert.pooler.dense.bias", False),
    (r"cls/predictions/transform/dense/kernel", r"cls.predictions.transform.dense.weight", True),
    (r"cls/predictions/transform/dense/bias", r"cls.predictions.transform.dense.bias", False),
    (r"cls/predictions/transform/LayerNorm/gamma", r"cls.predictions.transform.LayerNorm.weight",
     False),
    (r"cls/predictions/transform/LayerNorm/beta", r"cls.predictions.transform.LayerNorm.bias",
     False),
    (r"cls/predictions/output_bias", r"cls.predictions.bias", False),
    # Google keeps the next-sentence weights as [2, hidden], already torch's layout.
    (r"cls/seq_relationship/output_weights", r"cls.seq_relationship.weight", False),
    (r"cls/seq_relationship/output_bias", r"cls.seq_relationship.bias", False),
]


class ExportError(ValueError):
  """Bad input; the message says how to fix it."""


def hf_name(name):
  """(transformers' name, transpose) of a weight of heads.pretraining_variable_shapes."""
  for pattern, replacement, transpose in _RENAMES:
    if re.fullmatch(pattern, name):
      return re.sub(pattern, lambda m: m.expand(replacement).replace("/", "."), name), transpose
  raise ValueError("%s has no transformers name" % name)


def hf_config(bert_config):
  """config.json of transformers' BertForPreTraining for a modeling.BertConfig."""
  if bert_config.hidden_act not in ACTIVATIONS:
    raise ExportError("hidden_act %r has no transformers equivalent; use one of %s"
                      % (bert_config.hidden_act, ", ".join(sorted(ACTIVATIONS))))
  return {
      "architectures": ["BertForPreTraining"], "model_type": "bert",
      "vocab_size": bert_config.vocab_size, "hidden_size": bert_config.hidden_size,
      "num_hidden_layers": bert_config.num_hidden_layers,
      "num_attention_heads": bert_config.num_attention_heads,
      "intermediate_size": bert_config.intermediate_size,
      "hidden_act": ACTIVATIONS[bert_config.hidden_act],
      "hidden_dropout_prob": bert_config.hidden_dropout_prob,
      "attention_probs_dropout_prob": bert_config.attention_probs_dropout_prob,
      "max_position_embeddings": bert_config.max_position_embeddings,
      "type_vocab_size": bert_config.type_vocab_size,
      "initializer_range": bert_config.initializer_range,
      "layer_norm_eps": 1e-12, "pad_token_id": 0, "tie_word_embeddings": True,
  }


def expected_names(bert_config):
  """The transformers names of every weight of BertForPreTraining with this config."""
  return [hf_name(name)[0] for name in sorted(heads.pretraining_variable_shapes(bert_config))]


def check_output_dir(output_dir, inputs):
  """Refuses an --output_dir that holds files or one of the inputs.

  Args:
    output_dir: --output_dir.
    inputs: list of (flag, path) of the files read.

  Raises:
    ExportError: one line naming the file in the way.
  """
  out = os.path.realpath(output_dir)
  for flag, path in inputs:
    real = os.path.realpath(path)
    if real == out or real.startswith(out + os.sep):
      raise ExportError("%s=%s is %s --output_dir=%s, which the export would write over; "
                        "pass a new --output_dir" % (flag, path, "inside" if real != out
                                                     else "the same path as", output_dir))
  if os.path.isdir(output_dir) and os.listdir(output_dir):
    held = sorted(os.listdir(output_dir))
    raise ExportError("--output_dir=%s already holds files (%s); the export writes a new "
                      "folder and overwrites nothing: pass a new or empty --output_dir"
                      % (output_dir, ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")))
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise ExportError("--output_dir=%s is a file; pass a new folder" % output_dir)


def checkpoint_tensors(prefix, bert_config):
  """The model weights of a checkpoint in transformers' names and layout.

  Returns:
    (dict name -> float32 numpy array, in the checkpoint's name order; the sorted names
    of the checkpoint's other variables, left out).
  """
  reader = tf.train.load_checkpoint(prefix)
  weights = heads.pretraining_variable_shapes(bert_config)
  tensors, left_out = {}, []
  for name in sorted(reader.get_variable_to_shape_map()):
    if name not in weights:
      if name.startswith(("bert/", "cls/")) and name.rsplit("/", 1)[0] not in weights:
        # Not a slot of a weight: a weight of another architecture, which would be lost.
        raise ExportError("variable %s of the checkpoint is no weight of BertForPreTraining "
                          "(another architecture's?); only BERT checkpoints with Google's "
                          "names can be exported" % name)
      left_out.append(name)
      continue
    mapped = hf_name(name)
    try:
      value = np.asarray(reader.get_tensor(name), dtype=np.float32)
    except (tf.errors.OpError, IndexError) as e:
      raise checkpoints.DamagedCheckpoint.or_error(prefix, e)
    tensors[mapped[0]] = np.ascontiguousarray(value.T if mapped[1] else value)
  return tensors, left_out


def left_out_text(names, bert_config):
  """What the export left out ("" for nothing): the slots of the weights (adam_m, Adam_1,
  ...) counted apart from the rest, which is named: a weight among them would be seen."""
  if not names:
    return ""
  weights = heads.pretraining_variable_shapes(bert_config)
  others = [name for name in names if name.rsplit("/", 1)[0] not in weights]
  parts = ["%d optimizer slots of its weights" % (len(names) - len(others))] \
      if len(others) < len(names) else []
  if others:
    parts.append("%d other variable%s (%s%s)" % (
        len(others), "s" if len(others) > 1 else "", ", ".join(others[:4]),
        ", ..." if len(others) > 4 else ""))
  return " and ".join(parts) + ", no weight of BertForPreTraining"


def write_safetensors(tensors, path):
  """Writes float32 arrays in the safetensors format (little-endian, names sorted)."""
  header, offset = {"__metadata__": {"format": "pt"}}, 0
  for name in sorted(tensors):
    size = tensors[name].size * 4
    header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                    "data_offsets": [offset, offset + size]}
    offset += size
  text = json.dumps(header, separators=(",", ":")).encode("utf-8")
  text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
  temporary = path + ".tmp"
  with open(temporary, "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for name in sorted(tensors):
      f.write(tensors[name].astype("<f4").tobytes())
  os.replace(temporary, path)


def export(checkpoint, bert_config_file, vocab_file, output_dir, do_lower_case=True):
  """Writes the transformers folder.

  Returns:
    (the number of tensors written, the checkpoint prefix read, what of it was left
    out: left_out_text).

  Raises:
    ExportError / ValueError: a missing or mismatched input (one-line messages).
  """
  if not output_dir:
    # "" is the current folder to realpath: check_output_dir would take it for one.
    raise ExportError("--output_dir is empty; pass --output_dir=<a new folder>, e.g. hf_bert")
  prefix = checkpoints.resolve_checkpoint(checkpoint, "--checkpoint")
  bert_config = modeling.BertConfig.from_json_file(bert_config_file)
  if os.path.isdir(vocab_file):
    raise ExportError("--vocab_file=%s is a folder; pass the vocab file (the vocab.txt the "
                      "model was trained with)" % vocab_file)
  if not os.path.isfile(vocab_file):
    raise ExportError("--vocab_file=%s does not exist; pass the vocab.txt the model was "
                      "trained with" % vocab_file)
  check_output_dir(output_dir, [("--checkpoint", p) for p in checkpoints.checkpoint_files(prefix)] +
                   [("--bert_config_file", bert_config_file), ("--vocab_file", vocab_file)])
  checkpoints.check_config(prefix, bert_config, "--bert_config_file=%s" % bert_config_file,
                           "--checkpoint")
  with open(vocab_file, encoding="utf-8") as f:
    vocab_size = sum(1 for _ in f)
  # A vocab_size above the vocab's tokens is padding (NVIDIA's 30528), as in training.
  if vocab_size > bert_config.vocab_size:
    raise ExportError("%s has %d tokens but vocab_size is %d in %s; pass the matching vocab "
                      "and config" % (vocab_file, vocab_size, bert_config.vocab_size,
                                      bert_config_file))
  # Padding adds fewer rows (NVIDIA's 30528 for 30522, a multiple of 8; Megatron's of 128
  # x its tensor-parallel ways, up to 1024): more is another vocab (a cased one's 28996).
  if bert_config.vocab_size - vocab_size >= _MOST_PADDING:
    print("export: warning: %s has %d tokens but vocab_size is %d in %s: %d rows past them, "
          "more than padding adds; check that it is the vocab the model was trained with"
          % (vocab_file, vocab_size, bert_config.vocab_size, bert_config_file,
             bert_config.vocab_size - vocab_size), file=sys.stderr)
  missing = tokenization.missing_special_tokens(tokenization.load_vocab(vocab_file))
  if missing:
    raise ExportError("--vocab_file=%s lacks %s, which the tokenizer needs; pass the BERT "
                      "vocab.txt the model was trained with" % (vocab_file, " ".join(missing)))
  mismatch = tokenization.casing_mismatch(vocab_file, do_lower_case, "--vocab_file")
  if mismatch:  # the tokenizer's config would say otherwise than the vocab
    print("export: warning: --do_lower_case=%s with %s: %s"
          % (str(do_lower_case).lower(), vocab_file, mismatch), file=sys.stderr)
  tensors, left_out = checkpoint_tensors(prefix, bert_config)
  missing = [name for name in expected_names(bert_config) if name not in tensors]
  if missing:
    raise ExportError("--checkpoint=%s lacks %s of the %d weights transformers' "
                      "BertForPreTraining needs (%s%s), which it would fill at random; export a "
                      "pretraining checkpoint" % (prefix, len(missing),
                                                  len(expected_names(bert_config)),
                                                  ", ".join(missing[:3]),
                                                  ", ..." if len(missing) > 3 else ""))
  parent = os.path.dirname(os.path.abspath(output_dir))
  os.makedirs(parent, exist_ok=True)
  temporary = os.path.join(parent, ".%s.tmp-%d" % (os.path.basename(os.path.abspath(
      output_dir)), os.getpid()))
  shutil.rmtree(temporary, ignore_errors=True)  # A killed export's, of this pid.
  os.mkdir(temporary)
  try:
    write_folder(temporary, tensors, bert_config, vocab_file, do_lower_case)
    # rename(2) replaces an empty folder, never one with files (check_output_dir).
    os.rename(temporary, output_dir)
  except BaseException:
    shutil.rmtree(temporary, ignore_errors=True)
    raise
  return len(tensors), prefix, left_out_text(left_out, bert_config)


def write_folder(folder, tensors, bert_config, vocab_file, do_lower_case):
  """Writes the transformers files into folder (an empty one)."""
  write_safetensors(tensors, os.path.join(folder, "model.safetensors"))
  shutil.copyfile(vocab_file, os.path.join(folder, "vocab.txt"))
  settings = {
      "config.json": hf_config(bert_config),
      "tokenizer_config.json": {"tokenizer_class": "BertTokenizer",
                                "do_lower_case": do_lower_case,
                                "model_max_length": bert_config.max_position_embeddings},
      "special_tokens_map.json": {"unk_token": "[UNK]", "sep_token": "[SEP]",
                                  "pad_token": "[PAD]", "cls_token": "[CLS]",
                                  "mask_token": "[MASK]"},
  }
  for name, value in settings.items():
    with open(os.path.join(folder, name), "w") as f:
      json.dump(value, f, indent=2)
      f.write("\n")


def main(argv):
  if len(argv) > 1:
    errors.unexpected_arguments("export", argv[1:])
  errors.require_flags("export", FLAGS, (
      ("checkpoint", "the checkpoint to export (a prefix, or a run's folder)"),
      ("bert_config_file", "the model's bert_config.json"),
      ("vocab_file", "the model's vocab.txt"), ("output_dir", "a folder to write")))
  try:
    count, prefix, left_out = export(FLAGS.checkpoint, FLAGS.bert_config_file,
                                     FLAGS.vocab_file, FLAGS.output_dir, FLAGS.do_lower_case)
  except ValueError as e:
    errors.print_error("export", e)
    return 2
  except (EnvironmentError, tf.errors.OpError) as e:
    if not errors.is_file_error(e):
      raise
    errors.print_error("export", errors.os_error_message(e))
    return 2
  if left_out:
    print("export: left out %s" % left_out)
  print("export: %d tensors from %s -> %s (transformers: BertForPreTraining.from_pretrained("
        "%r))" % (count, prefix, FLAGS.output_dir, FLAGS.output_dir))
  return 0


if __name__ == "__main__":
  flags.DEFINE_string("checkpoint", None, "Checkpoint prefix (or a folder: its newest).")
  flags.DEFINE_string("bert_config_file", None, "bert_config.json of the model.")
  flags.DEFINE_string("vocab_file", None, "vocab.txt of the model.")
  flags.DEFINE_string("output_dir", None, "Folder to write (made if missing).")
  flags.DEFINE_bool("do_lower_case", True, "Whether the tokenizer lower-cases (uncased).")
  errors.run_main("export", main)
