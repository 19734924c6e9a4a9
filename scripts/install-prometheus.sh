#!/usr/bin/env bash
# Install Debian's Prometheus server, which tests/test_prometheus.py starts to scrape `workbench serve-metrics`.
# Non-interactive and idempotent: does nothing when the binary is already there.
# No service is enabled or started here; the test starts its own server on a free loopback port.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ]; then
    echo "install-prometheus: already installed"
    exit 0
fi
echo "install-prometheus: installing Debian's prometheus"

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d exit 101 keeps the package's maintainer scripts from starting the system service.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    created_policy=1
fi
trap 'if [ $created_policy -eq 1 ]; then $sudo rm -f "$policy"; fi' EXIT

$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
echo "install-prometheus: done"
