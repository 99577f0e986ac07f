#!/usr/bin/env bash
# BERT pretraining on several cards: one Horovod rank per card, the MLPerf settings (the
# flag defaults, bert_pretrain/config.py), mixed precision (--amp; --noamp: off).
#   export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
#   export IX_NUM_CUDA_VISIBLE_DEVICES=8
#   bash run_multi_card_FPS.sh --input_files_dir=... --init_checkpoint=... --eval_files_dir=... \
#       --train_batch_size=6 --bert_config_file=...
# IX_NUM_CUDA_VISIBLE_DEVICES is the number of cards per host. HOROVOD_RUN_ARGS (default
# --gloo) goes to horovodrun: --mpi, or hosts for several machines, e.g.
# HOROVOD_RUN_ARGS="--gloo -H host1:8,host2:8" or "--gloo --hostfile hosts"; the script
# computes -np (bert_pretrain/distributed/launch.py). DRY_RUN=1 prints the plan and the
# command and checks the flags (and, for a job on this host alone, the files) only.
# DISTRIBUTION chooses TensorFlow's own engines instead of Horovod: mirrored (one process
# drives the cards of this host) or multi_worker_mirrored (one process per host; on
# several hosts of HOROVOD_RUN_ARGS horovodrun starts them and TF_CONFIG names them, at
# port MULTI_WORKER_PORT, default 12345). Without --input_files_dir it runs the embedded demo.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/scripts/common.sh"
for word in "$@"; do  # the help is run_pretraining's, printed here rather than by each rank
  case "$word" in  # absl's help flags, bare or =true/t/1 (=false asks for no help)
    --help | --helpshort | --helpfull | --helpxml | -help | -helpshort | -helpfull | -helpxml | "-?" | \
    --help*=[Tt] | --help*=[Tt][Rr][Uu][Ee] | --help*=1 | -help*=[Tt] | -help*=[Tt][Rr][Uu][Ee] | -help*=1)
      exec python3 -m bert_pretrain.run_pretraining --preset=multi_card "$word" ;;
  esac
done
dry_run="$(dry_run_setting run_multi_card_FPS)"

per_host="$(count_ranks)"
distribution="${DISTRIBUTION:-horovod}"
plan="$(python3 -m bert_pretrain.distributed.launch "$per_host" "$distribution")"  # exits 2 on a contradiction
mapfile -t launcher <<< "$plan"
engine=()  # the preset's Horovod: one rank per card
cards=()
if [ "$distribution" != horovod ]; then
  engine=(--distribution="$distribution")
  # On a CPU: as many replicas as Horovod would start ranks.
  if [ "$distribution" = mirrored ]; then engine+=(--cpu_devices="$per_host"); fi
  # A process drives every card it sees: on a GPU host, show it the count per host, no
  # more (on a CPU host a card list would make run_pretraining look for GPUs).
  if [ -z "${CUDA_VISIBLE_DEVICES+set}" ] && [ -n "${IX_NUM_CUDA_VISIBLE_DEVICES:-}" ] &&
      [ "$(listed_cards)" != "0 None" ]; then
    cards=(env CUDA_VISIBLE_DEVICES="$(seq -s, 0 "$((per_host - 1))")")
  fi
fi
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# The preset multi_card (bert_pretrain/config.py): mixed precision, an evaluation at the
# start, 4 micro-batches an update, 1000 updates, Horovod; without --input_files_dir, the
# demo. Flags given win.
command=("${cards[@]}" "${launcher[@]:1}" python3 -m bert_pretrain.run_pretraining
  --preset=multi_card "${engine[@]}" "$@")
echo "${launcher[0]}: $(shell_words "${command[@]}")"
if [ "$dry_run" = 1 ]; then
  exec python3 -m bert_pretrain.distributed.launch check "${command[@]}"
fi
# launch.py runs horovodrun so that a failed job ends with the rank's error, not
# horovodrun's traceback; other commands it execs.
exec python3 -m bert_pretrain.distributed.launch run "${command[@]}"
