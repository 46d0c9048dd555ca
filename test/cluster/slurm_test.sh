#!/usr/bin/env bash
# A single-node Slurm made for this test alone (munged, slurmctld, slurmd from Debian's
# packages, a minimal slurm.conf in a temporary directory: no cgroups, proctrack/linuxproc,
# task/none), then `srun --mpi=pmix -n N xagent`: the agents meet through Slurm's PMIx plugin,
# rank 0 writes the peers file, a client chases across every agent; scancel then stops every
# agent cleanly (SIGTERM). A second job's srun is killed (SIGKILL): Slurm ends the step and
# no task may be left.
# Usage: slurm_test.sh XAGENT CHASE_JOB N        Exit 77 (ctest: skipped) when Slurm is absent
# or cannot run here, saying why.
set -euo pipefail
xagent=$1 chase_job=$2 n=${3:-2}
skip() { echo "SKIP: $*"; exit 77; }
for tool in munged slurmctld slurmd srun scontrol squeue scancel; do
  command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] || skip "no $tool here (Debian: munge slurmctld slurmd slurm-client)"
done
export PATH=$PATH:/usr/sbin
[[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ]] || skip "Slurm has no PMIx plugin (slurm-wlm-basic-plugins)"
[[ $(id -u) -eq 0 ]] || skip "a private slurmd must run as root to start tasks"

work=$(mktemp -d)
chmod 700 "$work"
pids=()
jobs=()
step=
cleanup() {
  [[ -n $step ]] && kill -KILL "$step" 2>/dev/null || true
  # No step daemon may outlive this private cluster: cancel every job, give them a moment.
  if [[ -n ${SLURM_CONF:-} ]]; then
    scancel --quiet --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 40); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.05; done
  fi
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  # A job's step daemon is not slurmd's child (it is reparented to init) and may outlive slurmd
  # (after the srun SIGKILL of step 4 one stayed behind, asleep, for good): ours by job id.
  for j in "${jobs[@]}"; do pkill -KILL -f "^slurmstepd: \[$j\." 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
logs() { for f in "$work"/*.log; do echo "== $f"; tail -30 "$f"; done; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
mkdir -p "$work/state" "$work/spool" "$work/tmp"

# 1. munge with a key of our own, on a socket of our own.
dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge.key"
munged --force --key-file "$work/munge.key" --socket "$work/munge.socket" --pid-file "$work/munged.pid" \
  --log-file "$work/munged.log" --seed-file "$work/munge.seed" || { logs; skip "munged would not start here"; }
pids+=("$(cat "$work/munged.pid")")

# 2. Slurm: controller and node daemon on free ports, everything under $work.
cat >"$work/slurm.conf" <<CONF
ClusterName=bitshiptest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$work/munge.socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
ReturnToService=2
# Job ids (and the PMIx plugin's per-step directories, under TmpFS) unique to this run.
TmpFS=$work/tmp
FirstJobId=$((RANDOM * 32 + 1000))
KillWait=10
SlurmdTimeout=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF=$work/slurm.conf
started=$(date +%s%N)
slurmctld -D -i -f "$SLURM_CONF" >"$work/slurmctld.out.log" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$work/slurmd.out.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do
  scontrol show node "$host" 2>/dev/null | grep -qE "State=(IDLE|MIXED)" && break
  for p in "${pids[@]:1}"; do kill -0 "$p" 2>/dev/null || { logs; skip "a Slurm daemon exited at start (see its log above)"; }; done
  sleep 0.05
done
scontrol show node "$host" 2>/dev/null | grep -qE "State=(IDLE|MIXED)" || { logs; skip "the Slurm node did not become idle within 10 s"; }
echo "Slurm up in $((($(date +%s%N) - started) / 1000000)) ms"

running() { local s; s=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [[ $s != Z && $s != X ]]; }

# Starts `srun --mpi=pmix -n N xagent` writing its peers file to $1; sets $step, $job, $tasks.
start_job() {
  local peers=$1
  srun --mpi=pmix -n "$n" --overcommit --kill-on-bad-exit=0 sh -c 'exec "$0" "$@" 2>"'"$work"'/agent.$SLURM_JOB_ID.$SLURM_PROCID.log"' \
    "$xagent" --listen 127.0.0.1:0 --loopback --transport tcp --region chase=1M --peers-file "$peers" --workers 1 \
    >>"$work/srun.log" 2>&1 &
  step=$!
  for _ in $(seq 600); do
    [[ -s $peers ]] && break
    kill -0 "$step" 2>/dev/null || { echo "srun exited before the agents met:"; logs; exit 1; }
    sleep 0.05
  done
  [[ -s $peers ]] || { echo "no peers file within 30 s"; logs; exit 1; }
  [[ $(grep -vc '^#' "$peers") -eq $n ]] || { echo "peers file does not list $n agents"; cat "$peers"; exit 1; }
  job=$(squeue -h -o %i | head -1)
  [[ -n $job ]] && jobs+=("$job")
  tasks=$(scontrol listpids "$job" 2>/dev/null | awk 'NR > 1 && $1 ~ /^[0-9]+$/ {print $1}')
  [[ -n $job && -n $tasks ]] || { echo "squeue/scontrol show no job or task"; logs; exit 1; }
}
wait_gone() { # bounded: 10 s; prints the milliseconds since $1
  local since=$1 alive
  for _ in $(seq 200); do
    alive=0
    for p in $tasks; do running "$p" && alive=$((alive + 1)); done
    [[ $alive -eq 0 ]] && break
    sleep 0.05
  done
  [[ $alive -eq 0 ]] || { echo "$alive task processes still running 10 s later"; logs; exit 1; }
  echo $((($(date +%s%N) - since) / 1000000))
}

# 3. N agents meet through PMIx; a client chases across all of them. scancel (SIGTERM to every
#    task) then stops each agent cleanly.
start_job "$work/peers"
cat "$work/peers"
"$chase_job" "$work/peers" --walks 4 --depth 200 || { echo "chase failed"; logs; exit 1; }
cancelled=$(date +%s%N)
scancel "$job"
wait "$step" 2>/dev/null || true
step=
took=$(wait_gone "$cancelled")
for r in $(seq 0 $((n - 1))); do
  grep -q "SIGTERM received, shutting down" "$work/agent.$job.$r.log" || { echo "agent $r did not shut down cleanly on scancel"; logs; exit 1; }
done
echo "srun --mpi=pmix -n $n: agents met and chased correctly; scancel stopped every agent cleanly in ${took} ms"

# 4. Killing the launcher (srun, SIGKILL): Slurm ends the step and no task may be left.
start_job "$work/peers2"
killed=$(date +%s%N)
kill -KILL "$step"
wait "$step" 2>/dev/null || true
step=
took=$(wait_gone "$killed")
echo "srun killed: every task of the step gone ${took} ms later"
