#!/usr/bin/env bash
# Install Debian's `redis-server` when it is missing: the shared-state tests (two gateway replicas
# sharing limits through Redis) start their own server from it. `make redis` and .ci/run call this;
# a second run finds it and does nothing. Only the binary is used: the package's service is never
# started (the tests start their own server on a free loopback port, in a temporary folder).
set -euo pipefail

if command -v redis-server >/dev/null; then
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "install.sh: redis-server is missing; as root: apt-get install redis-server" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends redis-server >/dev/null
# The package enables and starts its own service where systemd runs; the tests never use it.
if command -v systemctl >/dev/null && systemctl is-active --quiet redis-server 2>/dev/null; then
    systemctl disable --now redis-server >/dev/null 2>&1 || true
fi
echo "install.sh: $(redis-server --version)" >&2
