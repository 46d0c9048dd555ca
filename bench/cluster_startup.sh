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

pids=$(pgrep -P "$launcher")
ticks=$(getconf CLK_TCK)
# Idle figures over a quiet window: mean RSS per agent (KiB → MiB), CPU ticks of all agents.
idle() {
  local label=$1 p rss pss cpu1 rss_total=0 pss_total=0 cpu_total=0 count=0
  declare -A cpu0
  sleep 2 # let start-up and the last calls' connections settle
  for p in $pids; do cpu0[$p]=$(awk '{print $14 + $15}' /proc/$p/stat); done
  sleep "$idle_window"
  for p in $pids; do
    rss=$(awk '/^VmRSS/ {print $2}' /proc/$p/status)
    # PSS splits shared pages (libLLVM, UCX) among the processes mapping them.
    pss=$(awk '/^Pss:/ {print $2}' /proc/$p/smaps_rollup 2>/dev/null || echo 0)
    pss_total=$((pss_total + pss))
    cpu1=$(awk '{print $14 + $15}' /proc/$p/stat)
    rss_total=$((rss_total + rss))
    cpu_total=$((cpu_total + cpu1 - ${cpu0[$p]}))
    count=$((count + 1))
  done
  rss_mib=$(awk -v t="$rss_total" -v c="$count" 'BEGIN { printf "%.1f", t / c / 1024 }')
  pss_mib=$(awk -v t="$pss_total" -v c="$count" 'BEGIN { printf "%.1f", t / c / 1024 }')
  cpu_pct=$(awk -v t="$cpu_total" -v hz="$ticks" -v w="$idle_window" 'BEGIN { printf "%.3f", 100 * t / hz / w }')
  idle_ticks=$cpu_total
  echo "idle $label: $count agents, mean RSS ${rss_mib} MiB (PSS ${pss_mib} MiB) per agent, CPU of all agents over ${idle_window} s: ${cpu_total} ticks (${cpu_pct}% of one core)"
}
idle "before any call (no connections)"
fresh_rss=$rss_mib fresh_pss=$pss_mib fresh_ticks=$idle_ticks
"$build/test/cluster/chase_job" "$work/peers" --walks 16 --depth 1000 | tee "$work/chase.txt"
idle "after the chase (every agent linked to its peers)"
if [[ -n $csv ]]; then
  [[ -s $csv ]] || echo "agents,cores,ready_ms,fresh_rss_mib,fresh_pss_mib,fresh_idle_ticks,linked_rss_mib,linked_pss_mib,linked_idle_ticks,idle_window_s,clk_tck,chase" >"$csv"
  echo "$n,$(nproc),$ready_ms,$fresh_rss,$fresh_pss,$fresh_ticks,$rss_mib,$pss_mib,$idle_ticks,$idle_window,$ticks,$(tail -1 "$work/chase.txt" | tr ',' ';')" >>"$csv"
fi
