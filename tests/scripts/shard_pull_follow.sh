#!/usr/bin/env bash
# Islands that follow (docs/SHARDING.md, issue 24 item 6), on a file://
# store with the rl-a sequence published by 4 trainer ranks under real MPI
# (mpirun -np 4 build/ferry-shard-mpi):
#   - `ferry shard-pull --out PATH` keeps its state in PATH.ferry.json; the
#     next call starts from the version held: only the deltas are fetched
#     (tile bytes and bytes read drop against a fresh pull), and PATH is
#     bit-identical to a fresh pull of the same version;
#   - `--follow --until-version` picks up versions published meanwhile (a
#     bounded loop), `--idle-timeout` stops it (exit 4);
#   - a corrupt state file, one of other slices or another run, and a PATH
#     changed behind its state are clear errors that leave both files as
#     they were; so is a pull that fails on a corrupt rank object;
#   - kill -9 at several points of a pull: the next call works and PATH
#     equals a fresh pull; no temporary file of the killed process stays;
#   - slices off the tile edges cannot be resumed: the call says so and
#     pulls from scratch, still exact;
#   - `ferry pull --to FILE` of a sharded run writes the whole model (M = 1)
#     equal to the BF16 checkpoint, and its next call fetches only deltas.
# Skips when mpirun or the programs are absent (NO_MPI=1 builds).
set -u
TEST_NAME=shard_pull_follow
source tests/tools/sync_env.sh
PUB=${FERRY_BUILD:-$PWD/build}/ferry-shard-mpi
command -v mpirun >/dev/null 2>&1 || skip_all "no mpirun"
[ -x "$PUB" ] && [ -x "$FERRY" ] || skip_all "no $PUB or $FERRY (NO_MPI=1?)"
[ -f "$DATA/rl-a/step-007.safetensors" ] || skip_all "no rl-a data in $DATA"
source tests/tools/mpi_env.sh
S=$WORK/store
RUN=shard/follow
mkdir -p "$S"
step() { printf '%s/rl-a/step-%03d.safetensors' "$DATA" "$1"; }
pub() { # STEP...: versions from 4 trainer ranks (version = step + 1)
    local f=() i
    for i in "$@"; do f+=("$(step "$i")"); done
    timeout 300 mpirun -np 4 --oversubscribe "${MPIENV[@]}" "$PUB" "$S" --run $RUN --tile-words 256 --anchor-every 4 -q "${f[@]}" \
        >"$WORK/pub.out" 2>&1 || { bad "publish steps $*"; tail -n 5 "$WORK/pub.out"; }
}
json() { $PY -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); sys.exit(0 if ($1) else 1)"; }
jget() { $PY -c "import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])[sys.argv[2]])" "$1" "$2"; }
SLICES=(--slice 'model.layers.0.self_attn.q_proj.weight@64:128' --slice 'model.layers.1.mlp.down_proj.weight@:,0:96'
    --slice 'lm_head.weight@:,96:192' --slice model.norm.weight)
sp() { fy shard-pull "$S" --run $RUN "${SLICES[@]}" "$@"; }
A=$WORK/island.safetensors

# --- a cold pull, then only deltas ---------------------------------------------
pub 0 1 2
sp --out "$A" --json >"$WORK/cold.json"
check "cold shard-pull --out: version 3 from the anchor" json "d['version']==3 and d['from_version']==0 and d['path'].startswith('anchor')" \
    <"$WORK/cold.json"
check "... its state beside PATH records version 3" $PY -c "
import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d['format']=='ferry-shard-local-1' and d['current']['version']==3 and d['pending'] is None else 1)" \
    "$A.ferry.json"
pub 3
sp --out "$A" --json >"$WORK/inc.json"
sp --out "$WORK/fresh4.safetensors" --json >"$WORK/fresh4.json"
check "second call: from version 3 by the chain 3..4" json "d['from_version']==3 and d['version']==4 and d['path']=='chain 3..4'" \
    <"$WORK/inc.json"
