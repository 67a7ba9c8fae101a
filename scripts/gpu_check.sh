#!/usr/bin/env bash
# GPU check of relaxtune's SGLang backend, on a host with one GPU (< 8 minutes).
# Installs the pinned SGLang into its own venv, serves a small public pair whose
# weights are already on disk or in the HF cache (no hub access needed), and runs
# scripts/gpu_check.py (strict and cactus over SGLang vs AR and the in-process engine;
# sglang_threshold on a STANDALONE speculative server at t = 0.5, N = 4, seeded through
# deterministic inference; zero-round responses, stop tokens, live thresholds).
#   DRAFTER=Qwen/Qwen3-0.6B VERIFIER=Qwen/Qwen3-1.7B GSM8K=path/to/gsm8k_test.jsonl scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DRAFTER=${DRAFTER:-Qwen/Qwen3-0.6B}
VERIFIER=${VERIFIER:-Qwen/Qwen3-1.7B}
GSM8K=${GSM8K:-../shared/data/gsm8k_test.jsonl}
WORK=${WORK:-/tmp/relaxtune-gpu-check}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
mkdir -p "$WORK"

[ -x "$WORK/sgl/bin/python" ] || { python3 -m venv "$WORK/sgl" && "$WORK/sgl/bin/pip" install -q "sglang==0.5.23"; }
[ -x "$WORK/rt/bin/python" ] || { python3 -m venv "$WORK/rt" && "$WORK/rt/bin/pip" install -q -e .; }

start() {  # model port [extra launch flags]
  "$WORK/sgl/bin/python" -m sglang.launch_server --model-path "$1" --host 127.0.0.1 --port "$2" \
    --mem-fraction-static 0.3 --sampling-defaults openai "${@:3}" > "$WORK/server-$2.log" 2>&1 &
  echo $!
}
D_PID=$(start "$DRAFTER" 31000)
V_PID=$(start "$VERIFIER" 31001)
S_PID=$(start "$VERIFIER" 31002 --speculative-draft-model-path "$DRAFTER" --speculative-algorithm STANDALONE \
  --speculative-eagle-topk 1 --speculative-num-steps 4 --speculative-num-draft-tokens 5 \
  --speculative-accept-threshold-single 0.5 --speculative-accept-threshold-acc 0.5 \
  --enable-deterministic-inference)
trap 'kill $D_PID $V_PID $S_PID 2>/dev/null || true' EXIT
for port in 31000 31001 31002; do
  for _ in $(seq 1 150); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 2
  done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null || { tail -50 "$WORK/server-$port.log"; exit 1; }
done
"$WORK/rt/bin/python" scripts/gpu_check.py --drafter "$DRAFTER" --verifier "$VERIFIER" \
  --drafter-url http://127.0.0.1:31000 --verifier-url http://127.0.0.1:31001 \
  --native-url http://127.0.0.1:31002 --gsm8k "$GSM8K"
