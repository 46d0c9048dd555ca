#!/usr/bin/env bash
# mpirun -n N starts N xagents that meet through PMIx (no --peer, no --self); rank 0 writes the
# peers file; a client connects to all of them in rank order and chases across every agent;
# then mpirun is killed (SIGKILL: it cannot pass anything on) and every agent must stop by
# itself, cleanly, having lost its launcher.
# Usage: mpirun_test.sh XAGENT CHASE_JOB N        Exit 77 (ctest: skipped) without mpirun.
set -euo pipefail
xagent=$1 chase_job=$2 n=${3:-4}
command -v mpirun >/dev/null || { echo "SKIP: no mpirun here (Debian: openmpi-bin)"; exit 77; }

work=$(mktemp -d)
launcher=
cleanup() {
  [[ -n $launcher ]] && kill -KILL "$launcher" 2>/dev/null || true
  for p in ${agents:-}; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

args=(--oversubscribe -n "$n" --bind-to none)
# Open MPI refuses root unless told; containers and CI run as root.
[[ $(id -u) -eq 0 ]] && args+=(--allow-run-as-root)
# Each agent's log in its own file: after mpirun is killed nobody reads its pipes.
mpirun "${args[@]}" sh -c 'exec "$0" "$@" 2>"'"$work"'/agent.$OMPI_COMM_WORLD_RANK.log"' \
  "$xagent" --listen 127.0.0.1:0 --loopback --transport tcp --region chase=1M --peers-file "$work/peers" \
  --workers 1 >"$work/mpirun.log" 2>&1 &
launcher=$!

started=$(date +%s%N)
for _ in $(seq 1200); do
  [[ -s $work/peers ]] && break
  kill -0 "$launcher" 2>/dev/null || { echo "mpirun exited before the agents met:"; cat "$work"/*.log; exit 1; }
  sleep 0.05
done
[[ -s $work/peers ]] || { echo "no peers file within 60 s:"; cat "$work"/*.log; exit 1; }
echo "peers file after $((($(date +%s%N) - started) / 1000000)) ms:"
cat "$work/peers"
lines=$(grep -vc '^#' "$work/peers")
[[ $lines -eq $n ]] || { echo "peers file lists $lines agents, expected $n"; exit 1; }

"$chase_job" "$work/peers" --walks 8 --depth 200 || { echo "chase failed:"; cat "$work"/agent.*.log; exit 1; }

# The agents are mpirun's children (sh exec'd into xagent).
agents=$(pgrep -P "$launcher" || true)
count=$(echo "$agents" | wc -w)
[[ $count -eq $n ]] || { echo "expected $n agent processes under mpirun, found $count: $agents"; ps -ef --forest | tail -20; exit 1; }

kill -KILL "$launcher"
killed=$(date +%s%N)
wait "$launcher" 2>/dev/null || true
launcher=
# Running, not a zombie: orphans wait for init to reap them, which it does on its own schedule.
running() { local s; s=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [[ $s != Z && $s != X ]]; }
# Bounded wait (never a hang); the time it took is reported, the limit is generous.
for _ in $(seq 200); do
  alive=0
  for p in $agents; do running "$p" && alive=$((alive + 1)); done
  [[ $alive -eq 0 ]] && break
  sleep 0.05
done
took=$((($(date +%s%N) - killed) / 1000000))
if [[ $alive -ne 0 ]]; then
  echo "$alive agents still alive 10 s after mpirun was killed"; cat "$work"/agent.*.log; exit 1
fi
echo "all $n agents stopped ${took} ms after mpirun was killed"
for r in $(seq 0 $((n - 1))); do
  log=$work/agent.$r.log
  grep -q "launcher" "$log" && grep -q "shutting down" "$log" || {
    echo "agent $r did not stop through the lost-launcher path:"; cat "$log"; exit 1; }
done
echo "every agent logged the lost launcher and shut down cleanly"
