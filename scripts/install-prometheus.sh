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

. "$(dirname "$0")/apt-no-services.sh"
apt_install_no_services prometheus
echo "install-prometheus: done"
