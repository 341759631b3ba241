#!/usr/bin/env bash
# Install Debian's `prometheus` (the server and promtool) and `prometheus-node-exporter` when they
# are missing: the alert-rule checks and the real-Prometheus test need the first two, doctor's
# host-evidence test a real node-exporter. `make prometheus` and .ci/run call this; a second run
# finds them and does nothing. Only the binaries are used: the packages' services are never started
# (the tests start their own servers on loopback, with configs and data folders of theirs).
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v prometheus-node-exporter >/dev/null; then
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "install.sh: prometheus, promtool or prometheus-node-exporter is missing; as root: apt-get install prometheus prometheus-node-exporter" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
# --no-install-recommends: the web console libraries are not needed.
apt-get install -y -q --no-install-recommends prometheus prometheus-node-exporter >/dev/null
echo "install.sh: $(prometheus --version 2>&1 | head -n 1); $(prometheus-node-exporter --version 2>&1 | head -n 1)" >&2
