#!/usr/bin/env bash
# Installs, in one apt transaction, whatever the launch tests need and this machine lacks:
# Slurm 22.05 (slurmctld, slurmd, slurm-client), munge and shellcheck. Root, Debian/Ubuntu.
set -euo pipefail
missing=()
for pair in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge \
            shellcheck:shellcheck; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "apt_deps.sh: need root to install ${missing[*]}" >&2; exit 1
fi
echo "[apt_deps] installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
