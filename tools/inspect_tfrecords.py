"""Inspects BERT pretraining TFRecords: counts, feature spec, corruption, masking.

  python3 tools/inspect_tfrecords.py --input=/data/bert_wiki/train_data --vocab=vocab.txt

The code and its flags are in bert_pretrain/inspect_records.py (python3 -m
bert_pretrain.inspect_records does the same); this runs it from this checkout, whether
init_tf.sh installed the package or not.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
os.execv(sys.executable, [sys.executable, "-m", "bert_pretrain.inspect_records"] + sys.argv[1:])
