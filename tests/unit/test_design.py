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
