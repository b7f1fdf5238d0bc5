"""A manifest loaded from a few lines of YAML, as a root supervisor (or a
user's own) would load it: for the tables of tests/unit."""
from __future__ import annotations

from pathlib import Path

from supervisor.manifests.manifest import Manifest, load

DYNAMIC_UID = 1879048198


def load_text(tmp_path: Path, text: str, as_root: bool = True) -> Manifest:
    path = tmp_path / "m.yaml"
    path.write_text("command: /bin/true\n" + text)
    return load(path, env={}, state_root=str(tmp_path / "state"), as_root=as_root,
                dynamic_uid=lambda name: DYNAMIC_UID)
