#!/usr/bin/env bash
# Set up (.venv, project, test extras), then run the test suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
