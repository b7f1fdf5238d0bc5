"""supervisor.interpreter.foreign_paths: which sys.path entries came from the
working directory or PYTHONPATH (a private supervisor drops them), as a table."""
from __future__ import annotations

import pytest

from supervisor.interpreter import foreign_paths

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
