#!/usr/bin/env bash
# Run every test suite on a fresh machine: installs what the tests need (Debian's
# openssh-server, chromium, prometheus and faketime; the project with its dev extra into .venv), lints
# (ruff check, ruff format --check), type-checks (mypy, [tool.mypy] in pyproject.toml), then
# runs pytest in parallel (pytest-xdist; CI's hypothesis profile when CI=true). Fails when a
# test fails, when a required suite is missing, or when anything was skipped.
set -euo pipefail
source "$(dirname "$0")/venv.sh"
cd "$REPO"

missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
[ -x /usr/bin/chromium ] || missing+=(chromium)
{ [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; } || missing+=(prometheus)
[ -x /usr/bin/faketime ] || missing+=(faketime)  # clock steps (tests/test_clock_steps.py)
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "${missing[@]}"
fi
ensure_venv dev

"$VENV_PY" -m ruff check .
"$VENV_PY" -m ruff format --check .
# mypy (the files and settings come from [tool.mypy]) runs beside pytest: on a fresh clone it has
# no cache and takes ~15 s of one core, which the pytest workers (mostly waiting on processes)
# leave free. Its report is printed after pytest's and a type error fails the run as before.
mypy_log="$(mktemp)"
trap 'rm -f "$mypy_log"' EXIT
"$VENV_PY" -m mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
mkdir -p tests/artifacts
set +e
# In parallel (pytest-xdist): most tests wait on processes (sshd, agents, streamlit, Chromium)
# rather than burn CPU, so more workers than cores pay. `--dist loadgroup` keeps each
# `xdist_group` on one worker (the browser tests share one demo server and one Chromium:
# tests/conftest.py). Three: four were ~5% faster when quiet (389 s against 402-457 s), but on two
# cores they left the timing-bound tests (browser checks opening seven live tabs, clock steps)
# failing one or two a run: 5 of 6 fresh-clone runs on 2026-12-07, a different test each time.
# RUNHEALTH_TEST_WORKERS=0 runs in this process; a later `-n` overrides.
"$VENV_PY" -m pytest -n "${RUNHEALTH_TEST_WORKERS:-3}" --dist loadgroup --junitxml=tests/artifacts/junit.xml "$@"
rc=$?
wait "$mypy_pid"
mypy_rc=$?
set -e
echo "mypy: $(tail -n 1 "$mypy_log")"
if [ $mypy_rc -ne 0 ]; then
  cat "$mypy_log" >&2
  exit $mypy_rc
fi
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
[ $rc -eq 0 ] || exit $rc
# With no arguments this is the full run: every suite must have run, none skipped.
if [ $# -eq 0 ]; then
  "$VENV_PY" scripts/check_suites.py tests/artifacts/junit.xml
fi
