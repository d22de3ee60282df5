#!/usr/bin/env bash
# Installs Debian's headless-capable `chromium` for the UI tests (tests/test_ui.py), which render the
# Dagster UI in one `chromium --headless` driven over its DevTools pipe. Idempotent: one line and exit 0 when it is present.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "ensure_chromium.sh: present ($(chromium --version 2>/dev/null || echo "version unknown"))" >&2
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure_chromium.sh: need root to install chromium (run with sudo)" >&2
    exit 1
fi

echo "ensure_chromium.sh: installing chromium" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Recommends would pull in fonts, a desktop's icon themes and more; the headless render needs none.
apt-get install -y -qq --no-install-recommends chromium >/dev/null

if ! command -v chromium >/dev/null 2>&1; then
    echo "ensure_chromium.sh: installed chromium but found no chromium on PATH" >&2
    exit 1
fi
echo "ensure_chromium.sh: done ($(chromium --version 2>/dev/null || echo "version unknown"))" >&2
