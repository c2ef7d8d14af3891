#!/usr/bin/env bash
# PULSELoCo against DiLoCo and DDP on the reference RL workload
# (examples/rl, 1.0M-parameter policy, GRPO on "reverse 6 digits"), through
# build/examples/loco_train under mpirun.  Every mode runs the same seeds
# and the same number of local steps (ROUNDS x H per rank); bytes are what
# each rank sends (loco_train's "bytes"), summed over ranks.
#
#   bash bench/loco.sh            phases curves, llm, sweep, finetune, ftavg,
#                                 ftnest, ftv2, ftavgv2 (hours on a busy 2-core machine)
#   bash bench/loco.sh sweep      one phase: curves | llm | sweep | finetune |
#                                 ftavg | ftnest | llmlong | ranks4 | ftouter |
#                                 ftavglong | ftmom | ftv2 | ftavgv2 | ranks4v2 | ftllm
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
#   finetune  RL fine-tuning of a pre-trained policy, the regime of the
#           published PULSELoCo figures: rl_train pre-trains the policy on the
#           same task for FT_PRE_STEPS steps at lr 2e-4 (seed FT_PRE_SEED;
#           deterministic, so the checkpoint is the same bits on every run of
#           the same binary) and saves its FP32 masters to
#           $BUILD/loco-finetune/; then all three modes start from that
#           checkpoint (--init) at each inner lr of FT_LRS, FT_ROUNDS rounds,
#           seeds FT_SEEDS.  The pre-training log goes to
#           bench/results/loco/finetune/pretrain.log.
#   ftouter (opt-in) the same fine-tune with outer lr 1, momentum 0 (plain
#           averaging: the outer step applies exactly the mean of what was
#           sent, so the gate's "visible" is what reaches the weights) at
#           inner lr FT_OUTER_LR (7x FT_LRS's first: the same long-run step
#           as momentum 0.9 / lr 0.7 gives), FT_OUTER_ROUNDS rounds, seed 1,
#           PULSELoCo and DiLoCo: the lag's dependence on the outer step.
#   ftavg   the fine-tune with plain averaging as the outer step (outer lr 1,
#           momentum 0) for every mode, at inner lr FT_AVG_LR (2e-6) and
#           H FT_AVG_H (4), FT_AVG_ROUNDS (80) rounds, seeds FT_SEEDS, all
#           three modes.
#   ftavglong (opt-in) ftavg's seed 1 for FT_AVGLONG_ROUNDS (160) rounds,
#           PULSELoCo and DiLoCo (its first 80 rounds repeat ftavg's bit for
#           bit: every run is deterministic).
#   ftmom   (opt-in) ftavg's setting (inner lr 2e-6, H 4) with two other
#           outer steps, seed 1, 40 rounds, PULSELoCo and DiLoCo: outer lr
#           0.1 with Nesterov momentum 0.9 (long-run gain lr / (1 - momentum)
#           = 1, as plain averaging) and outer lr 0.7 with momentum 0.5 (1.4).
#   ftnest  ftavg's setting (inner lr 2e-6, H 4, FT_AVG_ROUNDS rounds, seeds
#           FT_SEEDS) with outer lr 0.1 and Nesterov momentum 0.9 (long-run
#           gain 1, as plain averaging, but a momentum outer optimizer),
#           PULSELoCo and DiLoCo.  DDP has no outer step (loco_train's DDP
#           path never reads --outer-lr / --outer-momentum), so its runs would
#           be ftavg's bit for bit: the phase makes sure ftavg's DDP runs exist
#           (finetune-avg/ddp-*) and the report reuses them.
#
# The phases above measure the original PULSELoCo (gate "sent", exact FP32
# values): they pass LEGACY (--gate sent --values fp32) to every mode
# (DiLoCo and DDP never read them), so that their rows reproduce bit for
# bit.  The phases below run loco_train's defaults, the outer gate and
# cell-coded values (ferry_loco.h):
#   ftv2    finetune's setting (the default outer step, 0.7 / Nesterov 0.9;
#           inner lr 1e-6, H 8, FT_ROUNDS rounds, seeds FT_SEEDS), PULSELoCo
#           only: its DiLoCo and DDP rows are finetune's runs (they do not
#           depend on the gate), which the phase makes sure exist
#   ftavgv2 ftavg's setting (plain averaging), PULSELoCo only; DiLoCo and
#           DDP rows from ftavg
#   ranks4v2  finetune's setting on 4 ranks, FT4_ROUNDS (16) rounds, seeds
#           FT4_SEEDS (1 2 3), modes FT4_MODES (pulseloco diloco ddp); runs
#           go to finetune-ranks4-rROUNDS/
#   ftllm   closer to LLM fine-tuning: inner lr FTLLM_LR (5e-7), H FTLLM_H
#           (16), FTLLM_ROUNDS (20) rounds (the same 320 steps as ftv2), the
#           default outer step, seeds FTLLM_SEEDS (1 2 3), modes FTLLM_MODES
#           (pulseloco diloco); runs go to finetune-llm-rROUNDS/
# Raw output: bench/results/loco/PHASE/MODE-lrLR-sSEED.jsonl (one JSON object
# per round, from rank 0); runs already complete there are not redone.
# Report: bench/results/loco/report.md (bench/loco_report.py).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RANKS=${RANKS:-2}
H=${H:-8}
OUT=${OUT:-bench/results/loco}
PHASES=${PHASES:-${1:-curves llm sweep finetune ftavg ftnest ftv2 ftavgv2}}
PROG=$BUILD/examples/loco_train
if [ ! -x "$PROG" ]; then
    echo "bench/loco.sh: $PROG is not built (make; needs mpicc)" >&2
    exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
