# Sourced by start.sh and test.sh: make the project's .venv and install the project into it.
#
#   ensure_venv dev|base   -> sets VENV_PY to .venv/bin/python, the project installed editable
#
# The venv is made from Debian's /usr/bin/python3 when it exists (else the python3 on PATH), so
# it works the same under the system Python, pyenv or conda, and never touches an "externally
# managed" interpreter. `python3-venv` is installed with apt when venv/ensurepip is missing.
# The install is skipped when a stamp (hash of pyproject.toml and the interpreter version)
# says nothing changed; `base` accepts an existing `dev` install (a superset).

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {  # apt_install PKG... : update the package lists once, then install
  echo "installing $* (apt-get)" >&2
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

make_venv() {
  local py=python3
  [ -x /usr/bin/python3 ] && py=/usr/bin/python3
  if ! "$py" -m venv "$VENV" >/dev/null 2>&1; then
    rm -rf "$VENV"
    apt_install "python3-venv"
    "$py" -m venv "$VENV"
  fi
}

ensure_venv() {
  local extra="$1" hash stamp
  [ -x "$VENV/bin/python" ] || make_venv
  VENV_PY="$VENV/bin/python"
  hash="$( { cat "$REPO/pyproject.toml"; "$VENV_PY" -V; } | sha256sum | cut -d' ' -f1)"
  stamp="$VENV/.runhealth-installed"
  if [ -f "$stamp" ] && { grep -qx "dev $hash" "$stamp" || grep -qx "$extra $hash" "$stamp"; }; then
    return 0
  fi
  local spec="$REPO"
  [ "$extra" = dev ] && spec="$REPO[dev]"
  echo "installing runhealth into $VENV (editable${extra:+, $extra})" >&2
  "$VENV_PY" -m pip install -q --disable-pip-version-check -e "$spec"
  echo "$extra $hash" > "$stamp"
}
