# Shared by run_1card_FPS.sh and run_multi_card_FPS.sh: the environment, the cards per host.
# The flags, the presets and the demo are Python's (bert_pretrain/config.py).
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

# listed_cards: "COUNT LISTER", the cards nvidia-smi -L, else Iluvatar's ixsmi -L, lists
# on this host ("0 None": none).
listed_cards() {
  python3 -m bert_pretrain.distributed.launch cards
}

# check_card_list: exits 2 unless CUDA_VISIBLE_DEVICES lists cards (indexes or GPU-/MIG-
# UUIDs), each once: CUDA hides the cards after a bad entry, so -1 hides them all.
check_card_list() {
  local error="run_multi_card_FPS: error: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
  local entry twice
  local -a entries
  IFS=, read -r -a entries <<< "$CUDA_VISIBLE_DEVICES"
  if [ -z "${CUDA_VISIBLE_DEVICES//,/}" ]; then
    echo "$error lists no card; export the cards to use, e.g. CUDA_VISIBLE_DEVICES=0,1, or unset it for CPU ranks" >&2
    exit 2
  fi
  for entry in "${entries[@]}"; do
    if [ "$entry" = -1 ]; then
      echo "$error: -1 hides the cards from there on; export only the cards to use, or unset it for CPU ranks (IX_NUM_CUDA_VISIBLE_DEVICES=N chooses how many)" >&2
      exit 2
    fi
    if ! [[ "$entry" =~ ^([0-9]+|(GPU|MIG)-[A-Za-z0-9/-]+)$ ]]; then
      echo "$error: '$entry' is not a card (its index or its GPU-/MIG- UUID); export the cards to use, e.g. CUDA_VISIBLE_DEVICES=0,1" >&2
      exit 2
    fi
  done
  twice="$(printf '%s\n' "${entries[@]}" | sort | uniq -d)"
  twice="${twice%%$'\n'*}"  # not `| head -n 1`, whose early exit can fail the pipe
  if [ -n "$twice" ]; then
    echo "$error lists card $twice twice; each rank needs a card of its own" >&2
    exit 2
  fi
}

# count_ranks: ranks per host: IX_NUM_CUDA_VISIBLE_DEVICES, else the entries of
# CUDA_VISIBLE_DEVICES, else the cards listed, else 2 CPU ranks. An empty (or -1)
# CUDA_VISIBLE_DEVICES hides every card, as CUDA reads it: CPU ranks.
count_ranks() {
  local from_list="" count lister
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ "$CUDA_VISIBLE_DEVICES" != -1 ]; then
    check_card_list
    from_list="$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)"
  fi
  if [ -n "${IX_NUM_CUDA_VISIBLE_DEVICES:-}" ]; then
    if ! [[ "$IX_NUM_CUDA_VISIBLE_DEVICES" =~ ^[1-9][0-9]*$ ]]; then
      echo "run_multi_card_FPS: error: IX_NUM_CUDA_VISIBLE_DEVICES=$IX_NUM_CUDA_VISIBLE_DEVICES is not a positive number; export the number of cards, e.g. IX_NUM_CUDA_VISIBLE_DEVICES=8" >&2
      exit 2
    fi
    if [ -n "$from_list" ] && [ "$from_list" != "$IX_NUM_CUDA_VISIBLE_DEVICES" ]; then
      echo "run_multi_card_FPS: error: IX_NUM_CUDA_VISIBLE_DEVICES=$IX_NUM_CUDA_VISIBLE_DEVICES but CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES lists $from_list cards; make them agree or unset one" >&2
      exit 2
    fi
    echo "$IX_NUM_CUDA_VISIBLE_DEVICES"
  elif [ -n "$from_list" ]; then
    echo "$from_list"
  elif [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    echo "CUDA_VISIBLE_DEVICES is empty (or -1), which hides every card: 2 CPU ranks per host (export IX_NUM_CUDA_VISIBLE_DEVICES=N to choose, or the cards to use)" >&2
    echo 2
  elif read -r count lister <<< "$(listed_cards)" && [ "${count:-0}" -gt 0 ]; then
    echo "IX_NUM_CUDA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES are unset: one rank per card that $lister -L lists on this host" >&2
    echo "$count"
  else
    echo "IX_NUM_CUDA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES are unset and no GPU is listed: 2 CPU ranks per host (export IX_NUM_CUDA_VISIBLE_DEVICES=N to choose)" >&2
    echo 2
  fi
}

# dry_run_setting SCRIPT: DRY_RUN, 0 (run; also when unset) or 1 (check and print only);
# exits 2 on anything else.
dry_run_setting() {
  local value="${DRY_RUN:-0}"
  if [ "$value" != 0 ] && [ "$value" != 1 ]; then
    echo "$1: error: DRY_RUN=$value; set DRY_RUN=1 to check and print the plan only, or DRY_RUN=0 (or nothing) to run" >&2
    exit 2
  fi
  echo "$value"
}

# shell_words WORDS...: the words as one line to paste into a shell (quoted where needed).
shell_words() {
  local word line=""
  for word in "$@"; do
    [[ "$word" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]] || word="$(printf '%q' "$word")"
    line+="${line:+ }$word"
  done
  echo "$line"
}
