#!/usr/bin/env bash
# Install Debian's `postgresql` when its server binaries are missing: the batch journal's
# PostgreSQL tests start their own server (initdb + pg_ctl in a temporary folder, on loopback).
# `make postgresql` and .ci/run call this; a second run finds them and does nothing. Debian puts
# the binaries under /usr/lib/postgresql/<version>/bin, off PATH; the package's own cluster and
# service are never used.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; then
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "install.sh: PostgreSQL's server is missing; as root: apt-get install postgresql" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends postgresql >/dev/null
echo "install.sh: $(ls -d /usr/lib/postgresql/*/bin | tail -n 1)" >&2
