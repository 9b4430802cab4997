"""Fail the full test run when a test module did not pass a case, or a test was skipped.

Every `tests/test_*.py` in the tree is a required suite: each must contribute at least one
passing test case to the JUnit report. The list is read from the tree, not kept by hand, so a
new module is required the day it lands; CI must never go green because sshd or Chromium
quietly went missing, or because a module was left out of the run.

Usage: check_suites.py JUNIT_XML [TESTS_DIR]   (TESTS_DIR: the checkout's tests/ by default)
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"


def required_suites(tests_dir: Path) -> list[str]:
    """`tests.test_x` for every tests/test_x.py."""
    return sorted(f"{tests_dir.name}.{p.stem}" for p in tests_dir.glob("test_*.py"))


def read_report(path: str) -> tuple[dict[str, int], list[str]]:
    """Passing cases per module, and the skipped cases, of a JUnit report."""
    passed: dict[str, int] = {}
    skipped = []
    for case in ET.parse(path).getroot().iter("testcase"):
        suite = case.get("classname", "").split("::")[0]
        module = ".".join(p for p in suite.split(".") if not p[:1].isupper())  # drop test classes
        if case.find("skipped") is not None:
            skipped.append(f"{suite}.{case.get('name')}")
        elif case.find("failure") is None and case.find("error") is None:
            passed[module] = passed.get(module, 0) + 1
    return passed, skipped


def main(path: str, tests_dir: Path = TESTS_DIR) -> int:
    required = required_suites(tests_dir)
    if not required:
        print(f"no test modules (test_*.py) found in {tests_dir}", file=sys.stderr)
        return 1
    passed, skipped = read_report(path)
    missing = [s for s in required if not passed.get(s)]
    for s in missing:
        file = tests_dir / f"{s.rsplit('.', 1)[1]}.py"
        print(f"required suite passed no test in {path}: {s} ({file})", file=sys.stderr)
    for s in skipped:
        print(f"skipped (not allowed in the full run): {s}", file=sys.stderr)
    return 1 if missing or skipped else 0


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.strip().splitlines()[-1])
    sys.exit(main(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) == 3 else TESTS_DIR))
