#!/usr/bin/env bash
# Starts a one-node Slurm cluster on this machine (root, Debian/Ubuntu): installs Slurm and
# munge with apt-get if missing (apt_deps.sh), writes a slurm.conf under
# $UFP4_SLURM_DIR and starts munged, slurmctld and slurmd. Idempotent: a running cluster is
# left alone. Prints `export SLURM_CONF=...` for the caller. Stop it with slurm_down.sh.
set -euo pipefail
DIR=${UFP4_SLURM_DIR:-/tmp/ufp4-slurm}
CONF=$DIR/slurm.conf
NODE=$(hostname -s)
CPUS=$(nproc)

if [ "$(id -u)" != 0 ]; then echo "slurm_up.sh: must run as root" >&2; exit 1; fi

"$(dirname "$0")/apt_deps.sh"

mkdir -p "$DIR"/{state,spool,log,munge} /run/munge /var/log/munge /var/lib/munge /etc/munge
chown munge:munge "$DIR/munge" /run/munge /var/log/munge /var/lib/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key

# munged: reuse a working one (a system service), else start ours and remember its pid file.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- munged --pid-file="$DIR/munge/munged.pid" --socket=/run/munge/munge.socket.2 --force
fi

export SLURM_CONF=$CONF
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Ports: 6817/6818 (Slurm's defaults) unless something else listens there (a system Slurm
# on this node, or daemons a killed run left behind), then the first free pair above. A
# cluster of ours that is already running keeps its slurm.conf, ports included.
if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" && [ -s "$CONF" ]; then
  ctld_port=$(sed -n 's/^SlurmctldPort=//p' "$CONF"); d_port=$(sed -n 's/^SlurmdPort=//p' "$CONF")
else
  ctld_port=
  for base in 6817 $(seq 6900 2 6998); do
    if ! listening "$base" && ! listening $((base + 1)); then ctld_port=$base; break; fi
  done
  if [ -z "$ctld_port" ]; then
    echo "slurm_up.sh: ports 6817-6818 and 6900-6999 are all in use; stop the Slurm daemons" \
      "holding them (launch/ci/slurm_down.sh with their UFP4_SLURM_DIR)" >&2
    exit 1
  fi
  d_port=$((ctld_port + 1))
  [ "$ctld_port" = 6817 ] || echo "slurm_up.sh: 6817/6818 in use; this cluster uses" \
    "$ctld_port/$d_port" >&2
fi

cat > "$CONF" <<CONF
ClusterName=ufp4ci
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
JobRequeue=1
ReturnToService=2
KillWait=30
MinJobAge=600
MpiDefault=none
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$NODE CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF

# -c: a CI cluster starts empty, forgetting the jobs of an earlier start.
alive "$DIR/slurmctld.pid" || slurmctld -c -f "$CONF"
alive "$DIR/slurmd.pid" || slurmd -f "$CONF"

for _ in $(seq 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
    echo "export SLURM_CONF=$CONF"
    exit 0
  fi
  sleep 0.5
done
echo "slurm_up.sh: node did not become idle; logs in $DIR/log" >&2
sinfo >&2 || true
exit 1
