#!/usr/bin/env bash
# Checkpoint save and resume of the default job (Llama-2-7B MLP, tp 8, 532 MiB of weights) at one chip per rank
# (mpirun -np 8) and at 8 chips on one rank (mpirun -np 1 --chips 8), back to back, REPS times; each resume reads
# the file the other mode wrote. Prints run's own wall figures (JSON wall.checkpoint_s, wall.init_s: the resume's
# read + checksum verification), whether the resumed output is bit-identical, the host load, and whether the two
# files are byte-identical. Figures go to docs/performance/host.md ("Checkpoints with several chips per rank").
# Usage: bench/ckpt_chips.sh [SHARDSIM] [REPS] [DIR]   (run from anywhere; files land in DIR, default a temp dir)
set -u
S=$(realpath "${1:-build/apps/shardsim}")
REPS=${2:-2}
DIR=${3:-$(mktemp -d "${TMPDIR:-/tmp}/ckpt_chips.XXXXXX")}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMPI_MCA_mpi_yield_when_idle=1
cd "$DIR" || exit 2
echo "host: $(nproc) cores; dir $DIR; shardsim $S"
rm -f d_k1.h5 d_k8.h5
for rep in $(seq 1 "$REPS"); do
  for mode in k1 k8; do
    if [ $mode = k1 ]; then L="mpirun -q --oversubscribe -np 8 $S"; else L="mpirun -q --oversubscribe -np 1 $S --chips 8"; fi
    $L run --checkpoint d_$mode.h5 --json save_${mode}_$rep.json > save_${mode}_$rep.out 2>&1
    other=d_k1.h5; [ $mode = k1 ] && other=d_k8.h5; [ -f $other ] || other=d_$mode.h5
    $L run --resume $other --no-checkpoint --json load_${mode}_$rep.json > load_${mode}_$rep.out 2>&1
    echo "$rep $mode save_ckpt_s=$(python3 -c "import json;print(round(json.load(open('save_${mode}_$rep.json'))['wall']['checkpoint_s'],2))") resume_init_s=$(python3 -c "import json;print(round(json.load(open('load_${mode}_$rep.json'))['wall']['init_s'],2))") resumed_from=$other $(grep -o 'bit-identical to the stored output' load_${mode}_$rep.out) $(grep -o 'forward time  *[0-9.]* us' load_${mode}_$rep.out | head -1) $(uptime | sed 's/.*load/load/')"
  done
done
cmp d_k1.h5 d_k8.h5 && echo "d_k1.h5 and d_k8.h5 byte-identical ($(stat -c %s d_k1.h5) bytes)"
