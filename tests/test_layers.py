"""The layers pages -> components -> runhealth are a lint rule, not a convention.

ruff's flake8-tidy-imports banned-api (TID251) holds them: runhealth/ may not import Streamlit or
plotly (pyproject.toml), pages/ may not import the store, the collector or the node transports
(pages/ruff.toml). Each case lints a planted import under the path it would have (stdin, nothing
written), so a config change that silently stops a ban fails here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def lint(path: str, source: str) -> str:
    """ruff's findings for `source` as if it were the file `path` of this checkout."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--output-format",
            "concise",
            "--select",
            "TID251",
            "--stdin-filename",
            path,
            "-",
        ],
        input=source,
        text=True,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


@pytest.mark.parametrize(
    "source",
    [
        "from runhealth.store import Store\n",
        "from runhealth import store\n",
        "import runhealth.collector\n",
        "from runhealth.collector import Collector\n",
        "from runhealth.remote import ssh\n",
        "from runhealth import remote\n",
        "from runhealth.remote.base import Transport\n",
        "import runhealth.remote.ssh\n",
    ],
)
def test_pages_may_not_reach_the_data_layer(source):
    assert "TID251" in lint("pages/planted.py", source), source


@pytest.mark.parametrize("source", ["import streamlit as st\n", "import plotly.graph_objects as go\n"])
def test_the_core_may_not_import_streamlit_or_plotly(source):
    assert "TID251" in lint("runhealth/planted.py", source), source
    assert "TID251" not in lint("pages/planted.py", source), source  # the UI layers use them by design


def test_components_may_use_the_store_and_pages_the_components():
    assert "TID251" not in lint("components/planted.py", "from runhealth.store import Store\nimport streamlit\n")
    assert "TID251" not in lint(
        "pages/planted.py", "from components import loaders\nfrom runhealth.analysis import stats\n"
    )


def test_the_checkout_itself_keeps_the_layers():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "TID251", "."],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
