#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs the
# suite (last line "N passed, N failed").  --san runs it under ASan+UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
if [ "${1:-}" = "--san" ]; then
    make -j2 test SAN=1
else
    make -j2 test
fi
