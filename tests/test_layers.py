"""The layers pages -> components -> runhealth are a lint rule, not a convention.

ruff's flake8-tidy-imports banned-api (TID251) holds them: runhealth/ may not import Streamlit or
plotly (pyproject.toml), pages/ may not import the store, the collector or the node transports
(pages/ruff.toml). Each case lints a planted import under the path it would have (stdin, nothing
written), so a config change that silently stops a ban fails here.

Modules talk through public names: ruff's SLF001 bars `obj._private` outside the class that owns
it, and an AST walk here bars `from module import _private` (ruff's own rule for that is preview).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def lint(path: str, source: str, rule: str = "TID251") -> str:
    """ruff's findings (for `rule`) on `source` as if it were the file `path` of this checkout."""
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
            rule,
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
        "import runhealth.collect.collector\n",
        "from runhealth.collect.collector import Collector\n",
        "from runhealth.remote import ssh\n",
        "from runhealth import remote\n",
        "from runhealth.remote.base import Transport\n",
        "import runhealth.remote.ssh\n",
        # A page lays out its screen model: it does not ask the rules again (issue 31).
        "from runhealth.rules import hardware\n",
        "from runhealth.rules.hardware import HW_THROTTLE\n",
        "from runhealth.rules.health import node_status\n",
        "import runhealth.rules.activity\n",
        # Output lengths and Samples lay out their models too (runhealth.screens.lengths, .samples).
        "from runhealth.analysis import stats\n",
        "from runhealth.analysis.whatif import WhatIf\n",
        "import runhealth.analysis.loops\n",
    ],
)
def test_pages_may_not_reach_the_data_layer(source):
    assert "TID251" in lint("pages/planted.py", source), source


@pytest.mark.parametrize("source", ["import streamlit as st\n", "import plotly.graph_objects as go\n"])
def test_the_core_may_not_import_streamlit_or_plotly(source):
    assert "TID251" in lint("runhealth/planted.py", source), source
    assert "TID251" not in lint("pages/planted.py", source), source  # the UI layers use them by design


# components/ reach the rules and the analysis through the screen models only, the loaders excepted
# (components/ruff.toml, issue #41): a card shows the number a model decided, it does not decide it.
@pytest.mark.parametrize(
    "source",
    [
        "from runhealth.rules.health import node_status\n",
        "from runhealth.rules import hardware\n",
        "import runhealth.rules.activity\n",
        "from runhealth.analysis import stats\n",
        "from runhealth.analysis.whatif import WhatIf\n",
        "import runhealth.analysis.continuation\n",
    ],
)
def test_components_reach_the_rules_and_analysis_only_through_the_screen_models(source):
    assert "TID251" in lint("components/planted.py", source), source
    assert "TID251" in lint("components/tables.py", source), source  # an existing module is no exception
    assert "TID251" not in lint("components/loaders.py", source), source  # the cached reads compute on demand


def test_components_may_use_the_store_and_pages_the_components():
    assert "TID251" not in lint("components/planted.py", "from runhealth.store import Store\nimport streamlit\n")
    assert "TID251" not in lint("components/planted.py", "import plotly.graph_objects as go\n")
    assert "TID251" not in lint("components/planted.py", "from runhealth.screens.lengths import Summary, WhatIf\n")
    assert "TID251" not in lint(
        "pages/planted.py", "from components import loaders\nfrom runhealth.screens.lengths import Summary\n"
    )


def test_the_checkout_itself_keeps_the_layers():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "TID251,SLF001", "."],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# What the store-hosted tables' owners did before Store.transaction/query/cursor were public.
REACHES = [
    "from runhealth.store import Store\n\ndef f(store: Store):\n    return store._rows('SELECT 1')\n",
    "from runhealth.store import rollup\n\ndef f(store):\n    return rollup._has_rollups(store)\n",
    "class Exporter:\n    def f(self):\n        with self.store._tx() as db:\n            db.execute('SELECT 1')\n",
]


