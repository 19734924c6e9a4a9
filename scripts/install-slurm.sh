#!/usr/bin/env bash
# Install the Debian packages the dev Slurm cluster (workbench/devcluster/) runs on:
# Slurm's controller, node daemon, accounting daemon and client tools, MUNGE and MariaDB.
# Non-interactive and idempotent: does nothing when every binary is already there.
# No service is enabled or started here; devcluster starts its own daemons under its state dir.
set -euo pipefail

needed=(slurmctld slurmd slurmdbd sacctmgr sbatch scontrol munged mungekey mariadbd mariadb-install-db mariadb)
missing=()
for bin in "${needed[@]}"; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || missing+=("$bin")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-slurm: already installed"
    exit 0
fi
echo "install-slurm: missing ${missing[*]}; installing"

. "$(dirname "$0")/apt-no-services.sh"
apt_install_no_services slurm-wlm slurmdbd slurm-client munge mariadb-server mariadb-client
echo "install-slurm: done"
