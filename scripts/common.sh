# Shared by run_1card_FPS.sh and run_multi_card_FPS.sh: environment, flags, the demo.
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

# The defaults are the flag definitions' (bert_pretrain/run_pretraining.py: the MLPerf
# settings). A script passes only what differs from them, and where the user (or the
# demo) sets a flag too, theirs alone reaches the command line: each flag shows once.

# has_flag NAME ARGS...: whether --NAME=... is among ARGS.
has_flag() {
  local name="$1" arg
  shift
  for arg in "$@"; do
    case "$arg" in --"$name"=*|--"$name") return 0 ;; esac
  done
  return 1
}

# flag_names ARG: sets FLAG_NAMES to the flags ARG sets: "--lr=1" -> lr, "--amp" -> amp,
# a bare "--noamp" -> noamp and amp; none for a value. --use_fp16 and --manual_fp16 count
# as --amp (the anchors' names of mixed precision).
flag_names() {
  local name
  FLAG_NAMES=()
  case "$1" in -*) ;; *) return 0 ;; esac
  name="${1#-}"
  name="${name#-}"
  name="${name%%=*}"
  FLAG_NAMES=("$name")
  if [[ "$1" != *=* && "$name" == no* ]]; then
    name="${name#no}"
    FLAG_NAMES+=("$name")
  fi
  case "$name" in use_fp16|manual_fp16) FLAG_NAMES+=(amp) ;; esac
}

# drop_given ARRAY ARGS...: removes from the array named ARRAY each flag that ARGS set.
drop_given() {
  local -n drop_from="$1"
  shift
  local -A given=()
  local arg name kept=() keep
  for arg in "$@"; do
    flag_names "$arg"
    for name in "${FLAG_NAMES[@]}"; do given[$name]=1; done
  done
  for arg in "${drop_from[@]}"; do
    flag_names "$arg"
    keep=1
    for name in "${FLAG_NAMES[@]}"; do
      if [ -n "${given[$name]:-}" ]; then keep=""; fi
    done
    if [ -n "$keep" ]; then kept+=("$arg"); fi
  done
  drop_from=("${kept[@]}")
}

# demo_args ARGS...: prepares the embedded demo (cached in $DEMO_CACHE) and sets DEMO_ARGS
# to the demo run's flags, which bert_pretrain/demo.py defines (its output_dir: that of
# ARGS, else a new results/demo-<time>). DEMO_PACKED=1: the demo trains on its records
# packed (demo.py --packed).
demo_args() {
  local flags output_dir=() given packed=()
  DEMO_CACHE="${DEMO_CACHE:-$here/demo_cache}"
  echo "No --input_files_dir: running the embedded demo (artefacts in $DEMO_CACHE)"
  given="$(flag_value output_dir "$@")"
  if [ -n "$given" ]; then output_dir=(--run_output_dir="$given"); fi
  if [ "${DEMO_PACKED:-0}" = 1 ]; then packed=(--packed); fi
  flags="$(python3 -m bert_pretrain.demo --cache_dir="$DEMO_CACHE" "${output_dir[@]}" \
    "${packed[@]}")"
  mapfile -t DEMO_ARGS <<< "$flags"
}

# flag_value NAME ARGS...: the value of the last --NAME=VALUE or --NAME VALUE among ARGS
# (the one that wins).
flag_value() {
  local name="$1" value=""
  shift
  while [ "$#" -gt 0 ]; do
    case "$1" in
      --"$name"=*|-"$name"=*) value="${1#*=}" ;;
      --"$name"|-"$name") if [ "$#" -gt 1 ]; then value="$2"; shift; fi ;;
    esac
    shift
  done
  echo "$value"
}

# run_forwarding_signals COMMAND...: runs COMMAND and returns its status, passing SIGTERM
# and SIGINT on to it: a command that is not exec'd would not get a signal sent to the
# script, and could not checkpoint and stop.
run_forwarding_signals() {
  local child status=0
  "$@" &
  child=$!
  trap 'kill -TERM "$child" 2>/dev/null' TERM
  trap 'kill -INT "$child" 2>/dev/null' INT
  wait "$child" || status=$?
  while kill -0 "$child" 2>/dev/null; do  # a signal ended the wait, not the command
    status=0
    wait "$child" || status=$?
  done
  trap - TERM INT
  return "$status"
}

# gpus_listed: whether nvidia-smi lists a GPU on this host.
gpus_listed() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
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
