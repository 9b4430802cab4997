#!/usr/bin/env bash
# Run every test suite on a fresh machine: installs what the tests need (Debian's
# openssh-server and chromium, the Python requirements), lints, then runs pytest.
# Fails when a test fails, when a required suite is missing, or when anything was skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ] || missing+=(prometheus)  # the real-Prometheus test
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing ${missing[*]} (apt-get)" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check -r requirements-dev.txt

python3 -m ruff check .
mkdir -p tests/artifacts
set +e
python3 -m pytest --junitxml=tests/artifacts/junit.xml "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
[ $rc -eq 0 ] || exit $rc
# With no arguments this is the full run: every suite must have run, none skipped.
if [ $# -eq 0 ]; then
  python3 scripts/check_suites.py tests/artifacts/junit.xml
fi