LEGACY=(--gate sent --values fp32)

run() { # phase mode lr seed rounds [ranks [extra options...]]
    local dir=$OUT/$1 f np=${6:-$RANKS}
    f=$dir/$2-lr$3-s$4.jsonl
    local extra=("${@:7}")
    mkdir -p "$dir"
    if [ -s "$f" ] && grep -q '"event":"summary"' "$f"; then return 0; fi
    local h=${RUN_H:-$H}
    echo "== $1: mpirun -np $np $PROG --mode $2 --h $h --rounds $5 --lr $3 --seed $4 ${extra[*]} --json" >&2
    mpirun -np "$np" --oversubscribe "$PROG" --mode "$2" --h "$h" --rounds "$5" --lr "$3" \
        --seed "$4" "${extra[@]}" --json >"$f.tmp"
    mv "$f.tmp" "$f"
    grep '"event":"summary"' "$f" >&2
}

FT_PRE_STEPS=${FT_PRE_STEPS:-130}
FT_PRE_SEED=${FT_PRE_SEED:-11}
FT_LRS=${FT_LRS:-1e-6}
FT_ROUNDS=${FT_ROUNDS:-40}
FT_SEEDS=${FT_SEEDS:-1 2 3}
pretrained() { # -> path of the pre-trained checkpoint, made once
    local ck=$BUILD/loco-finetune/pretrained-steps$FT_PRE_STEPS-seed$FT_PRE_SEED.safetensors
    if [ ! -s "$ck" ]; then
        mkdir -p "$BUILD/loco-finetune" "$OUT/finetune"
        echo "== finetune: $BUILD/examples/rl_train --steps $FT_PRE_STEPS --seed $FT_PRE_SEED --quiet --save $ck" >&2
        "$BUILD/examples/rl_train" --steps "$FT_PRE_STEPS" --seed "$FT_PRE_SEED" --quiet --save "$ck" \
            >"$OUT/finetune/pretrain.log"
        cat "$OUT/finetune/pretrain.log" >&2
    fi
    echo "$ck"
}

