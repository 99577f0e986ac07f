#!/usr/bin/env bash
# BERT pretraining on several cards: one Horovod rank per card, MLPerf defaults.
#   export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
#   export IX_NUM_CUDA_VISIBLE_DEVICES=8
#   bash run_multi_card_FPS.sh --input_files_dir=... --init_checkpoint=... --eval_files_dir=... \
#       --train_batch_size=6 --bert_config_file=...
# HOROVOD_RUN_ARGS (default --gloo) goes to horovodrun: --mpi, or hosts for several
# machines, e.g. HOROVOD_RUN_ARGS="--gloo -H host1:8,host2:8" or "--gloo --hostfile hosts".
# Without --input_files_dir it runs the embedded demo.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/scripts/common.sh"

num_ranks="$(count_ranks)"
read -r -a run_args <<< "${HOROVOD_RUN_ARGS:---gloo}"
case " ${run_args[*]} " in
  *" -H"*|*" --host"*|*" -hostfile"*) ;;  # -H, --hosts[=], --hostfile[=] given
  # One host: this machine with a slot per rank (also more ranks than cores, for tests).
  *) run_args+=(-H "localhost:$num_ranks") ;;
esac
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

args=("${MLPERF_DEFAULTS[@]}" --horovod --num_accumulation_steps=4 --num_train_steps=1000)
if ! has_flag input_files_dir "$@"; then
  demo_args
  args+=("${DEMO_ARGS[@]}")
fi
echo "Launching $num_ranks ranks: horovodrun -np $num_ranks ${run_args[*]}"
exec horovodrun -np "$num_ranks" "${run_args[@]}" \
  python3 -m bert_pretrain.run_pretraining "${args[@]}" "$@"
