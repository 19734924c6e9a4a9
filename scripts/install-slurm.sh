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

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d exit 101 keeps the packages' maintainer scripts from starting system services.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    created_policy=1
fi
trap 'if [ $created_policy -eq 1 ]; then $sudo rm -f "$policy"; fi' EXIT

$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends \
    slurm-wlm slurmdbd slurm-client munge mariadb-server mariadb-client >/dev/null
echo "install-slurm: done"
