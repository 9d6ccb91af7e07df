#!/usr/bin/env bash
# Create or reuse .venv and install the project with its test extras.
# torch stays on the local CPU build through constraints.txt (an unpinned torch pulls GBs of CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,hf,megatron,torchtitan-light,lightning]'
  # torchtitan itself without its wandb/tensorboard/datasets dependencies (~250 MB the adapter's tests do not use)
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps 'torchtitan==0.3.0'
  touch "$stamp"
fi
