#!/usr/bin/env bash
# BERT pretraining on one card with the MLPerf settings (seq 512, 76 predictions, LAMB: the
# flag defaults, bert_pretrain/config.py) and the preset one_card: mixed precision (--amp)
# and an evaluation at the start. Flags given here win, e.g.
#   bash run_1card_FPS.sh --input_files_dir=... --init_checkpoint=... --eval_files_dir=... \
#       --train_batch_size=6 --bert_config_file=...
#   bash run_1card_FPS.sh ... --noamp          # float32 instead of mixed precision
# Without --input_files_dir it runs the embedded demo: a tiny BERT on the shipped corpus,
# then fine-tuned to tell sentences from their words shuffled (bert_pretrain/demo.py).
# DRY_RUN=1 prints the command and checks the flags, the files and --output_dir only.
# Results and checkpoints are never deleted.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/scripts/common.sh"
dry_run="$(dry_run_setting run_1card_FPS)"
command=(python3 -m bert_pretrain.run_pretraining --preset=one_card "$@")
if [ "$dry_run" = 1 ]; then
  echo "run_1card_FPS: $(shell_words "${command[@]}")"
  "${command[@]}" --check_only
  echo "DRY_RUN=1: the flags and run_pretraining --check_only pass; nothing was started"
  exit 0
fi
exec "${command[@]}"
