#!/usr/bin/env bash
# What junk planted under the trainer's window costs each take (issue 23
# item 10), on a file:// store: bench/dock_junk.c plants JUNK objects once
# per kind into a template store, then each kind runs TAKES one-pass takes
# (one good batch put before each) on a copy of it.  One JSON line per kind.
#
#   bench/dock_junk.sh [JUNK [TAKES]]        (defaults 20000 and 20)
#   BUILD=build-x     the build whose bench/dock_junk runs (default build)
#   DOCK_JUNK=PATH    another dock_junk binary (an older library, to compare)
#
# Kinds (see dock_junk.c): names (junk names, quarantined), names-delete (the
# same with delete_rejected, as ferry-demo runs), grace (garbage under batch
# keys ahead of the good batches, with s3://'s 2 s grace period).
#
# Measured (bench/results/dock_junk.txt; shared 2-core machine, load 12-14,
# so times are noisy and counts exact), before (13ddcdd) -> after (78ffb46):
#   JUNK=20000  take mean s    objects read/take  good batches taken
#   names       4.60 -> 1.34   257 -> 33          20 -> 20
#   names-del   0.98 -> 0.88   257 -> 1           20 -> 20
#   grace       2.65 -> 1.43   256 -> 33           0 -> 20
#   JUNK=200
#   grace       0.056 -> 0.032 201 -> 11          20 -> 20
# What is left at 20000: each pass lists (and file:// reads and hashes)
# every planted object, 0.5-1 s of the above here, until they are cleared
# (32 a pass under one name, 256 junk names a pass with delete_rejected);
# docs/DOCK.md "Bounded work" and "Not done".
set -eu
cd "$(dirname "$0")/.."
JUNK=${1:-20000}
TAKES=${2:-20}
BIN=${DOCK_JUNK:-${BUILD:-build}/bench/dock_junk}
[ -x "$BIN" ] || { echo "dock_junk: $BIN is not built (make benches)" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-dock-junk.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$BIN" plant "file://$tmp/names" r "$JUNK" names
"$BIN" plant "file://$tmp/grace" r "$JUNK" grace
for kind in names names-delete grace; do
    src=$tmp/names
    [ "$kind" = grace ] && src=$tmp/grace
    rm -rf "$tmp/run" && cp -a "$src" "$tmp/run"
    "$BIN" take "file://$tmp/run" r "$kind" "$TAKES"
done
