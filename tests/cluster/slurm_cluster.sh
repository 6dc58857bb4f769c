#!/usr/bin/env bash
# A one-node Slurm cluster in a folder, for the tests: munge with its own key and socket,
# slurmctld and slurmd from Debian's packages, configured for a container (no cgroups, Linux
# process tracking, the current user as the Slurm user), listening on loopback ports.
#
#   slurm_cluster.sh start DIR [OWNER_PID]   start; prints the SLURM_CONF path on success
#   slurm_cluster.sh stop DIR                stop every daemon started in DIR
#
# With OWNER_PID a watchdog stops the cluster as soon as that process is gone (a test killed
# by a timeout never leaves daemons behind). Exit code 77: the Slurm or munge programs are not
# installed (scripts/setup.sh installs them).
set -u

cmd="${1:-}"
dir="${2:-}"
owner="${3:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR [OWNER_PID]" >&2; exit 2; }

stop_cluster() {
  local d="$1"
  # Cancel this cluster's jobs first, so that no job step outlives the daemons.
  if [ -f "$d/slurm.conf" ] && [ -f "$d/slurmctld.pid" ]; then
    SLURM_CONF="$d/slurm.conf" timeout 10 scancel --full -u "$(id -un)" 2>/dev/null
    for _ in $(seq 1 50); do
      [ -z "$(SLURM_CONF="$d/slurm.conf" timeout 5 squeue -h -o %A 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  for f in slurmd slurmctld; do
    if [ -f "$d/$f.pid" ]; then
      local p
      p="$(cat "$d/$f.pid" 2>/dev/null)"
      [ -n "$p" ] && kill -TERM "$p" 2>/dev/null
    fi
  done
  # slurmstepd and job processes of this cluster: children of slurmd, gone with it; wait a bit.
  for _ in $(seq 1 50); do
    local alive=0
    for f in slurmd slurmctld; do
      [ -f "$d/$f.pid" ] && kill -0 "$(cat "$d/$f.pid" 2>/dev/null)" 2>/dev/null && alive=1
    done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for f in slurmd slurmctld; do
    [ -f "$d/$f.pid" ] && kill -KILL "$(cat "$d/$f.pid" 2>/dev/null)" 2>/dev/null
    rm -f "$d/$f.pid"
  done
  if [ -f "$d/munged.pid" ]; then
    kill -TERM "$(cat "$d/munged.pid" 2>/dev/null)" 2>/dev/null
    rm -f "$d/munged.pid"
  fi
  if [ -f "$d/watchdog.pid" ]; then
    local w
    w="$(cat "$d/watchdog.pid" 2>/dev/null)"
    rm -f "$d/watchdog.pid"
    [ -n "$w" ] && [ "$w" != "$$" ] && kill -TERM "$w" 2>/dev/null
  fi
}

if [ "$cmd" = stop ]; then
  stop_cluster "$dir"
  exit 0
fi
[ "$cmd" = start ] || { echo "unknown command '$cmd'" >&2; exit 2; }

for prog in munged slurmctld slurmd sbatch scontrol squeue; do
  command -v "$prog" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin"
  command -v "$prog" >/dev/null 2>&1 || { echo "$prog is not installed (Debian: munge, slurmctld, slurmd, slurm-client)"; exit 77; }
done

mkdir -p "$dir/state" "$dir/spool" || exit 1
chmod 755 "$dir"  # munged insists that every user may reach its socket
# munge: its own key, socket and files in DIR.
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 2>/dev/null
chmod 600 "$dir/munge.key"
munged --socket="$dir/munge.sock" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" </dev/null >/dev/null 2>&1 || {
  echo "munged did not start:"; tail -n 5 "$dir/munged.log"; exit 1; }

# Two free loopback ports.
ports="$(python3 - <<'EOF'
import socket
socks = []
for _ in range(2):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks: s.close()
EOF
)"
set -- $ports
ctld_port="$1"
d_port="$2"
host="$(hostname -s)"
user="$(id -un)"
cpus="$(nproc)"
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
cat >"$dir/slurm.conf" <<EOF
ClusterName=sparsimtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SlurmdParameters=config_overrides
PlugStackConfig=$dir/plugstack.conf
KillWait=5
MessageTimeout=10
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
: >"$dir/plugstack.conf"
export SLURM_CONF="$dir/slurm.conf"

if [ -n "$owner" ]; then
  (
    trap '' HUP
    while kill -0 "$owner" 2>/dev/null && [ -f "$dir/watchdog.pid" ]; do sleep 1; done
    [ -f "$dir/watchdog.pid" ] && stop_cluster "$dir"
  ) </dev/null >/dev/null 2>&1 &
  echo $! >"$dir/watchdog.pid"
fi

slurmctld -i </dev/null >>"$dir/slurmctld.out" 2>&1 || { echo "slurmctld did not start:"; tail -n 20 "$dir/slurmctld.log"; stop_cluster "$dir"; exit 1; }
slurmd </dev/null >>"$dir/slurmd.out" 2>&1 || { echo "slurmd did not start:"; tail -n 20 "$dir/slurmd.log"; stop_cluster "$dir"; exit 1; }
# Ready when the node is idle (bounded wait).
for _ in $(seq 1 150); do
  state="$(sinfo -h -N -o '%T' 2>/dev/null | head -1)"
  [ "$state" = idle ] && { echo "$SLURM_CONF"; exit 0; }
  sleep 0.2
done
echo "the Slurm node did not become idle (state '$state'):"
tail -n 10 "$dir/slurmctld.log" "$dir/slurmd.log"
stop_cluster "$dir"
exit 1
