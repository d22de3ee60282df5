#!/usr/bin/env bash
# Installs the named Debian packages when any is missing (e.g. the SQLite JDBC driver the benchmark's
# shared catalog needs). Idempotent: quiet and quick when all are installed.
set -euo pipefail

missing=()
for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
[ "${#missing[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "ensure_debian_packages.sh: need root to install ${missing[*]} (run with sudo)" >&2
    exit 1
fi
echo "ensure_debian_packages.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "ensure_debian_packages.sh: done" >&2
