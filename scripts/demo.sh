#!/usr/bin/env bash
# Installs what is missing, builds, starts two local agents (one over TCP, one over shared
# memory), ships the example kernels to them and prints results and timings, then the quick
# forms of the ship-latency and pointer-chase benchmarks (they start agents of their own).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default --target xagent xctl bitship-demo ship_latency pointer_chase

export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
run_dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$run_dir"
}
trap cleanup EXIT

# An identity for this demo: the agents authorize its key, the demo client (and the agents,
# forwarding to each other) present it. The benchmarks below make keys of their own.
./build/tools/xctl key generate "$run_dir/id" --name bitship-demo >"$run_dir/authorized_keys"
export BITSHIP_IDENTITY=$run_dir/id

start_agent() { # transport -> prints the port
  local transport=$1
  ./build/agents/xagent --listen 127.0.0.1:0 --transport "$transport" --loopback \
    --authorized-keys "$run_dir/authorized_keys" --port-file "$run_dir/$transport.port" --log-level warn >"$run_dir/$transport.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do [[ -s $run_dir/$transport.port ]] && break; sleep 0.05; done
  [[ -s $run_dir/$transport.port ]] || { cat "$run_dir/$transport.log"; exit 1; }
}
start_agent tcp
start_agent shm

echo "== bitship demo: example kernels shipped to local agents"
./build/examples/bitship-demo --transport tcp --agent "127.0.0.1:$(cat "$run_dir/tcp.port")"
./build/examples/bitship-demo --transport shm --agent "127.0.0.1:$(cat "$run_dir/shm.port")"

echo
echo "== bench/ship_latency (quick): what a call costs"
./build/bench/ship_latency --quick --cold-reps 2

echo
echo "== bench/pointer_chase (quick): RDMA GET per hop vs native handler vs shipped X-RDMA kernel"
./build/bench/pointer_chase --quick --csv "$run_dir/pointer_chase.csv"
