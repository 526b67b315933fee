#!/usr/bin/env bash
# Stops what slurm_up.sh started: cancels the cluster's jobs (so no job step outlives slurmd),
# then slurmd, slurmctld, and munged if it started one, by their pid files.
set -uo pipefail
DIR=${UFP4_SLURM_DIR:-/tmp/ufp4-slurm}
export SLURM_CONF=$DIR/slurm.conf
if [ -s "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
  scancel --full --partition=debug 2>/dev/null
  for _ in $(seq 40); do
    [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
    sleep 0.5
  done
fi
for pidfile in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
  [ -s "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$pidfile"
done
