#!/usr/bin/env bash
# Installs Debian's `prometheus` (server and promtool) for the metrics tests (tests/test_metrics_prometheus.py),
# which start their own server on a free loopback port and check the alert rules with `promtool test rules`.
# Idempotent: one line and exit 0 when both are present. The package's own service is never used by the tests.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    echo "ensure_prometheus.sh: present ($(prometheus --version 2>&1 | head -1))" >&2
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure_prometheus.sh: need root to install prometheus (run with sudo)" >&2
    exit 1
fi

echo "ensure_prometheus.sh: installing prometheus" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Recommends pull in the node exporter; the tests need the server and promtool only.
apt-get install -y -qq --no-install-recommends prometheus >/dev/null

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    echo "ensure_prometheus.sh: installed prometheus but found no prometheus/promtool on PATH" >&2
    exit 1
fi
echo "ensure_prometheus.sh: done ($(prometheus --version 2>&1 | head -1))" >&2
