"""Shared fixtures: a tiny BERT config and real pretraining TFRecords made from
tests/data/sample_text.txt with the recipe's own vocab builder and create_pretraining_data."""

import json
import os
import subprocess
import sys

import pytest
import tensorflow.compat.v1 as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_TEXT = os.path.join(ROOT, "tests", "data", "sample_text.txt")
SEQ_LENGTH = 64
PREDICTIONS = 10

TINY_CONFIG = {
    "vocab_size": 600,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 128,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
}

tf.disable_v2_behavior()


@pytest.fixture(scope="session")
def pretraining_data(tmp_path_factory):
  """Folders train/ (2 files) and eval/ (1 file) of real records, vocab and config."""
  from bert_pretrain import create_pretraining_data, tokenization
  root = tmp_path_factory.mktemp("pretraining_data")
  vocab = str(root / "vocab.txt")
  tokenization.build_wordpiece_vocab([SAMPLE_TEXT], TINY_CONFIG["vocab_size"], vocab)
  for name, files, seed in (("train", 2, 1), ("eval", 1, 2)):
    (root / name).mkdir()
    create_pretraining_data.create_pretraining_data(
        [SAMPLE_TEXT], [str(root / name / ("part-%d" % i)) for i in range(files)], vocab,
        max_seq_length=SEQ_LENGTH, max_predictions_per_seq=PREDICTIONS, dupe_factor=2,
        random_seed=seed)
  config = root / "bert_config.json"
  config.write_text(json.dumps(TINY_CONFIG))
  return {"root": root, "train": str(root / "train"), "eval": str(root / "eval"),
          "vocab": vocab, "config": str(config)}


def run_pretraining(*flags, timeout=300):
  """Runs python3 -m bert_pretrain.run_pretraining; returns the CompletedProcess."""
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.run([sys.executable, "-m", "bert_pretrain.run_pretraining"] + list(flags),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        universal_newlines=True, env=env, timeout=timeout)


def base_flags(data, output_dir, **overrides):
  """Flags of a short run on the fixture data; keyword arguments override them (a value
  of None makes a bare flag, e.g. nodo_eval=None -> --nodo_eval)."""
  values = dict(input_files_dir=data["train"], eval_files_dir=data["eval"],
                bert_config_file=data["config"], output_dir=str(output_dir),
                max_seq_length=SEQ_LENGTH, max_predictions_per_seq=PREDICTIONS,
                train_batch_size=8, eval_batch_size=16, num_train_steps=4,
                learning_rate=1e-3, display_loss_steps=2, save_checkpoints_steps=100,
                samples_start_eval=10 ** 9, intra_op_threads=1)
  values.update(overrides)
  return ["--%s" % k if v is None else "--%s=%s" % (k, v) for k, v in values.items()]
