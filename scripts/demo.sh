#!/usr/bin/env bash
# Set up, then run the demo: demo corpus if missing, every role up locally, one trainer per rank.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/overlord demo "$@"