inc_obj=$(jget "$WORK/inc.json" object_bytes); fresh_obj=$(jget "$WORK/fresh4.json" object_bytes)
inc_all=$(jget "$WORK/inc.json" bytes_fetched); fresh_all=$(jget "$WORK/fresh4.json" bytes_fetched)
echo "note tile bytes: incremental $inc_obj, fresh $fresh_obj; all bytes read: incremental $inc_all, fresh $fresh_all"
check "... fetches only the delta's tiles: under a quarter of a fresh pull's tile bytes ($inc_obj vs $fresh_obj)" \
    [ "$inc_obj" -gt 0 -a $((inc_obj * 4)) -lt "$fresh_obj" ]
check "... and fewer bytes in all, manifests included ($inc_all vs $fresh_all)" [ "$inc_all" -lt "$fresh_all" ]
check "... PATH is bit-identical to a fresh pull of version 4" cmp -s "$A" "$WORK/fresh4.safetensors"
cp "$A" "$WORK/a4.safetensors"
sp --out "$A" --json >"$WORK/same.json"
check "a third call with HEAD unchanged: up to date, no tile fetched, PATH as it was" \
    bash -c "$PY -c \"import json,sys; d=json.load(sys.stdin); sys.exit(0 if d['from_version']==d['version']==4 and d['object_bytes']==0 else 1)\" <'$WORK/same.json' && cmp -s '$A' '$WORK/a4.safetensors'"

# --- --follow: versions published meanwhile ----------------------------------------
timeout 300 "$FERRY" shard-pull "$S" --run $RUN "${SLICES[@]}" --out "$A" --follow --interval 0.2 --until-version 6 --json \
    >"$WORK/follow.json" 2>"$WORK/follow.err" &
FPID=$!
pub 4
pub 5
rc=0; wait "$FPID" || rc=$?
check "--follow --until-version 6 returns once version 6 is held (exit $rc)" [ "$rc" -eq 0 ]
check "... it pulled 5 and 6 as deltas, one line each" $PY - "$WORK/follow.json" <<'EOF'
import json, sys
ls = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ok = [(d["from_version"], d["version"]) for d in ls] == [(4, 5), (5, 6)] and all(d["path"].startswith("chain") for d in ls)
sys.exit(0 if ok else 1)
EOF
sp --out "$WORK/fresh6.safetensors" -q
check "... PATH equals a fresh pull of version 6" cmp -s "$A" "$WORK/fresh6.safetensors"
check_rc "--follow --idle-timeout 1 with no new version: exit 4" 4 \
    timeout 60 "$FERRY" shard-pull "$S" --run $RUN "${SLICES[@]}" --out "$A" --follow --interval 0.2 --idle-timeout 1 -q

# --- clear errors: the state and PATH left as they were -------------------------------
cp "$A" "$WORK/a6.safetensors"; cp "$A.ferry.json" "$WORK/a6.json"
unchanged() { cmp -s "$A" "$WORK/a6.safetensors" && cmp -s "$A.ferry.json" "$WORK/a6.json"; }
printf '{"format": "ferry-shard-local-1", "run": ' >"$A.ferry.json"
rc=0; sp --out "$A" -q 2>"$WORK/corrupt.err" || rc=$?
check "a corrupt state file: exit 1 ($rc), naming the file" \
    bash -c "[ $rc -eq 1 ] && grep -q 'ferry.json: not valid JSON' '$WORK/corrupt.err'"
