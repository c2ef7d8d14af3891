#!/usr/bin/env bash
# ferry-demo --rollout-dtype fp8 (issue 25 item 5, examples/rl/demo): the
# trainer publishes every version as its FP8 checkpoint (fp8-block128), the
# islands hold it and sample with its dequantized values, the trainer learns
# on its FP32 masters as before.
#   - --help names --rollout-dtype; a bad value exits 2;
#   - a sequential run (BF16 leg, then FP8 leg; --dump): every model an
#     island holds at the stop is, byte for byte, `ferry quantize` of the
#     trainer's BF16 cast of that version (the BF16 leg: the cast itself);
#     the FP32 weights each island sampled with are code x scale of that
#     checkpoint per 128x128 block (decoded here by an independent numpy
#     E4M3 decoder) and the BF16 tensors widened; the JSON shows both legs,
#     FP8 and BF16 bytes per version (the FP8 patch smaller than the BF16
#     patch of the same step, the FP8 checkpoint smaller than the BF16 one),
#     the logits of the FP8 weights close to the BF16 version's (the probe),
#     finite rewards, and learning: reward rises over the 16 steps in both
#     legs (sequential mode with a fixed seed is deterministic), and the FP8
#     leg's stays close to the BF16 leg's; the HTML report has the FP8
#     section (bytes per version and rewards side by side);
#   - an async run with --no-baseline behind a --mirror (the islands'
#     background follower, FP8 through the mirror): the same checks on what
#     the islands hold.
# Prints "N passed, N failed" last.  Every run is bounded by `timeout`.
set -u
cd "$(dirname "$0")/../.."
FERRY=${FERRY_BIN:-$PWD/build/ferry}
source tests/tools/demo_env.sh
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
passed=0 failed=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-demo-fp8.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
export XDG_CACHE_HOME=$tmp/cache # the demo caches its pre-trained start there

pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; for f in "$tmp/out" "$tmp/err"; do [ -s "$f" ] && sed 's/^/    | /' "$f" | tail -n 12; done; }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
run() { timeout 240 "$DEMO" "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; }

if [ ! -x "$FERRY" ]; then echo "FAIL $FERRY is not built (make cli)"; echo "0 passed, 1 failed"; exit 1; fi
if ! "$PY" -c 'import numpy' 2>/dev/null; then echo "skip numpy is missing"; echo "0 passed, 0 failed, 1 skipped"; exit 0; fi

# ---- options ----------------------------------------------------------------
run --help
check "--help names --rollout-dtype and --dump" grep -q -- '--rollout-dtype bf16|fp8' "$tmp/out"
run --rollout-dtype fp4
check "--rollout-dtype fp4 is refused (exit 2, one line)" test "$rc" -eq 2 -a ! -s "$tmp/out" -a "$(wc -l <"$tmp/err")" -eq 1

# The runs of a JSON output: "SCHEME RUN" per leg.
legs_of() { "$PY" -c '
import json, sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e["event"] == "leg": print(e["quantize"], e["run"])' "$1"; }

# ref DIR SCHEME RUN V: what an island of that leg must hold at version V:
# ferry quantize of the trainer's BF16 cast of V (BF16 legs: the cast)
ref() {
    local want=$1/$3-trainer-v$4.safetensors out=$tmp/ref-$3-$4.safetensors
    [ "$2" = none ] && { echo "$want"; return; }
    [ -e "$out" ] || "$FERRY" quantize "$want" "$out" >/dev/null || return 1
    echo "$out"
}

# Every model an island held at the stop is its ref, byte for byte; prints
# the number of files checked.
check_held() { # dump dir, json
    local d=$1 n=0 q run f v want
    while read -r q run; do
        for f in "$d/$run"-island-*-v*.safetensors; do
            [ -e "$f" ] || continue
            [[ $f == *-f32.safetensors ]] && continue
            v=${f##*-v}; v=${v%.safetensors}
            want=$(ref "$d" "$q" "$run" "$v") || { echo "ferry quantize of $run v$v failed"; return 1; }
            cmp -s "$f" "$want" || { echo "$f differs from $want ($q)"; return 1; }
            n=$((n + 1))
        done
    done < <(legs_of "$2")
    echo "$n"
    [ "$n" -gt 0 ]
}

# The FP32 weights each island sampled with (RUN-island-I-vV-f32) against
# the ref of V decoded independently (numpy E4M3FN: bias 7, subnormal step
# 2^-9, S.1111.111 NaN; one FP32 product code x scale per 128x128 block;
# BF16 tensors widened); FP8 legs must hold F8_E4M3 tensors.  Prints the
# number of files checked.
check_values() { # dump dir, json
    local d=$1 q run f v
    while read -r q run; do
        for f in "$d/$run"-island-*-f32.safetensors; do
            [ -e "$f" ] || continue
            v=${f%-f32.safetensors}; v=${v##*-v}
            echo "$q $(ref "$d" "$q" "$run" "$v") $f"
        done
    done < <(legs_of "$2") >"$tmp/pairs"
    "$PY" - "$tmp/pairs" <<'EOF'
import json, struct, sys
import numpy as np

def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    dt = {"F32": np.float32, "BF16": np.uint16, "F8_E4M3": np.uint8}
    out = {}
    for k, v in h.items():
        s, e = v["data_offsets"]
        out[k] = (v["dtype"], np.frombuffer(b[8 + n + s:8 + n + e], dtype=dt[v["dtype"]]).reshape(v["shape"]))
    return out

def e4m3(c):
    c = c.astype(np.int64)
    s, e, m = (c >> 7) & 1, (c >> 3) & 15, c & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return np.where(s == 1, -v, v)

n = 0
for line in open(sys.argv[1]):
    q, ref, f = line.split()
    held, w, fp8 = load(ref), load(f), 0
    for name, (dt, x) in w.items():
        assert dt == "F32", (f, name, dt)
        hd, h = held[name]
        if hd == "BF16":
            want = (h.astype(np.uint32) << 16).view(np.float32)
        else:
            assert hd == "F8_E4M3", (f, name, hd)
            fp8 += 1
            sd, sc = held[name + "_scale_inv"]
            r, c = h.shape
            assert sd == "F32" and sc.shape == ((r + 127) // 128, (c + 127) // 128), (name, sc.shape)
            s = np.repeat(np.repeat(sc, 128, 0), 128, 1)[:r, :c].astype(np.float64)
            # code x scale is exact in float64 (4 + 24 significant bits): rounded once to FP32
            want = (e4m3(h) * s).astype(np.float32)
        assert x.tobytes() == want.tobytes(), (f, name, hd, float(np.nanmax(np.abs(x - want))))
    assert (fp8 > 0) == (q != "none"), (f, q, fp8)
    n += 1
assert n, "no dump"
print(n)
EOF
}

# ---- sequential: BF16 leg, then FP8 leg -------------------------------------
D1=$tmp/dump1
mkdir -p "$D1"
SEQ=(--islands 2 --steps 16 --dim 128 --prompts 8 --group 8 --seed 3 --mode sequential --lr 5e-4 --lr-warmup 0 --json)
run "${SEQ[@]}" --rollout-dtype fp8 --dump "$D1" --report "$tmp/r1.html"
cp "$tmp/out" "$tmp/r1.json"
check "sequential --rollout-dtype fp8 run exits 0" test "$rc" -eq 0
if "$PY" - "$tmp/r1.json" 16 <<'EOF' >"$tmp/err" 2>&1; then pass "JSON: BF16 and FP8 legs; FP8 and BF16 bytes per version; finite rewards; learning in both legs"; else fail "JSON: BF16 and FP8 legs; FP8 and BF16 bytes per version; finite rewards; learning in both legs"; fi
import json, math, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
steps = int(sys.argv[2])
assert ev[0]["event"] == "start" and ev[0]["rollout_dtype"] == "fp8", ev[0]
legs = [e for e in ev if e["event"] == "leg"]
assert [(l["leg"], l["quantize"]) for l in legs] == [("BF16 rollouts", "none"), ("FP8 rollouts", "fp8-block128")], legs
sm = {e["leg"]: e for e in ev if e["event"] == "summary"}
b, q = sm["BF16 rollouts"], sm["FP8 rollouts"]
for name in sm:
    st = [e for e in ev if e["event"] == "step" and e["leg"] == name]
    assert len(st) == steps, (name, len(st))
    for s in st:
        assert math.isfinite(s["reward"]) and 0 <= s["reward"] <= 1, s
        assert s["published"] and s["new_version"] == s["version"] + 1 and s["changed_pct"] > 0, s
        assert 0 < s["patch_bytes"] < s["full_bytes"], s
        if name == "FP8 rollouts":
            # the FP8 patch against the BF16 patch of the same step, and the checkpoints
            assert 0 < s["patch_bytes"] < s["bf16_patch_bytes"], s
            assert s["full_bytes"] < q["bf16_full_bytes"], (s, q)
            # the logits probe: the FP8 weights differ from the BF16 ones, a little
            assert 0 < s["fp8_logit_mean_abs"] <= s["fp8_logit_max_abs"] < 1, s
            assert 0 <= s["fp8_kl"] < 0.01 and 0.9 <= s["fp8_same_argmax"] <= 1, s
        else:
            assert s["bf16_patch_bytes"] == s["patch_bytes"] and "fp8_kl" not in s, s
    sm[name]["mean"] = sum(s["reward"] for s in st) / steps
assert q["full_bytes"] < 0.6 * q["bf16_full_bytes"] and q["bf16_full_bytes"] == b["full_bytes"], (q, b)
assert q["delta_bytes"] < q["bf16_delta_bytes"], q
assert q["fp8_probes"] == steps and 0 < q["fp8_kl"] < 0.01 and "fp8_kl" not in b, (q, b)
for s in (b, q):
    assert s["reward_last"] > s["reward_first"], s           # learning proceeds
assert q["masters_hash"] != b["masters_hash"]                 # FP8 rollouts, other trajectories
assert abs(q["mean"] - b["mean"]) < 0.05, (q["mean"], b["mean"])
EOF
out=$(check_held "$D1" "$tmp/r1.json" 2>&1)
check "sequential: each island holds, byte for byte, ferry quantize of the trainer's BF16 version (BF16 leg: the cast) [$out files]" \
    test "$(tail -n 1 <<<"$out")" -ge 4 2>/dev/null
out=$(check_values "$D1" "$tmp/r1.json" 2>&1)
check "sequential: the islands sampled with code x scale per 128x128 block (BF16 tensors widened) [$out]" test "$out" -ge 4 2>/dev/null
check "the report has the FP8 section: bytes per version and rewards side by side" \
    grep -q '<h2>FP8 rollouts</h2>' "$tmp/r1.html"
check "... its chart: the FP8 patch against the BF16 patch of the same step, per version" \
    grep -q 'bytes per version: FP8 patch vs BF16 patch' "$tmp/r1.html"
check "... BF16 leg's reward beside the FP8 leg's" grep -q '<th>reward, FP8 leg</th>.*<th>reward, BF16 leg</th>' "$tmp/r1.html"
check "... self-contained (no external resource)" bash -c '! grep -qE "(src|href)=\"(https?:)?//" "$1"' _ "$tmp/r1.html"

# ---- async, FP8 leg only, islands behind a mirror ---------------------------
D2=$tmp/dump2
mkdir -p "$D2"
run --islands 2 --steps 6 --dim 128 --prompts 4 --group 4 --seed 5 --rollout-dtype fp8 --no-baseline \
    --mirror "$tmp/mirror" --dump "$D2" --report "$tmp/r2.html" --json
cp "$tmp/out" "$tmp/r2.json"
check "async --rollout-dtype fp8 --no-baseline --mirror run exits 0" test "$rc" -eq 0
check "... one leg, FP8" test "$(grep -c '"event":"leg"' "$tmp/r2.json")" = 1 -a -n "$(grep '"event":"leg"' "$tmp/r2.json" | grep '"quantize":"fp8-block128"')"
check "... the mirror holds the FP8 run" test -n "$(ls "$tmp"/mirror/*/policy/HEAD 2>/dev/null)"
out=$(check_held "$D2" "$tmp/r2.json" 2>&1)
check "async: each island's follower holds ferry quantize of the trainer's BF16 version [$out files]" \
    test "$(tail -n 1 <<<"$out")" -ge 2 2>/dev/null
out=$(check_values "$D2" "$tmp/r2.json" 2>&1)
check "async: the islands sampled with the dequantized FP8 weights [$out]" test "$out" -ge 2 2>/dev/null

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
