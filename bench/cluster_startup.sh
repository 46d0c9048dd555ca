#!/usr/bin/env bash
# N agents under mpirun on this machine (default 32): time from `mpirun` to the last agent
# ready (rank 0 writes the peers file only after the PMIx fence, i.e. once every agent listens),
# a checked chase across all N, then resident memory per idle agent and CPU used by idle agents
# over a quiet window. Prints the configuration and the figures; --csv FILE appends a row.
# Usage: bench/cluster_startup.sh BUILD_DIR [N] [--csv FILE]
set -euo pipefail
build=${1:?usage: cluster_startup.sh BUILD_DIR [N] [--csv FILE]}
n=${2:-32}
csv=
[[ ${3:-} == --csv ]] && csv=${4:?--csv needs a file}
idle_window=${BITSHIP_IDLE_SECONDS:-5}
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}

work=$(mktemp -d)
launcher=
cleanup() { [[ -n $launcher ]] && kill -TERM "$launcher" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
args=(--oversubscribe -n "$n" --bind-to none)
[[ $(id -u) -eq 0 ]] && args+=(--allow-run-as-root)

echo "config: $n agents under $(mpirun --version | head -1), $(nproc) cores, --workers 1, transport tcp, chase=1M regions"
t0=$(date +%s%N)
mpirun "${args[@]}" sh -c 'exec "$0" "$@" 2>"'"$work"'/agent.$OMPI_COMM_WORLD_RANK.log"' \
  "$build/agents/xagent" --listen 127.0.0.1:0 --loopback --transport tcp --region chase=1M --workers 1 \
  --peers-file "$work/peers" >"$work/mpirun.log" 2>&1 &
launcher=$!
while [[ ! -s $work/peers ]]; do
  kill -0 "$launcher" 2>/dev/null || { cat "$work"/*.log; exit 1; }
  (( ($(date +%s%N) - t0) / 1000000000 < 120 )) || { echo "no peers file in 120 s"; exit 1; }
  sleep 0.01
done
ready_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "start-up: mpirun to last agent ready (peers file written): ${ready_ms} ms"

"$build/test/cluster/chase_job" "$work/peers" --walks 16 --depth 1000 | tee "$work/chase.txt"
pids=$(pgrep -P "$launcher")
sleep 1 # let the chase's connections settle
declare -A cpu0
for p in $pids; do cpu0[$p]=$(awk '{print $14 + $15}' /proc/$p/stat); done
sleep "$idle_window"
ticks=$(getconf CLK_TCK)
rss_total=0 cpu_total=0 count=0
for p in $pids; do
  rss=$(awk '/^VmRSS/ {print $2}' /proc/$p/status)
  cpu1=$(awk '{print $14 + $15}' /proc/$p/stat)
  rss_total=$((rss_total + rss))
  cpu_total=$((cpu_total + cpu1 - ${cpu0[$p]}))
  count=$((count + 1))
done
rss_mib=$(awk -v t="$rss_total" -v c="$count" 'BEGIN { printf "%.1f", t / c / 1024 }')
cpu_pct=$(awk -v t="$cpu_total" -v hz="$ticks" -v w="$idle_window" 'BEGIN { printf "%.3f", 100 * t / hz / w }')
echo "idle: $count agents, mean RSS ${rss_mib} MiB per agent, CPU of all idle agents over ${idle_window} s: ${cpu_total} ticks (${cpu_pct}% of one core)"
if [[ -n $csv ]]; then
  [[ -s $csv ]] || echo "agents,cores,ready_ms,rss_mib_per_agent,idle_cpu_ticks,idle_window_s,chase" >"$csv"
  echo "$n,$(nproc),$ready_ms,$rss_mib,$cpu_total,$idle_window,$(tail -1 "$work/chase.txt" | tr ',' ';')" >>"$csv"
fi
