#!/usr/bin/env bash
# Start the dashboard on http://127.0.0.1:8501 — the built-in demo run when no runhealth.toml
# (or RUNHEALTH_CONFIG) is configured. Installs the Python requirements on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import streamlit, paramiko, plotly, pandas, prometheus_client, pynvml" 2>/dev/null; then
  python3 -m pip install -q -r requirements.txt
fi
exec python3 -m streamlit run app.py "$@"
