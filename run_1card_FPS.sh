#!/usr/bin/env bash
# BERT pretraining on one card with the MLPerf defaults (seq 512, 76 predictions, LAMB).
# Flags given here are passed on and win over the defaults, e.g.
#   bash run_1card_FPS.sh --input_files_dir=... --init_checkpoint=... --eval_files_dir=... \
#       --train_batch_size=6 --bert_config_file=...
# Without --input_files_dir it runs the embedded demo: a tiny BERT on the shipped corpus.
# Results and checkpoints are never deleted.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/scripts/common.sh"

args=("${MLPERF_DEFAULTS[@]}")
if ! has_flag input_files_dir "$@"; then
  demo_args
  args+=("${DEMO_ARGS[@]}")
fi
exec python3 -m bert_pretrain.run_pretraining "${args[@]}" "$@"
