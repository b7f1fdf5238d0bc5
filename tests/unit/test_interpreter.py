"""supervisor.client.interpreter: import_paths finds our modules however they were
installed (an editable install's import hook, setuptools' default mode, maps
a package to the checkout with no sys.path entry; PathFinder alone missed
it, and every fresh interpreter of ours died with `no module landlock`);
foreign_paths says which sys.path entries came from the working directory or
PYTHONPATH (a private supervisor drops them), as a table."""
from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec

import pytest

from supervisor.client import interpreter
from supervisor.client.interpreter import foreign_paths


class _HookFinder:
    """What setuptools' `__editable___*_finder` is to import: a meta path
    finder mapping a name to a file outside sys.path."""

    def __init__(self, name: str, origin: str) -> None:
        self.name, self.origin = name, origin

    def find_spec(self, fullname: str, path: object, target: object = None) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = ModuleSpec(fullname, None, origin=self.origin, is_package=True)
        spec.has_location = True
        return spec


@pytest.fixture
def hooked(tmp_path, monkeypatch):
    package = tmp_path / "checkout" / "hooked_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "meta_path", [_HookFinder("hooked_pkg", str(package / "__init__.py")), *sys.meta_path])
    return tmp_path / "checkout"


def test_a_package_behind_an_import_hook(hooked):
    assert interpreter.import_paths(["hooked_pkg"]) == [str(hooked)]


def test_a_module_on_sys_path_and_one_loaded(hooked, tmp_path, monkeypatch):
    """PathFinder's answers still come, in the order asked, without duplicates."""
    import os

    import yaml
    on_path = tmp_path / "on_path"
    on_path.mkdir()
    (on_path / "plain_mod.py").write_text("")
    monkeypatch.syspath_prepend(str(on_path))
    site = os.path.dirname(os.path.dirname(yaml.__file__))
    assert interpreter.import_paths(["plain_mod", "yaml", "hooked_pkg", "plain_mod"]) == \
        [str(on_path), site, str(hooked)]


@pytest.mark.parametrize("name", ["no_such_module_anywhere", "sys", "_imp"])
def test_none_or_not_in_a_directory(name):
    with pytest.raises(ImportError, match=name):
        interpreter.import_paths([name])


SITE = ["/usr/lib/python3.11", "/venv/lib/python3.11/site-packages"]

TABLE = [
    # (sys.path, cwd, PYTHONPATH, our packages' directory) -> foreign entries
    (["/venv/bin", *SITE], "/project", "", "/venv/lib/python3.11/site-packages", []),   # the console script
    (["/project", *SITE], "/project", "", "/repo", ["/project"]),                        # python -m, from /project
    (["", *SITE], "/project", "", "/repo", [""]),                                        # python -c
    (["/repo", *SITE], "/repo", "", "/repo", []),                                        # python -m in our checkout
    (["/venv/bin", "/pp", "/pp2", *SITE], "/x", "/pp:/pp2", "/repo", ["/pp", "/pp2"]),   # PYTHONPATH
    (["/venv/bin", "/x/rel", *SITE], "/x", "rel", "/repo", ["/x/rel"]),                 # a relative entry, made absolute
    (["/venv/bin", "/pp", *SITE], "/x", "/pp/", "/repo", ["/pp"]),                      # a trailing slash
    (["/venv/bin", "/repo", *SITE], "/x", "/repo", "/repo", []),                         # PYTHONPATH naming our own
    (["/venv/bin", *SITE, "/project"], "/project", "", "/repo", []),                    # the cwd, not first: a site entry
    (["/venv/bin", *SITE], "/project", "::", "/repo", []),                              # empty PYTHONPATH entries
]


@pytest.mark.parametrize("path,cwd,pythonpath,ours,expected", TABLE)
def test_foreign_paths(path: list[str], cwd: str, pythonpath: str, ours: str, expected: list[str]) -> None:
    assert foreign_paths(path, cwd, pythonpath, ours) == expected
