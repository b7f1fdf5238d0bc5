"""docs/design.md names every module of landlock/ and supervisor/, and only
those, each under its package's heading; and the packages import one way."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "design.md").read_text()
PACKAGES = ("client", "manifests", "daemon", "zygote", "learn")


def _modules(package: str) -> set[str]:
    root = REPO / package
    return {str(p.relative_to(root))[:-3] for p in root.rglob("*.py")
            if p.name not in ("__init__.py", "__main__.py")}


def _named(section: str) -> set[str]:
    start = re.search(f"^## {re.escape(section)}$", DOC, re.M)
    assert start, section
    end = DOC.find("\n## ", start.end())
    table = DOC[start.end():end if end > 0 else None]
    return set(re.findall(r"^\| `([a-z_/]+)` \|", table, re.M))


def test_every_module_is_in_the_picture():
    assert _named("landlock/") == _modules("landlock")
    named = _named("supervisor/") | {m for p in PACKAGES for m in _named(f"supervisor/{p}/")}
    assert named == _modules("supervisor")
    for package in PACKAGES:
        assert {m for m in _named(f"supervisor/{package}/") if not m.startswith(f"{package}/")} == set(), package


def test_the_packages_are_the_tree():
    """The five packages, and no other directory of modules."""
    found = {p.parent.name for p in (REPO / "supervisor").glob("*/__init__.py")}
    assert found == set(PACKAGES)


def test_the_client_side_it_names_exists():
    """The client side and `run`'s own modules, which tests/unit/test_imports.py allows: real modules."""
    who = DOC[DOC.index("Who imports whom"):]
    who = who[:who.index("\n\n")]
    groups = re.findall(r"\(([^)]*)\)", who)[:2]   # the client side's, run's own
    named = [m for g in groups for m in re.findall(r"`([a-z_.]+)`", g)]
    assert "client.sync" in named and "cli" in named
    ours = {m.replace(".", "/") for m in named if not m.startswith("landlock.")}
    assert ours <= _modules("supervisor") | set(PACKAGES)
    assert {m.split(".", 1)[1] for m in named if m.startswith("landlock.")} <= _modules("landlock")


def _imports_of(module: str) -> set[str]:
    """The modules of supervisor/ that supervisor/MODULE.py imports, wherever in the file (for types too)."""
    import ast
    path = REPO / "supervisor" / f"{module}.py"
    package = module.split("/")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            names = [node.module] if node.module else [a.name for a in node.names]
            found |= {"/".join(base + name.split(".")) for name in names}
    return found & _modules("supervisor")


def test_only_server_knows_all_the_parts():
    """design.md: `daemon/server` is the only module that knows all the parts:
    it imports them; no other module imports two fifths of what it does (at
    606adac `children` imported 12 of server's 25: a second hub)."""
    assert "`daemon/server` is the only module that knows all the parts" in DOC
    parts = _imports_of("daemon/server")
    assert {"daemon/children", "daemon/endings", "daemon/connections", "zygote/process", "daemon/warm",
            "daemon/operations"} <= parts
    for module in _modules("supervisor") - {"daemon/server"}:
        known = _imports_of(module) & parts
        assert len(known) < len(parts) * 2 / 5, (module, sorted(known))
# Each package may import only those below it (docs/design.md, "The packages").
NOT_ABOVE = {
    "client": {"daemon", "manifests", "learn", "zygote"},
    "manifests": {"daemon", "learn", "zygote"},
    "zygote": {"daemon", "learn"},
    "daemon": {"learn"},
}
# A private supervisor's fork enters `serve` (client/private_boot, lazily,
# after the fork): the one import that goes up; it makes no cycle.
ENTRY = ("supervisor.client.private_boot", "supervisor.serve")


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = REPO / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports(path: Path) -> set[str]:
    """The modules of ours `path` imports, lazily too; `if TYPE_CHECKING:` blocks are no import."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    typing_only = {id(node) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for stmt in block.body for node in ast.walk(stmt)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found |= {f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.split(".")[0] == "supervisor"}


def _graph() -> dict[str, set[str]]:
    return {_module(p): imports(p) for p in (REPO / "supervisor").rglob("*.py")}


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in PACKAGES else None


def test_no_package_imports_one_above_it():
    wrong = [(m, t) for m, targets in _graph().items() for t in targets
             if _package(t) in NOT_ABOVE.get(_package(m) or "", set())]
    assert wrong == []


def test_the_rule_would_see_it():
    """The check reads lazy imports, and leaves out only TYPE_CHECKING's."""
    path = REPO / "supervisor" / "client" / "private.py"
    assert "supervisor.client.private_boot" in imports(path)
    assert "supervisor.daemon.policy" not in imports(REPO / "supervisor" / "zygote" / "process.py")   # TYPE_CHECKING


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One chain of imports that comes back to its start, or []."""
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> list[str]:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return []
        for nxt in sorted(graph.get(node, ())):
            found = walk(nxt, path + [node])
            if found:
                return found
        done.add(node)
        return []

    for start in sorted(graph):
        found = walk(start, [])
        if found:
            return found
    return []


def test_no_import_cycle_lazy_ones_included():
    """Package __init__s left out (importing a submodule runs them anyway);
    the private fork's entry into `serve` included."""
    graph = {m: {t for t in targets if t not in ("supervisor", "supervisor.client")}
             for m, targets in _graph().items()}
    assert ENTRY[1] in graph[ENTRY[0]]
    assert _cycle(graph) == []
    back = {**graph, "supervisor.daemon.provenance": graph["supervisor.daemon.provenance"] | {ENTRY[0]}}
    assert _cycle(back) != []   # the check finds one (provenance once imported private_boot back)


def test_the_shared_leaves_import_no_package():
    """errors and protocol, which the client and the daemon both import: nothing of ours but each other."""
    graph = _graph()
    assert graph["supervisor.errors"] == set()
    assert graph["supervisor.protocol"] <= {"supervisor.errors"}
