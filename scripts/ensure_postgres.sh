#!/usr/bin/env bash
# Installs the PostgreSQL server and its JDBC driver (Debian packages) for the production-profile
# tests and the JdbcCatalog. Idempotent: quiet and quick when both are already installed.
set -euo pipefail

PACKAGES=(postgresql libpostgresql-jdbc-java)

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure_postgres.sh: need root to install ${missing[*]} (run with sudo)" >&2
    exit 1
fi

echo "ensure_postgres.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Debian's postgresql package creates and starts a cluster on port 5432; the tests start their
# own throwaway server on a free port instead, so that default cluster is left as it is.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "ensure_postgres.sh: installed ${missing[*]} but found no /usr/lib/postgresql/*/bin/initdb" >&2
    exit 1
fi
echo "ensure_postgres.sh: done ($(ls -d /usr/lib/postgresql/*/bin | head -n1))" >&2
