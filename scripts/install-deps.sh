#!/usr/bin/env bash
# Installs the Debian 12 packages ferry builds, tests and benches with,
# only when some are missing.  Idempotent; needs root (or sudo).
set -euo pipefail
pkgs=(build-essential clang pkg-config libzstd-dev libxxhash-dev libjansson-dev
      libcurl4-openssl-dev openmpi-bin libopenmpi-dev python3-numpy python3-torch
      python3-pip python3-setuptools python3-wheel python3-pytest
      zstd xdelta3 libclang-rt-14-dev awscli libssl-dev nginx-light iproute2 openssl)
# node/npm may come from elsewhere (the image's nodesource build): only ask
# Debian for them when the commands are absent.
command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}" >&2
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Test-only S3 server (s3rver) from npm, kept inside the repo's ignored tree.
if [ "${FERRY_SKIP_NPM:-}" != 1 ] && [ -f tests/npm/package.json ] && [ ! -x tests/npm/node_modules/.bin/s3rver ]; then
    (cd tests/npm && npm install --no-audit --no-fund --silent) >&2
fi
