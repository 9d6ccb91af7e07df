#!/usr/bin/env bash
# Set up (.venv, project, test extras), lint, then run the test suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The linter first (pyproject.toml's [tool.ruff]): a finding fails the run in a second, before the suite's minutes.
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