@pytest.mark.parametrize("source", REACHES)
@pytest.mark.parametrize("path", ["runhealth/planted.py", "components/planted.py", "pages/planted.py", "app.py"])
def test_no_module_reaches_into_another_modules_privates(path, source):
    assert "SLF001" in lint(path, source, "SLF001"), (path, source)


def test_a_class_may_use_its_own_privates():
    own = "class Hist:\n    def __init__(self):\n        self._counts = {}\n\n    def merge(self, other: Hist):\n"
    assert "SLF001" not in lint("runhealth/planted.py", own + "        return other._counts\n", "SLF001")


def private_imports(source: str) -> list[str]:
    """`from x import _name` of a first-party module's private name (dunders such as __version__ are public)."""
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("runhealth", "components")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_private_imports_are_found():
    assert private_imports("from runhealth.remote.base import _POLL_SLICE_S, Transport\n") == [
        "runhealth.remote.base._POLL_SLICE_S"
    ]
    assert private_imports("from runhealth import __version__\nfrom typing import _T\n") == []


def test_the_checkout_imports_no_private_names():
    files = [ROOT / "app.py", *(p for d in ("runhealth", "components", "pages") for p in (ROOT / d).rglob("*.py"))]
    found = {str(p.relative_to(ROOT)): private_imports(p.read_text()) for p in files}
    assert {k: v for k, v in found.items() if v} == {}


# Inside the core, the low modules stay low: the config (read by every process, the node-side
# checks included) never pulls in the rules engine and the store, and ingest (what the store
# writes) never reaches up into the analysis it feeds. Checked over what each one imports,
# transitively, in a fresh interpreter: a re-export three modules away counts too.
LOW_MODULES = {
    "runhealth.settings.config": ("runhealth.rules", "runhealth.store"),
    "runhealth.ingest": ("runhealth.analysis",),
    "runhealth.store": ("runhealth.analysis",),  # the store is below the numbers computed from it (#31)
    "runhealth.settings.windows": ("runhealth.",),
}


def imported_by(module: str) -> set[str]:
    """Every module loaded by `import module` in a fresh interpreter."""
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.parametrize("module,banned", sorted(LOW_MODULES.items()))
def test_low_core_modules_do_not_import_up(module, banned):
    parents = {module.rsplit(".", k)[0] for k in range(1, module.count("."))}  # its packages' __init__
    loaded = imported_by(module) - {module} - parents
    assert [m for m in sorted(loaded) if m.startswith(banned)] == []


# No import cycle in the package: each module's imports at load time (module level, outside
# `if TYPE_CHECKING:`), resolved to the package's own modules, walked with ast. Importing a.b.c
# runs a/__init__ and a/b/__init__ first, so those count too, except for a package's own
# modules (its __init__ importing its submodules is how a package is put together).
def module_names(root: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def load_time_imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        [*package.split(".")[: len(package.split(".")) - node.level + 1], *[base] * bool(base)]
                    )
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for part in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, part, []):
                        visit(child.body if isinstance(child, ast.ExceptHandler) else [child])

    visit(ast.parse(path.read_text()).body)
    edges = set()
    for target in found:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            mod = ".".join(parts[:i])
            if mod in known and mod != name and not name.startswith(mod + "."):
                edges.add(mod)
    return edges


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def package_graph() -> dict[str, set[str]]:
    modules = module_names(ROOT / "runhealth")
    return {name: load_time_imports(name, path, set(modules)) for name, path in modules.items()}


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = package_graph()
    assert (
        "runhealth.store.writes" in graph["runhealth.collect.collector"]
        or "runhealth.store" in graph["runhealth.collect.collector"]
    )
    planted = {
        **graph,
        "runhealth.store.migrations": graph["runhealth.store.migrations"] | {"runhealth.collect.collector"},
    }
    assert any("runhealth.store.migrations" in c and "runhealth.collect.collector" in c for c in import_cycles(planted))


