#!/usr/bin/env bash
# e2e: a mixture-of-experts model through the one executor (models/lm_tp.h; the ep plan unit,
# sharding/plans/expert_parallel.h; docs/MOE.md). `train --validate` (5 fp32 steps: losses with the aux loss) and
# `run` (the forward) equal one device for ep, ep x tp, ep x etp, ep x dp with ZeRO 1, ep x pp, dropless and with
# a capacity factor, at one chip per rank and at 8 chips on one rank; the plan line names ep; bad plans exit 2.
# Usage: moe.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

MOE=$CONFIGS/moe/tiny_moe.yaml
CAP="--set model.moe.capacity_factor=1.0"

e2e_case "(a) train, ep alone and composed, one chip per rank: validated against one device"
if expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=4 --validate; then
  assert_out 'expert parallel ep=4 \(2 experts per chip' "the plan line names ep"
fi
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,tp=2 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,tp=2,etp=2 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,dp=2 --set parallel.zero=1 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,pp=2 --set model.micro_batch=2 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=4 $CAP --validate

e2e_case "(b) 8 chips on one rank: ep 8, ep 4 x etp 2 with capacity, ep 2 x dp 2 x pp 2"
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train "$MOE" --plan ep=8 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train "$MOE" --plan ep=4,tp=2,etp=2 $CAP --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train "$MOE" --plan ep=2,dp=2,pp=2 \
  --set model.micro_batch=1 --set parallel.zero=1 --validate

e2e_case "(c) run: the forward mode through the same executor, validated"
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 run "$MOE" --plan ep=4
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 run "$MOE" --plan ep=2,tp=2,pp=2,etp=2 $CAP

e2e_case "(d) bad plans exit 2 naming the key"
expect_exit 2 'parallel.ep: 8 experts do not split over ep = 3' -- shardsim_mpi 1 --chips 3 train "$MOE" --plan ep=3
expect_exit 2 'parallel.etp' -- shardsim_mpi 1 --chips 4 train "$MOE" --plan ep=1,tp=4,etp=2
expect_exit 2 'parallel.ep: needs model.moe' -- shardsim_mpi 1 --chips 2 train "$CONFIGS/lm_train.yaml" --plan ep=2

e2e_finish
