"""scripts/check_suites.py: every tests/test_*.py must pass a case in the full run, none skipped.

The script runs for real (a subprocess) over tiny JUnit reports and a tiny tests tree.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_suites.py"


def case(module: str, name: str, outcome: str = "") -> str:
    return f'<testcase classname="{module}" name="{name}" time="0.1">{outcome}</testcase>'


def check(tmp_path: Path, cases: list[str], tests_dir: Path | None = None) -> subprocess.CompletedProcess:
    report = tmp_path / "junit.xml"
    report.write_text(f'<testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>')
    argv = [sys.executable, str(SCRIPT), str(report)] + ([str(tests_dir)] if tests_dir else [])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tests/ with two test modules and a helper module that is not a suite."""
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("test_alpha.py", "test_beta.py", "shardgen.py", "conftest.py"):
        (tests / name).write_text("")
    return tests


def test_every_module_passing_a_case_is_green(tmp_path, tree):
    done = check(tmp_path, [case("tests.test_alpha", "a"), case("tests.test_beta.TestB", "b")], tree)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_a_module_missing_from_the_report_fails_and_is_named(tmp_path, tree):
    done = check(tmp_path, [case("tests.test_alpha", "a")], tree)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"required suite passed no test in {tmp_path / 'junit.xml'}: tests.test_beta ({tree / 'test_beta.py'})"
    )


def test_a_module_whose_cases_all_failed_or_were_skipped_fails(tmp_path, tree):
    cases = [
        case("tests.test_alpha", "a"),
        case("tests.test_beta", "b", '<failure message="boom"/>'),
        case("tests.test_beta", "c", '<skipped message="no sshd"/>'),
    ]
    done = check(tmp_path, cases, tree)
    assert done.returncode == 1
    assert "required suite passed no test" in done.stderr and "tests.test_beta" in done.stderr
    assert "skipped (not allowed in the full run): tests.test_beta.c" in done.stderr


def test_the_checkout_requires_every_test_module_of_its_tree(tmp_path):
    # This module's own case alone: every other tests/test_*.py of the checkout is named missing.
    done = check(tmp_path, [case("tests.test_check_suites", "x")])
    named = {line.split(": ", 1)[1].split(" ")[0] for line in done.stderr.splitlines()}
    expected = {f"tests.{p.stem}" for p in (ROOT / "tests").glob("test_*.py")} - {"tests.test_check_suites"}
    assert done.returncode == 1 and named == expected and len(expected) >= 50