def test_the_package_has_no_import_cycle():
    assert import_cycles(package_graph()) == []


# The packages form a graph without cycles too (issue #41): runhealth.collect, runhealth.store, ...
# are its nodes (a subfolder of runhealth/ is one node, a top-level module is its own), and an
# import of any module of one by any module of another is an edge. A module-level walk misses a
# two-way pair whose modules each go one way (the store's writes importing collect/ingest while
# collect/collector imports the store): each package's contract must sit below the ones it uses.
def package_of(module: str) -> str:
    """`runhealth.collect.collector` -> `runhealth.collect`; `runhealth.demo` -> itself."""
    return ".".join(module.split(".")[:2])


def packages_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, imports in graph.items():
        own = package_of(module)
        out.setdefault(own, set()).update(package_of(m) for m in imports if package_of(m) != own)
    return out


def test_the_package_graph_is_read_at_package_level():
    packages = packages_graph(package_graph())
    assert {"runhealth.collect", "runhealth.store", "runhealth.screens", "runhealth.demo"} <= set(packages)
    assert "runhealth.store" in packages["runhealth.collect"]
    assert not any(p.count(".") > 1 for p in packages)  # runhealth.collect.collector is folded into its package


@pytest.mark.parametrize(
    "importer,imported",
    [
        # What each of the five two-way pairs of issue #41 was: a module-level walk saw no cycle.
        ("runhealth.store.writes", "runhealth.collect.ingest"),
        ("runhealth.rules.health", "runhealth.collect.heartbeat"),
        ("runhealth.demo", "runhealth.collect.collector"),
        # A longer loop: the screens import the store, so the store may not reach the screens.
        ("runhealth.store.reads", "runhealth.screens.words"),
    ],
)
def test_a_planted_package_cycle_is_found(importer, imported):
    graph = package_graph()
    planted = {**graph, importer: graph[importer] | {imported}}
    assert import_cycles(packages_graph(graph)) == []  # the plant, not the checkout, makes the cycle
    cycles = import_cycles(packages_graph(planted))
    assert any(package_of(importer) in c and package_of(imported) in c for c in cycles), cycles


def test_the_packages_import_each_other_in_one_direction_only():
    cycles = import_cycles(packages_graph(package_graph()))
    assert cycles == [], f"packages that import each other (directly or around a loop): {cycles}"


# Two modules never share a name (STYLE.md): `compare` meant three things (issue #41). One pairing
# is the layout itself: a page and its screen model (pages/gpus.py lays out runhealth/screens/gpus.py).
PAGE_AND_MODEL = ("pages", "runhealth/screens")


def shared_names(paths: list[str]) -> dict[str, list[str]]:
    """{file name: its paths} for names more than one module has, a page beside its model excepted."""
    by_name: dict[str, list[str]] = {}
    for path in sorted(paths):
        if not path.endswith("/__init__.py"):
            by_name.setdefault(path.rsplit("/", 1)[-1], []).append(path)
    return {
        name: found
        for name, found in by_name.items()
        if len(found) > 1 and sorted(p.rsplit("/", 1)[0] for p in found) != sorted(PAGE_AND_MODEL)
    }


def test_shared_names_are_found():
    assert shared_names(["runhealth/analysis/compare.py", "pages/compare.py", "runhealth/screens/compare.py"]) == {
        "compare.py": ["pages/compare.py", "runhealth/analysis/compare.py", "runhealth/screens/compare.py"]
    }
    assert shared_names(["runhealth/alerting/alerthistory.py", "components/alerthistory.py"]) != {}
    assert shared_names(["pages/gpus.py", "runhealth/screens/gpus.py", "runhealth/store/__init__.py"]) == {}


def test_no_two_modules_share_a_name():
    files = [ROOT / "app.py", *(p for d in ("runhealth", "components", "pages") for p in (ROOT / d).rglob("*.py"))]
    assert shared_names([str(p.relative_to(ROOT)) for p in files if "_app" not in p.parts]) == {}
