#!/usr/bin/env bash
# PULSELoCo against DiLoCo and DDP on the reference RL workload
# (examples/rl, 1.0M-parameter policy, GRPO on "reverse 6 digits"), through
# build/examples/loco_train under mpirun.  Every mode runs the same seeds
# and the same number of local steps (ROUNDS x H per rank); bytes are what
# each rank sends (loco_train's "bytes"), summed over ranks.
#
#   bash bench/loco.sh            phases curves, llm, sweep (about 75 minutes
#                                 on a busy 2-core machine)
#   bash bench/loco.sh sweep      one phase: curves | llm | sweep | llmlong | ranks4
#   PHASES="curves llm" RANKS=2 H=8 bash bench/loco.sh
#
# Phases:
#   curves  the workload's default inner lr (2e-4), 30 rounds, seeds 1 2 3,
#           all three modes: reward curves and bytes
#   llm     inner lr 2e-6, where a round moves most weights by less than a
#           BF16 cell as an LLM fine-tune does, 40 rounds, seeds 1 2, all
#           modes
#   sweep   gated share and bytes against the inner lr, 6 rounds, seed 1,
#           PULSELoCo only (DiLoCo and DDP always send 4 bytes per weight
#           per round / per step)
#   llmlong (opt-in) inner lr 2e-6 for 100 rounds, seed 3, all modes: the
#           reward curves of the llm phase over a longer horizon
#   ranks4  (opt-in) 4 ranks, 10 rounds, seed 1, PULSELoCo and DiLoCo at
#           lr 2e-4 and 2e-6
# Raw output: bench/results/loco/PHASE/MODE-lrLR-sSEED.jsonl (one JSON object
# per round, from rank 0); runs already complete there are not redone.
# Report: bench/results/loco/report.md (bench/loco_report.py).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RANKS=${RANKS:-2}
H=${H:-8}
OUT=${OUT:-bench/results/loco}
PHASES=${PHASES:-${1:-curves llm sweep}}
PROG=$BUILD/examples/loco_train
if [ ! -x "$PROG" ]; then
    echo "bench/loco.sh: $PROG is not built (make; needs mpicc)" >&2
    exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

run() { # phase mode lr seed rounds [ranks]
    local dir=$OUT/$1 f np=${6:-$RANKS}
    f=$dir/$2-lr$3-s$4.jsonl
    mkdir -p "$dir"
    if [ -s "$f" ] && grep -q '"event":"summary"' "$f"; then return 0; fi
    echo "== $1: mpirun -np $np $PROG --mode $2 --h $H --rounds $5 --lr $3 --seed $4 --json" >&2
    mpirun -np "$np" --oversubscribe "$PROG" --mode "$2" --h "$H" --rounds "$5" --lr "$3" \
        --seed "$4" --json >"$f.tmp"
    mv "$f.tmp" "$f"
    grep '"event":"summary"' "$f" >&2
}

for phase in $PHASES; do
    case $phase in
    curves) for s in 1 2 3; do for m in pulseloco diloco ddp; do run curves $m 2e-4 $s 30; done; done ;;
    llm) for s in 1 2; do for m in pulseloco diloco ddp; do run llm $m 2e-6 $s 40; done; done ;;
    sweep) for lr in 2e-4 5e-5 2e-5 1e-5 5e-6 2e-6 1e-6; do run sweep pulseloco $lr 1 6; done ;;
    llmlong) for m in pulseloco diloco ddp; do run llmlong $m 2e-6 3 100; done ;;
    ranks4) for lr in 2e-4 2e-6; do for m in pulseloco diloco; do run ranks4 $m $lr 1 10 4; done; done ;;
    *) echo "bench/loco.sh: unknown phase $phase" >&2; exit 2 ;;
    esac
done
python3 bench/loco_report.py "$OUT" | tee "$OUT/report.md"
