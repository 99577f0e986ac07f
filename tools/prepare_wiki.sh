#!/usr/bin/env bash
# Prepares the MLPerf BERT dataset from a Wikipedia dump (see docs/data.md):
#   bash tools/prepare_wiki.sh --dump=enwiki-20200101-pages-articles-multistream.xml.bz2 \
#       --vocab=vocab.txt --output_dir=/data/bert_wiki [--num_shards=500] [--jobs=N]
# Everything is done by the package bert_pretrain/wiki; this only picks the interpreter.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec "${PYTHON:-python3}" -m bert_pretrain.wiki "$@"
