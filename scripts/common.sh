# Shared by run_1card_FPS.sh and run_multi_card_FPS.sh: environment, defaults, the demo.
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

# The MLPerf BERT settings of the anchor recipe (stop at masked-LM accuracy 0.72).
MLPERF_DEFAULTS=(
  --output_dir=./results --max_seq_length=512 --max_predictions_per_seq=76
  --optimizer=lamb --learning_rate=5e-5 --num_train_steps=13206
  --save_checkpoints_steps=1000 --stop_threshold=0.72
  --samples_between_eval=150000 --samples_start_eval=3000000
  --eval_batch_size=24 --max_eval_steps=0
)

# has_flag NAME ARGS...: whether --NAME=... is among ARGS.
has_flag() {
  local name="$1" arg
  shift
  for arg in "$@"; do
    case "$arg" in --"$name"=*|--"$name") return 0 ;; esac
  done
  return 1
}

# demo_args: prepares the embedded demo (cached in $DEMO_CACHE) and sets DEMO_ARGS to
# the demo run's flags, which bert_pretrain/demo.py defines.
demo_args() {
  local cache="${DEMO_CACHE:-$here/demo_cache}" flags
  echo "No --input_files_dir: running the embedded demo (artefacts in $cache)"
  flags="$(python3 -m bert_pretrain.demo --cache_dir="$cache")"
  mapfile -t DEMO_ARGS <<< "$flags"
}

# count_ranks: ranks per host: IX_NUM_CUDA_VISIBLE_DEVICES, else the entries of
# CUDA_VISIBLE_DEVICES, else the GPUs nvidia-smi lists, else 2 CPU ranks.
count_ranks() {
  local from_list=""
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
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
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
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
