# Shared by run_1card_FPS.sh and run_multi_card_FPS.sh: the environment, the cards per host.
# The flags, the presets and the demo are Python's (bert_pretrain/config.py).
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

# gpus_listed: whether nvidia-smi lists a GPU on this host.
gpus_listed() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
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
  twice="$(printf '%s\n' "${entries[@]}" | sort | uniq -d | head -n 1)"
  if [ -n "$twice" ]; then
    echo "$error lists card $twice twice; each rank needs a card of its own" >&2
    exit 2
  fi
}

# count_ranks: ranks per host: IX_NUM_CUDA_VISIBLE_DEVICES, else the entries of
# CUDA_VISIBLE_DEVICES, else the GPUs nvidia-smi lists, else 2 CPU ranks.
count_ranks() {
  local from_list=""
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
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
  elif gpus_listed; then
    echo "IX_NUM_CUDA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES are unset: one rank per GPU that nvidia-smi lists on this host" >&2
    nvidia-smi -L | grep -c '^GPU'
  else
    echo "IX_NUM_CUDA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES are unset and no GPU is listed: 2 CPU ranks per host (export IX_NUM_CUDA_VISIBLE_DEVICES=N to choose)" >&2
    echo 2
  fi
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
