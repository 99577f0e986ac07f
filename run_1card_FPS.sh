#!/usr/bin/env bash
# BERT pretraining on one card with the MLPerf settings (seq 512, 76 predictions, LAMB: the
# defaults of bert_pretrain/run_pretraining.py's flags) and mixed precision (--amp).
# Flags given here are passed on and win, e.g.
#   bash run_1card_FPS.sh --input_files_dir=... --init_checkpoint=... --eval_files_dir=... \
#       --train_batch_size=6 --bert_config_file=...
#   bash run_1card_FPS.sh ... --noamp          # float32 instead of mixed precision
# Without --input_files_dir it runs the embedded demo: a tiny BERT on the shipped corpus,
# then fine-tuned to tell its books apart (bert_pretrain/demo.py).
# Results and checkpoints are never deleted.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/scripts/common.sh"

# Mixed precision, as the anchor's scripts run (--amp): float16 with loss scaling on GPUs,
# bfloat16 on CPUs where it is faster than float32 (float32 on others). --noamp: off.
# --eval_at_start checks the initial checkpoint (MLPerf's scores about 0.34085).
args=(--amp --eval_at_start)
if has_flag input_files_dir "$@"; then
  drop_given args "$@"  # the user's flags win
  exec python3 -m bert_pretrain.run_pretraining "${args[@]}" "$@"
fi
demo_args "$@"
drop_given args "${DEMO_ARGS[@]}"
args+=("${DEMO_ARGS[@]}")  # the demo's settings (bert_pretrain/demo.py RUN_FLAGS)
drop_given args "$@"
run_forwarding_signals python3 -m bert_pretrain.run_pretraining "${args[@]}" "$@"
# The demo's downstream step: fine-tune the checkpoint just trained, and random weights.
exec python3 -m bert_pretrain.demo --cache_dir="$DEMO_CACHE" \
  --finetune_from="$(flag_value output_dir "${args[@]}" "$@")" \
  --finetune_bert_config_file="$(flag_value bert_config_file "${args[@]}" "$@")" \
  --finetune_vocab_file="$(flag_value vocab_file "${args[@]}" "$@")"
