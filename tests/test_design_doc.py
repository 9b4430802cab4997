"""docs/design.md's module list (the code block at its top) names every module, and only modules that exist.

The list is a tree: a folder line (`components/`, `runhealth/`, `  node/`) and, indented under it,
one line per module (`  store.py   what it does`); `a.py, b.py` names two; description lines that
continue an entry are indented past the names. `tree`-style prefixes (`├── `, `│   `, `|-- `,
`` `-- ``) count as indentation, so the block may be drawn either way. A package's `__init__.py`
is covered by its folder's line; a glob (`pages/*.py`) names no module.
"""

from __future__ import annotations

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
