#!/usr/bin/env bash
# Stops what slurm_up.sh started, by pid file: slurmd, slurmctld, and munged if it started one.
set -uo pipefail
DIR=${UFP4_SLURM_DIR:-/tmp/ufp4-slurm}
for pidfile in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
  [ -s "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$pidfile"
done
