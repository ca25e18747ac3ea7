#!/usr/bin/env bash
# A Sluice group of two vLLM instances on an NVIDIA machine: tokens/s and TTFT p50/p99
# straight to the instances vs through the gateway, measured side by side, and the ratio.
#
#   pip install vllm && bash bench/gpu_vllm.sh [MODEL]      # MODEL: hub id or local dir
#   ROUNDS=3 REQUESTS=64 CONCURRENCY=8 TOKENS=128 bash bench/gpu_vllm.sh
#   JSON=1 bash bench/gpu_vllm.sh                            # one JSON line on stdout
#
# Default model Qwen/Qwen2.5-0.5B-Instruct (fetched by vLLM from the hub; a local model
# directory needs no network). With two GPUs or more each instance gets its own (the pool
# lists devices 0 and 1, so Sluice pins them); with one, both share it at
# GPU_UTIL (default 0.40) of its memory each. `sluice up` runs on a fresh state directory
# on 127.0.0.1; the load (bench/_stream_ab.py) is bounded: ROUNDS x REQUESTS streamed
# requests a side, at most CONCURRENCY at once, TOKENS tokens each (ignore_eos). "direct"
# goes round-robin over both instances, so the ratio is the gateway's cost alone.
# Exit status: 0 measured, 1 failed (the state directory with every log is kept), 2 cannot
# run here (no NVIDIA GPU, no vLLM).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
MODEL=${1:-Qwen/Qwen2.5-0.5B-Instruct}
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-64}
CONCURRENCY=${CONCURRENCY:-8}
TOKENS=${TOKENS:-128}
STARTUP_S=${STARTUP_S:-900}
SERVED=bench-model
KEY=sk-bench-c00397de4384b5bb

say() { echo "gpu_vllm: $*" >&2; }

if ! command -v nvidia-smi >/dev/null 2>&1; then
    say "no NVIDIA GPU here (nvidia-smi not found); this benchmark needs one, with vLLM installed"
    exit 2
fi
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${GPUS:-0}" -lt 1 ]; then
    say "nvidia-smi lists no GPU ($(nvidia-smi -L 2>&1 | head -1)); this benchmark needs one"
    exit 2
fi
if ! command -v vllm >/dev/null 2>&1; then
    say "vllm is not installed (no 'vllm' command on PATH): pip install vllm"
    exit 2
fi
if ! (cd "$ROOT" && "$PYTHON" -c 'import sluice, httpx') 2>/dev/null; then
    say "$PYTHON cannot import sluice: pip install -e $ROOT (or set PYTHON)"
    exit 2
fi
if [ -d "$MODEL" ]; then
    MODEL=$(cd "$MODEL" && pwd)
fi

MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -1)
GPU_GB=$(( ${MIB%%.*} / 1024 ))
if [ "$GPUS" -ge 2 ]; then
    UTIL=${GPU_UTIL:-0.85}
    DEVICES="devices: [0, 1]"
else
    UTIL=${GPU_UTIL:-0.40}
    DEVICES="# one GPU: no devices listed, both instances see it and share its memory"
fi
INSTANCE_GB=$(awk -v g="$GPU_GB" -v u="$UTIL" 'BEGIN { printf "%d", g * u }')

STATE=$(mktemp -d -t sluice-gpu-vllm.XXXXXX)
export SLUICE_HOME="$STATE"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cat >"$STATE/platform.yaml" <<EOF
gateway: {host: 127.0.0.1, port: 0}
pools:
  - name: gpu
    accelerator: nvidia
    count: 2
    memory_gb: $GPU_GB
    $DEVICES
groups:
  - name: vllm
    owner: bench@example.com
    business: bench
    alert_channel: "#bench"
    models:
      $SERVED:
        runtime: command
        command:
          argv: [vllm, serve, "{model_path}", --served-model-name, "{model}",
                 --host, "{host}", --port, "{port}",
                 --max-model-len, "4096", --gpu-memory-utilization, "$UTIL"]
          model_path: "$MODEL"
          health_path: /health
          metrics_path: /metrics
          stop_grace_s: 30
    resources: {pool: gpu, accelerators: 1, memory_gb: $INSTANCE_GB}
    max_concurrency: 256
    replicas: 2
    slow_start_s: 0
    timeout_s: 600
    warmup: {requests: 2, timeout_s: 300}
    health: {interval_s: 5, timeout_s: 5, failure_threshold: 3, startup_timeout_s: $STARTUP_S}
    drain_timeout_s: 30
tenants:
  - {name: bench, api_keys: [$KEY]}
routes:
  - {tag: bench, match: {models: [$SERVED]}, to: vllm}
EOF

UP_PID=""
OK=0
cleanup() {
    if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then
        say "stopping sluice up (it drains and stops both vLLM instances)"
        kill -TERM "$UP_PID" 2>/dev/null || true
        for _ in $(seq 1 120); do
            kill -0 "$UP_PID" 2>/dev/null || break
            sleep 1
        done
        kill -KILL "$UP_PID" 2>/dev/null || true
    fi
    for pid in ${SERVER_PIDS:-}; do  # a server sluice up could not stop in time
        kill -KILL "$pid" 2>/dev/null || true
    done
    if [ "$OK" = 1 ]; then
        rm -rf "$STATE"
    else
        say "logs kept in $STATE (up.log, instances/*.log)"
    fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

say "$GPUS GPU(s) of ${GPU_GB} GiB; 2 vLLM instances of $MODEL at $UTIL of GPU memory each"
cd "$ROOT"
"$PYTHON" -m sluice up -f "$STATE/platform.yaml" --port 0 >"$STATE/up.log" 2>&1 &
UP_PID=$!

deadline=$(( SECONDS + STARTUP_S + 60 ))
until grep -q '^ready: ' "$STATE/up.log"; do
    if ! kill -0 "$UP_PID" 2>/dev/null; then
        say "sluice up exited before it was ready:"; tail -20 "$STATE/up.log" >&2; exit 1
    fi
    if [ "$SECONDS" -gt "$deadline" ]; then
        say "not ready after ${STARTUP_S}s:"; tail -20 "$STATE/up.log" >&2; exit 1
    fi
    sleep 2
done
ENDPOINT=$(sed -n 's/^endpoint: //p' "$STATE/up.log" | head -1)

instances() {
    "$PYTHON" -m sluice get instances --group vllm --json | "$PYTHON" -c '
import json, sys
ready = [i for i in json.load(sys.stdin) if i["state"] == "ready"]
print(" ".join(i["url"] + "|" + str(i["pid"]) for i in ready))'
}
READY=""
until [ "$(wc -w <<<"$READY")" -ge 2 ]; do  # `ready:` means one per group; wait for both
    [ "$SECONDS" -gt "$deadline" ] && { say "only one instance became ready"; exit 1; }
    sleep 2
    READY=$(instances)
done
DIRECT=()
SERVER_PIDS=""
for entry in $READY; do
    DIRECT+=(--direct "${entry%%|*}")
    SERVER_PIDS="$SERVER_PIDS ${entry##*|}"
done
say "ready: gateway $ENDPOINT, instances ${READY//|/ pid }"

"$PYTHON" bench/_stream_ab.py --gateway "$ENDPOINT" "${DIRECT[@]}" --model "$SERVED" \
    --key "$KEY" --rounds "$ROUNDS" --requests "$REQUESTS" --concurrency "$CONCURRENCY" \
    --tokens "$TOKENS" ${JSON:+--json}
OK=1
