"""docs/design.md names every module of landlock/ and supervisor/, and only those."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "design.md").read_text()


def _modules(package: str) -> set[str]:
    root = REPO / package
    return {str(p.relative_to(root))[:-3] for p in root.rglob("*.py")
            if p.name not in ("__init__.py", "__main__.py")}


def _named(section: str) -> set[str]:
    start = DOC.index(f"## {section}")
    end = DOC.find("\n## ", start + 1)
    table = DOC[start:end if end > 0 else None]
    return set(re.findall(r"^\| `([a-z_/]+)` \|", table, re.M))


def test_every_module_is_in_the_picture():
    for package in ("supervisor", "landlock"):
        assert _named(f"{package}/") == _modules(package), package


def test_the_client_side_it_names_exists():
    """The client side and `run`'s own modules, which tests/unit/test_imports.py allows: real modules."""
    who = DOC[DOC.index("Who imports whom"):]
    who = who[:who.index("\n\n")]
    groups = re.findall(r"\(([^)]*)\)", who)[:2]   # the client side's, run's own
    named = [m for g in groups for m in re.findall(r"`([a-z_.]+)`", g)]
    assert "client" in named and "cli" in named
    assert {m for m in named if "." not in m} <= _modules("supervisor")
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
    """design.md: `server` is the only module that knows all the parts: it
    imports them; no other module imports two fifths of what it does (at
    606adac `children` imported 12 of server's 25: a second hub)."""
    assert "`server` is the only module that knows all the parts" in DOC
    parts = _imports_of("server")
    assert {"children", "endings", "connections", "zygote/process", "warm", "operations"} <= parts
    for module in _modules("supervisor") - {"server"}:
        known = _imports_of(module) & parts
        assert len(known) < len(parts) * 2 / 5, (module, sorted(known))
