#!/usr/bin/env bash
# Install Debian's `prometheus` (the server and promtool) when they are missing: the alert-rule
# checks and the real-Prometheus test need both. `make prometheus` and .ci/run call this; a second
# run finds them and does nothing. Only the binaries are used: the package's service is never
# started (the tests start their own server on loopback, with a config and data folder of theirs).
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "install.sh: prometheus and promtool are missing; as root: apt-get install prometheus" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
# --no-install-recommends: the node exporter and the web console libraries are not needed.
apt-get install -y -q --no-install-recommends prometheus >/dev/null
echo "install.sh: $(prometheus --version 2>&1 | head -n 1)" >&2
