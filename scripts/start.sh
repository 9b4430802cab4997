#!/usr/bin/env bash
# Start the dashboard on http://127.0.0.1:8501: `runhealth dashboard` from the project's .venv
# (made and filled on first use). Config lookup happens in the directory you run this from:
# --config, then $RUNHEALTH_CONFIG, then ./runhealth.toml; none -> the built-in demo run.
#   ./scripts/start.sh [--config F] [--port N] [--address A] [--no-collect]
set -euo pipefail
source "$(dirname "$0")/venv.sh"
ensure_venv base
exec "$VENV/bin/runhealth" dashboard "$@"