for phase in $PHASES; do
    case $phase in
    curves) for s in 1 2 3; do for m in pulseloco diloco ddp; do run curves $m 2e-4 $s 30 "$RANKS" "${LEGACY[@]}"; done; done ;;
    llm) for s in 1 2; do for m in pulseloco diloco ddp; do run llm $m 2e-6 $s 40 "$RANKS" "${LEGACY[@]}"; done; done ;;
    sweep) for lr in 2e-4 5e-5 2e-5 1e-5 5e-6 2e-6 1e-6; do run sweep pulseloco $lr 1 6 "$RANKS" "${LEGACY[@]}"; done ;;
    llmlong) for m in pulseloco diloco ddp; do run llmlong $m 2e-6 3 100 "$RANKS" "${LEGACY[@]}"; done ;;
    ranks4) for lr in 2e-4 2e-6; do for m in pulseloco diloco; do run ranks4 $m $lr 1 10 4 "${LEGACY[@]}"; done; done ;;
    finetune)
        ck=$(pretrained)
        for lr in $FT_LRS; do for s in $FT_SEEDS; do for m in pulseloco diloco ddp; do
            run finetune $m "$lr" "$s" "$FT_ROUNDS" "$RANKS" --init "$ck" "${LEGACY[@]}"
        done; done; done ;;
    ftouter)
        ck=$(pretrained)
        for m in pulseloco diloco; do
            run finetune-outer $m "${FT_OUTER_LR:-7e-6}" 1 "${FT_OUTER_ROUNDS:-20}" "$RANKS" --init "$ck" "${LEGACY[@]}" \
                --outer-lr 1 --outer-momentum 0
        done ;;
    ftavg)
        ck=$(pretrained)
        for s in $FT_SEEDS; do for m in pulseloco diloco ddp; do
            RUN_H=${FT_AVG_H:-4} run finetune-avg $m "${FT_AVG_LR:-2e-6}" "$s" "${FT_AVG_ROUNDS:-80}" "$RANKS" \
                --init "$ck" "${LEGACY[@]}" --outer-lr 1 --outer-momentum 0
        done; done ;;
    ftnest)
        ck=$(pretrained)
        for s in $FT_SEEDS; do
            for m in pulseloco diloco; do
                RUN_H=${FT_AVG_H:-4} run finetune-nest $m "${FT_AVG_LR:-2e-6}" "$s" "${FT_AVG_ROUNDS:-80}" "$RANKS" \
                    --init "$ck" "${LEGACY[@]}" --outer-lr 0.1 --outer-momentum 0.9
            done
            # DDP ignores the outer options: ftavg's run is this phase's DDP run
            RUN_H=${FT_AVG_H:-4} run finetune-avg ddp "${FT_AVG_LR:-2e-6}" "$s" "${FT_AVG_ROUNDS:-80}" "$RANKS" \
                --init "$ck" "${LEGACY[@]}" --outer-lr 1 --outer-momentum 0
        done ;;
    ftavglong)
        ck=$(pretrained)
        for m in pulseloco diloco; do
            RUN_H=${FT_AVG_H:-4} run finetune-avglong $m "${FT_AVG_LR:-2e-6}" 1 "${FT_AVGLONG_ROUNDS:-160}" "$RANKS" \
                --init "$ck" "${LEGACY[@]}" --outer-lr 1 --outer-momentum 0
        done ;;
    ftmom)
        ck=$(pretrained)
        for om in "0.1 0.9" "0.7 0.5"; do for m in pulseloco diloco; do
            set -- $om
            RUN_H=${FT_AVG_H:-4} run "finetune-mom-o$1-m$2" $m "${FT_AVG_LR:-2e-6}" 1 40 "$RANKS" \
                --init "$ck" "${LEGACY[@]}" --outer-lr "$1" --outer-momentum "$2"
        done; done ;;
    ftv2)
        ck=$(pretrained)
        for lr in $FT_LRS; do for s in $FT_SEEDS; do
            run finetune-v2 pulseloco "$lr" "$s" "$FT_ROUNDS" "$RANKS" --init "$ck"
            for m in diloco ddp; do run finetune $m "$lr" "$s" "$FT_ROUNDS" "$RANKS" --init "$ck" "${LEGACY[@]}"; done
        done; done ;;
    ftavgv2)
        ck=$(pretrained)
        for s in $FT_SEEDS; do
            RUN_H=${FT_AVG_H:-4} run finetune-avg-v2 pulseloco "${FT_AVG_LR:-2e-6}" "$s" "${FT_AVG_ROUNDS:-80}" "$RANKS" \
                --init "$ck" --outer-lr 1 --outer-momentum 0
            for m in diloco ddp; do
                RUN_H=${FT_AVG_H:-4} run finetune-avg $m "${FT_AVG_LR:-2e-6}" "$s" "${FT_AVG_ROUNDS:-80}" "$RANKS" \
                    --init "$ck" --outer-lr 1 --outer-momentum 0 "${LEGACY[@]}"
            done
        done ;;
    ranks4v2)
        ck=$(pretrained)
        r=${FT4_ROUNDS:-16}
        for s in ${FT4_SEEDS:-1 2 3}; do for m in ${FT4_MODES:-pulseloco diloco ddp}; do
            run "finetune-ranks4-r$r" $m "${FT_LRS%% *}" "$s" "$r" 4 --init "$ck"
        done; done ;;
    ftllm)
        ck=$(pretrained)
        r=${FTLLM_ROUNDS:-20}
        for s in ${FTLLM_SEEDS:-1 2 3}; do for m in ${FTLLM_MODES:-pulseloco diloco}; do
            RUN_H=${FTLLM_H:-16} run "finetune-llm-r$r" $m "${FTLLM_LR:-5e-7}" "$s" "$r" "$RANKS" --init "$ck"
        done; done ;;
    *) echo "bench/loco.sh: unknown phase $phase" >&2; exit 2 ;;
    esac
done
python3 bench/loco_report.py "$OUT" | tee "$OUT/report.md"