check "... PATH untouched" cmp -s "$A" "$WORK/a6.safetensors"
cp "$WORK/a6.json" "$A.ferry.json"
rc=0; fy shard-pull "$S" --run $RUN --slice model.norm.weight --out "$A" -q 2>"$WORK/other.err" || rc=$?
check "other slices than the state's: exit 1 ($rc), said" bash -c "[ $rc -eq 1 ] && grep -q 'other slices' '$WORK/other.err'"
check "... both files as they were" unchanged
rc=0; fy shard-pull "$S" --run shard/other "${SLICES[@]}" --out "$A" -q 2>"$WORK/run.err" || rc=$?
check "the state of another run: exit 1 ($rc)" bash -c "[ $rc -eq 1 ] && grep -q \"run 'shard/follow'\" '$WORK/run.err'"
$PY - "$A" <<'EOF' || bad "edit PATH"
import sys
b = bytearray(open(sys.argv[1], "rb").read()); b[-3] ^= 0x40; open(sys.argv[1], "wb").write(b)
EOF
rc=0; sp --out "$A" -q 2>"$WORK/changed.err" || rc=$?
check "PATH changed behind its state: exit 1 ($rc), said" bash -c "[ $rc -eq 1 ] && grep -q 'matches neither version' '$WORK/changed.err'"
cp "$WORK/a6.safetensors" "$A"
check "... both files as they were" unchanged
pub 6                                           # version 7
p=$(ls "$S/$RUN"/v/00000000000000000007-*-r000001.patch)
cp "$p" "$WORK/good.patch"
head -c "$(stat -c %s "$p")" /dev/urandom >"$p.x" && mv "$p.x" "$p" # every tile of rank 1 fails its SHA-256
rc=0; sp --out "$A" -q 2>"$WORK/bad7.err" || rc=$?
check "a corrupt rank object: the pull fails (exit $rc, want 6)" [ "$rc" -eq 6 ]
check "... PATH and its state as they were (version 6)" unchanged
cp "$WORK/good.patch" "$p"
sp --out "$A" --json >"$WORK/v7.json"
check "repaired: the next call goes 6..7" json "d['from_version']==6 and d['version']==7" <"$WORK/v7.json"

# --- kill -9 at several points of a pull: the next call always works ---------------------------
for d in 0.05 0.1 0.15 0.2 0.3 0.5 0.8; do
    (timeout -s KILL "$d" "$FERRY" shard-pull "$S" --run $RUN "${SLICES[@]}" --out "$A" --exact-version 2 -q >/dev/null 2>&1) 2>/dev/null
    rc=0; sp --out "$A" -q || rc=$?
    [ $rc -eq 0 ] || bad "the call after a kill -9 at $d s (exit $rc)"
done
sp --out "$WORK/fresh7.safetensors" -q
check "kill -9 during pulls (7 points): every next call worked; PATH equals a fresh pull" cmp -s "$A" "$WORK/fresh7.safetensors"
check "... and no file of the killed writers is left beside PATH" \
    bash -c "! ls '$WORK' | grep -q -e '^island.safetensors.tmp' -e '^island.safetensors.ferry.json.tmp'"

# --- slices off the tile edges -------------------------------------------------------------
fy shard-pull "$S" --run $RUN --slice 'lm_head.weight@3:70' --out "$WORK/odd.safetensors" -q || bad "odd slice, cold"
fy shard-pull "$S" --run $RUN --slice 'lm_head.weight@3:70' --out "$WORK/odd.safetensors" --json \
    >"$WORK/odd.json" 2>"$WORK/odd.err"
check "slices off the tile edges: not resumed, said, pulled from scratch" \
    bash -c "grep -q 'tile edges' '$WORK/odd.err' && $PY -c \"import json,sys; d=json.load(sys.stdin); sys.exit(0 if d['from_version']==0 and d['version']==7 else 1)\" <'$WORK/odd.json'"

# --- ferry pull of a sharded run into one file (M = 1) -------------------------------------
W=$WORK/whole.safetensors
fy pull "$S" --run $RUN --to "$W" --json >"$WORK/whole.json"
check "ferry pull --to of a sharded run: version 7, the whole model" json "d['version']==7 and d.get('sharded')" <"$WORK/whole.json"
check "... equal to the BF16 checkpoint of step 6, tensor for tensor" same_tensors "$(step 6)" "$W"
pub 7                                           # version 8
fy pull "$S" --run $RUN --to "$W" --json >"$WORK/whole8.json"
check "... the next ferry pull fetches the deltas 7..8" json "d['from_version']==7 and d['version']==8 and d['route']=='chain 7..8'" \
    <"$WORK/whole8.json"
w_obj=$(jget "$WORK/whole8.json" object_bytes); w_cold=$(jget "$WORK/whole.json" object_bytes)
check "... fewer tile bytes than the cold pull ($w_obj vs $w_cold)" [ "$w_obj" -lt "$w_cold" ]
check "... equal to step 7" same_tensors "$(step 7)" "$W"
check_rc "ferry pull --follow of a sharded run at HEAD: --idle-timeout ends it" 4 timeout 60 "$FERRY" pull "$S" --run $RUN --to "$W" --follow --interval 0.2 --idle-timeout 1 -q
finish
