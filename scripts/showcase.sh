#!/usr/bin/env bash
# showcase.sh — ferry end to end in one command, with nothing outside the
# repository: simulate an RL fine-tune (AdamW at lr 3e-6 on FP32 masters,
# BF16 checkpoint per step: build/examples/adamw_sim), then for every pair of
# consecutive checkpoints encode the patch with `ferry diff`, rebuild the new
# checkpoint with `ferry apply`, and prove the rebuilt file is byte-for-byte
# the real one (cmp).  Prints one row per step and a totals line.
#
#   scripts/showcase.sh [--steps N] [--params N] [--seed S] [--keep DIR] [-- SIM_OPTIONS...]
#
# Exit status: 0 when every step round-tripped bit-identically, 1 otherwise.
# BUILD (default build) selects the build directory; NO_NET=1 builds the
# core only (the showcase needs nothing else).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=8 params= seed=1 keep= sim_extra=()
while [ $# -gt 0 ]; do
    case $1 in
        --steps) steps=$2; shift 2 ;;
        --params) params=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --keep) keep=$2; shift 2 ;;
        --) shift; sim_extra=("$@"); break ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "showcase.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done

BUILD=${BUILD:-build}
FERRY=$BUILD/ferry SIM=$BUILD/examples/adamw_sim
# Debian's python, for its stdlib json only (DESIGN.md: the first python3 on
# PATH may be another interpreter; any python3 parses JSON).
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3

# Dependencies and build.  install-deps.sh is a no-op when everything is
# there; the npm test server is not needed here.
FERRY_SKIP_NPM=1 bash scripts/install-deps.sh
if ! make -s -j2 "$FERRY" "$SIM" >/dev/null; then
    # The showcase needs only the core (common, codec, io); a network layer
    # that does not build must not stop it.
    echo "showcase.sh: full build failed; building the core only (NO_NET=1)" >&2
    make -s -j2 NO_NET=1 "$FERRY" "$SIM" >/dev/null
fi

if [ -n "$keep" ]; then
    dir=$keep; mkdir -p "$dir"
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/ferry-showcase.XXXXXX")
    trap 'rm -rf "$dir"' EXIT
fi

sim_args=(--out "$dir" --steps "$steps" --seed "$seed" --quiet)
[ -n "$params" ] && sim_args+=(--params "$params")
echo "== simulating an RL run: $SIM ${sim_args[*]} ${sim_extra[*]:-}"
"$SIM" "${sim_args[@]}" "${sim_extra[@]}" | sed -n '1p;/^all steps:/p;/^time:/p'

# json FIELD: prints top-level FIELD of the JSON object on stdin.
json() { "$PY" -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
now_ms() { date +%s%3N; }

echo
printf '%4s  %9s  %12s  %12s  %8s  %9s  %9s  %s\n' \
    step changed% "patch bytes" "full bytes" ratio "encode ms" "apply ms" bit-identical
tot_patch=0 tot_full=0 tot_enc=0 tot_app=0 bad=0
for ((k = 1; k <= steps; k++)); do
    old=$(printf '%s/step-%03d.safetensors' "$dir" $((k - 1)))
    new=$(printf '%s/step-%03d.safetensors' "$dir" "$k")
    patch=$(printf '%s/patch-%03d.ferry' "$dir" "$k")
    out=$(printf '%s/applied-%03d.safetensors' "$dir" "$k")

    t0=$(now_ms)
    dj=$("$FERRY" diff "$old" "$new" -o "$patch" --json)
    t1=$(now_ms)
    aj=$("$FERRY" apply "$old" "$patch" -o "$out" --json)
    t2=$(now_ms)
    changed=$("$FERRY" stats "$old" "$new" --json | json changed_fraction)

    # The library's own timings (codec only, no file I/O) when the CLI
    # reports them, else the wall time of the whole command.
    enc=$(json encode_ms <<<"$dj" 2>/dev/null) || enc=$((t1 - t0))
    app=$(json apply_ms <<<"$aj" 2>/dev/null) || app=$((t2 - t1))
    pbytes=$(stat -c %s "$patch")
    fbytes=$(stat -c %s "$new")
    if cmp -s "$out" "$new"; then same=yes; else same=NO; bad=$((bad + 1)); fi
    rm -f "$out"

    printf '%4d  %8.3f%%  %12d  %12d  %7.1fx  %9.1f  %9.1f  %s\n' "$k" \
        "$("$PY" -c "print(100*$changed)")" "$pbytes" "$fbytes" \
        "$("$PY" -c "print($fbytes/$pbytes)")" "$enc" "$app" "$same"
    tot_patch=$((tot_patch + pbytes)); tot_full=$((tot_full + fbytes))
    tot_enc=$("$PY" -c "print($tot_enc+$enc)"); tot_app=$("$PY" -c "print($tot_app+$app)")
done
printf '%4s  %9s  %12d  %12d  %7.1fx  %9.1f  %9.1f  %s\n' total "" "$tot_patch" "$tot_full" \
    "$("$PY" -c "print($tot_full/max($tot_patch,1))")" "$tot_enc" "$tot_app" \
    "$([ $bad -eq 0 ] && echo "yes ($steps/$steps)" || echo "NO ($bad of $steps differ)")"
[ -n "$keep" ] && echo "files kept in $dir"
[ $bad -eq 0 ]
