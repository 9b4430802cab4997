"""docs/design.md's module list (the code block at its top) names every module, and only modules that exist.

The list is a tree: a folder line (`components/`, `runhealth/`, `  node/`) and, indented under it,
one line per module (`  store.py   what it does`); `a.py, b.py` names two; description lines that
continue an entry are indented past the names. `tree`-style prefixes (`├── `, `│   `, `|-- `,
`` `-- ``) count as indentation, so the block may be drawn either way. A package's `__init__.py`
is covered by its folder's line; a glob (`pages/*.py`) names no module.

It checks more than names where it can: a number design.md states beside a constant's name
("`HEARTBEAT_S` (10 s)", "64 MiB (`scan.MAX_LINE_BYTES`)") is the constant's value, and the
README's "How it works" names each module where it is (a bare name is a top-level module of the
core or one of the package named just before it).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
# The code the list must cover: the core package (all depths), the components and the pages.
COVERED = (("runhealth", "**/*.py"), ("components", "*.py"), ("pages", "*.py"))
_TREE_PREFIX = re.compile(r"^[\s│├└┬┼─|`'+\\-]*")
_NAME = r"[A-Za-z_][\w.*]*/?|[A-Za-z_][\w./*]*/?"
_ENTRY = re.compile(rf"^((?:{_NAME})(?:,\s*(?:{_NAME}))*)(?:\s{{2,}}|$)")


def module_list(text: str) -> str:
    """The first fenced code block of design.md: the module list."""
    found = re.search(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    assert found, "docs/design.md has no code block: its module list must be the first ``` block"
    return found.group(1)


def _is_name(token: str) -> bool:
    return token.endswith(("/", ".py"))


def parse_modules(block: str) -> dict[str, str]:
    """{repository path of each named module or folder ('runhealth/node/', 'runhealth/store.py'):
    the folder line it sits under ('' at top level)}."""
    named: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, folder path) of the open folders
    last_indent = 0
    for raw in block.splitlines():
        if not raw.strip():
            continue
        indent = len(_TREE_PREFIX.match(raw).group(0))  # type: ignore[union-attr]  # the pattern matches ""
        rest = raw[indent:]
        entry = _ENTRY.match(rest)
        tokens = [t.strip() for t in entry.group(1).split(",")] if entry else []
        # A description's continuation line sits under the descriptions, far past any name.
        if not tokens or not all(_is_name(t) for t in tokens) or (named and indent > last_indent + 4):
            continue
        last_indent = indent
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        for token in tokens:
            path = token if "/" in token.rstrip("/") else parent + token
            named[path] = parent
            if token.endswith("/"):
                stack.append((indent, path))
    return named


def package_modules() -> set[str]:
    found = set()
    for folder, pattern in COVERED:
        for path in (ROOT / folder).glob(pattern):
            rel = path.relative_to(ROOT)
            if "__pycache__" in rel.parts or "_app" in rel.parts or path.name == "__init__.py":
                continue
            found.add(rel.as_posix())
    return found


def where_to_add(module: str, named: dict[str, str]) -> str:
    """The sentence that tells a maintainer where the missing line goes."""
    parts = module.split("/")
    folders = ["/".join(parts[:i]) + "/" for i in range(1, len(parts))]
    for depth, folder in enumerate(folders):
        if folder not in named:
            parent = folders[depth - 1] if depth else "(the top level)"
            return (
                f"{module}: add a folder line `{'  ' * depth}{parts[depth]}/   <what the package is for>` "
                f"under `{parent}`, then the module's line under it"
            )
    depth = len(parts) - 1
    return f"{module}: add a line `{'  ' * depth}{parts[-1]}   <the one thing it does>` under `{folders[-1]}`"


def test_the_module_list_parser_reads_both_tree_styles():
    """The parser is exercised on a hand-made tree in both drawings (a parser that read nothing
    would let the real test pass on an empty list)."""
    plain = (
        "app.py                the entry\n"
        "runhealth/            core\n"
        "  store.py            SQLite; store.py and node/x.py in a description\n"
        "                      wire.py, continued: a description names nothing\n"
        "  node/               shipped\n"
        "    agent.py            serving\n"
        "  cli.py, __main__.py   commands\n"
        "pages/*.py            one screen each\n"
    )
    drawn = (
        ".\n"
        "├── app.py            the entry\n"
        "└── runhealth/        core\n"
        "    ├── store.py      SQLite\n"
        "    ├── node/         shipped\n"
        "    │   └── agent.py  serving\n"
        "    └── cli.py, __main__.py\n"
    )
    ascii_drawn = drawn.replace("├──", "|--").replace("└──", "`--").replace("│", "|")
    expected = {
        "app.py",
        "runhealth/",
        "runhealth/store.py",
        "runhealth/node/",
        "runhealth/node/agent.py",
        "runhealth/cli.py",
        "runhealth/__main__.py",
        "pages/*.py",
    }
    assert set(parse_modules(plain)) == expected
    for tree in (drawn, ascii_drawn):
        assert set(parse_modules(tree)) == expected - {"pages/*.py"}
        assert parse_modules(tree)["runhealth/node/agent.py"] == "runhealth/node/"


def test_every_module_is_in_the_design_module_list():
    named = parse_modules(module_list(DESIGN.read_text(encoding="utf-8")))
    missing = sorted(package_modules() - set(named))
    where = "\n  ".join(where_to_add(m, named) for m in missing)
    assert not missing, f"docs/design.md's module list (the code block at its top) does not name:\n  {where}"


def test_every_module_the_design_list_names_exists():
    named = parse_modules(module_list(DESIGN.read_text(encoding="utf-8")))
    gone = sorted(p for p in named if "*" not in p and not (ROOT / p).exists())
    listed = "\n  ".join(gone)
    assert not gone, f"docs/design.md's module list names what is not in the tree (renamed or removed?):\n  {listed}"


# -- The numbers design.md states beside a constant's name are the constant's (issue #41 item 5) --
# "`wire.MAX_NOISE_BYTES` (64 KiB)", "`HEARTBEAT_S` (10 s, ...)", "`RATE_WINDOW_S` (60 s)": a name in
# backticks, then a number and unit in parentheses. The name is looked up among the module-level
# constants of runhealth/ (the part before the dot, when there is one, names its module) and its
# value compared with the stated one; a name no module defines, or two modules define differently
# without a module given, fails too, so a renamed constant cannot leave its number behind.
UNITS = {
    "": 1.0,
    "s": 1.0,
    "ms": 1e-3,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "days": 86400.0,
    "%": 0.01,
    "KiB": 1024.0,
    "MiB": 1024.0**2,
}
_NAME_FIRST = (
    r"`(?:(?P<module>[a-z_]+)\.)?(?P<name>[A-Z][A-Z0-9_]{2,})`\s*\((?P<number>\d[\d,]*(?:\.\d+)?)\s*"
    r"(?P<unit>KiB|MiB|min|ms|days|d|h|s|%)?(?=[\s,;)])"
)
# ... or the number first, right before the name: "64 MiB (`scan.MAX_LINE_BYTES`)", "10 (`MIN_TAIL_EVENTS`)".
_NUMBER_FIRST = (
    r"(?<![\w.])(?P<number2>\d[\d,]*(?:\.\d+)?)\s*(?P<unit2>KiB|MiB|min|ms|days|d|h|s|%)?\s*"
    r"\(`(?:(?P<module2>[a-z_]+)\.)?(?P<name2>[A-Z][A-Z0-9_]{2,})`\)"
)
_CLAIM = re.compile(f"{_NAME_FIRST}|{_NUMBER_FIRST}")


def stated_constants(text: str) -> list[tuple[str | None, str, float]]:
    """[(module or None, NAME, value in the constant's unit)] for each "`[module.]NAME` (N unit" or
    "N unit (`[module.]NAME`)" in `text`."""
    flat = " ".join(text.split())  # a claim may wrap onto the next line
    out = []
    for m in _CLAIM.finditer(flat):
        module, name, number, unit = (
            (m["module"], m["name"], m["number"], m["unit"])
            if m["name"]
            else (m["module2"], m["name2"], m["number2"], m["unit2"])
        )
        out.append((module, name, float(number.replace(",", "")) * UNITS[unit or ""]))
    return out


def module_constants() -> dict[str, dict[str, object]]:
    """{NAME: {module path: value}} of every module-level constant (an upper-case NAME assigned at
    the top of a module) of runhealth/, its value as the imported module has it."""
    import ast
    import importlib

    found: dict[str, dict[str, object]] = {}
    for path in sorted((ROOT / "runhealth").rglob("*.py")):
        if "_app" in path.parts:
            continue
        module = path.relative_to(ROOT).with_suffix("").as_posix()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
            target = node.target if isinstance(node, ast.AnnAssign) and node.value is not None else target
            if isinstance(target, ast.Name) and target.id.isupper():
                value = getattr(importlib.import_module(module.replace("/", ".").removesuffix(".__init__")), target.id)
                found.setdefault(target.id, {})[module] = value
    return found


def wrong_claims(claims: list[tuple[str | None, str, float]], constants: dict[str, dict[str, object]]) -> list[str]:
    out = []
    for module, name, stated in claims:
        where = {p: v for p, v in constants.get(name, {}).items() if module is None or p.endswith("/" + module)}
        if not where:
            out.append(f"{module + '.' if module else ''}{name}: no module of runhealth/ defines it")
            continue
        for path, value in where.items():
            if not isinstance(value, int | float) or not math.isclose(float(value), stated, rel_tol=1e-9):
                out.append(f"{name} is stated as {stated:g} but {path}.py has {value!r}")
    return out


def test_stated_constants_are_parsed_and_compared():
    text = (
        "up to `wire.MAX_NOISE_BYTES` (64 KiB) per reply, every `heartbeat.HEARTBEAT_S` (10 s, on the\n"
        "monotonic clock); a minute, `RATE_WINDOW_S` (60 s), `COST_SHARE` (2%) and `MIN_LOOP_SAMPLES` (20);\n"
        "fewer than 10 (`MIN_TAIL_EVENTS`), a line longer than 64 MiB (`scan.MAX_LINE_BYTES`)"
    )
    claims = stated_constants(text)
    assert claims == [
        ("wire", "MAX_NOISE_BYTES", 65536.0),
        ("heartbeat", "HEARTBEAT_S", 10.0),
        (None, "RATE_WINDOW_S", 60.0),
        (None, "COST_SHARE", 0.02),
        (None, "MIN_LOOP_SAMPLES", 20.0),
        (None, "MIN_TAIL_EVENTS", 10.0),
        ("scan", "MAX_LINE_BYTES", 64.0 * 1024**2),
    ]
    constants = module_constants()
    assert wrong_claims(claims, constants) == []
    # Planted: a stale number, a constant that moved away, a name nothing defines.
    assert wrong_claims([(None, "RATE_WINDOW_S", 120.0)], constants) == [
        "RATE_WINDOW_S is stated as 120 but runhealth/settings/windows.py has 60.0"
    ]
    assert wrong_claims([("collect", "HEARTBEAT_S", 10.0)], constants) == [
        "collect.HEARTBEAT_S: no module of runhealth/ defines it"
    ]
    assert len(wrong_claims(stated_constants("`NO_SUCH_LIMIT_S` (5 s)"), constants)) == 1


def test_the_numbers_design_states_beside_constants_are_the_code_s():
    claims = stated_constants(DESIGN.read_text(encoding="utf-8"))
    assert len(claims) >= 10, claims  # the claims are found at all (a parser that read none would pass)
    wrong = wrong_claims(claims, module_constants())
    assert wrong == [], "docs/design.md states numbers the code no longer has:\n  " + "\n  ".join(wrong)


# -- The README's "How it works" names modules where they are -------------------------------------
def how_it_works_names(readme: str) -> list[tuple[str, str | None]]:
    """[(name, the package last named before it)] of the backticked module names in README's
    "How it works": `collect/` or `node/agent` (paths), `ingest` (a bare module name)."""
    section = readme.split("## How it works", 1)[1].split("\n## ", 1)[0]
    out, package = [], None
    for token in re.findall(r"`([^`]+)`", section):
        if not re.fullmatch(r"[a-z_][a-z_/.]*", token) or (token.count(".") and not token.endswith(".py")):
            continue  # st.navigation, render(rt): not a module
        out.append((token, package))
        if token.endswith("/"):
            package = token.rstrip("/").split("/")[-1]
    return out


def misplaced(names: list[tuple[str, str | None]]) -> list[str]:
    core = ROOT / "runhealth"
    wrong = []
    for token, package in names:
        path = token.rstrip("/")
        if "/" in token or token.endswith(".py"):
            ok = any((base / p).exists() for base in (ROOT, core) for p in (path, path + ".py"))
        else:  # a bare name: a top-level module or package of the core, or one of the package just named
            places = [core, core / package] if package else [core]
            ok = any((d / f"{token}.py").exists() or (d / token).is_dir() for d in places)
        if not ok:
            wrong.append(f"`{token}`" + (f" (after `{package}/`)" if package and "/" not in token else ""))
    return wrong


def test_misplaced_module_names_are_found():
    planted = (
        "## How it works\n\n`config` → `remote/` → `collector` → `analysis/` (`stats`, `health`) → `collect/ingest`\n"
    )
    assert misplaced(how_it_works_names(planted)) == [
        "`config`",
        "`collector` (after `remote/`)",
        "`health` (after `analysis/`)",
        "`collect/ingest`",
    ]


def test_the_readme_how_it_works_names_modules_where_they_are():
    names = how_it_works_names((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(names) >= 10, names
    assert misplaced(names) == []
