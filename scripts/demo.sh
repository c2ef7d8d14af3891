#!/usr/bin/env bash
# demo.sh — the main job in one command: installs what is missing
# (scripts/install-deps.sh), builds ferry-demo and runs it: one
# trainer and 3 rollout islands (separate processes) that share only a
# file:// store in a temporary directory, post-training the reference
# policy (examples/rl, 1M parameters) with GRPO on digit reversal from a
# pre-trained start (cached in ~/.cache/ferry) at a small learning rate.
# Prints a row per step (version, reward, changed %, patch vs a full
# checkpoint, publish/sync/time-to-fresh ms, time waiting for weights,
# staleness, drops), a summary led by its headline, and the path of an
# HTML report.
#
#   scripts/demo.sh [ferry-demo options...]      e.g. --mode sequential, --islands 4,
#                                                --adaptive 0.8, --kill-island-at 40,
#                                                --rollout-dtype fp8 (islands sample with
#                                                the FP8 checkpoint of each version)
#
# BUILD (default build) selects the build directory.  Exit status: ferry-demo's.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; echo; BUILD=${BUILD:-build}
    [ -x "$BUILD/ferry-demo" ] && exec "$BUILD/ferry-demo" --help; exit 0 ;; esac
BUILD=${BUILD:-build}
# The demo needs the store, sync and dock layers (libcurl, OpenSSL) but not
# the npm test server.
FERRY_SKIP_NPM=1 bash scripts/install-deps.sh
make -s -j"$(nproc 2>/dev/null || echo 2)" BUILD="$BUILD" "$BUILD/ferry-demo" >/dev/null
exec "$BUILD/ferry-demo" "$@"
