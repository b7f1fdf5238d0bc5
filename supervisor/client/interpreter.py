"""A fresh interpreter of ours, `python -I -S`: the argv that starts one, in os and sys alone.

The zygote and a private supervisor are such interpreters. -I: neither the
working directory nor PYTHON* variables nor the user's site reach sys.path,
so a `yaml.py` in an MCP client's project directory is not what a private
supervisor imports. -S: no site and its start-up; the directories holding
the modules it needs come on its command line instead, found the way this
process finds them.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence

# What a supervisor imports (its zygote's included): a private one's argv, and
# what provenance checks a root supervisor's non-root uids cannot rewrite.
SUPERVISOR_IMPORTS = ("supervisor", "landlock", "yaml", "prctl", "_prctl")

# argv[1] is how many import directories follow; the code sees argv[0] and
# its own arguments only.
_PROLOGUE = "import sys; n = int(sys.argv[1]); sys.path[:0] = sys.argv[2:2 + n]; del sys.argv[1:2 + n]; "


def import_paths(modules: Iterable[str]) -> list[str]:
    """The directory each module (or package) is imported from: where it
    was, when loaded already, else where this process's import system finds
    it (setuptools' editable import hook included)."""
    out = []
    for name in modules:
        loaded = sys.modules.get(name)
        origin = getattr(loaded, "__file__", None)
        if origin is None:
            origin = _find_origin(name)
        directory = os.path.dirname(os.path.abspath(origin))
        if os.path.basename(origin).startswith("__init__."):
            directory = os.path.dirname(directory)   # a package: the directory holding it
        out.append(directory)
    return list(dict.fromkeys(out))


def foreign_paths(path: Sequence[str], cwd: str, pythonpath: str, ours: str) -> list[str]:
    """The entries of `path` that came from the working directory (what
    `python -m` and `-c` put first: the cwd, or '') or from PYTHONPATH
    (`pythonpath`, as the environment has it), but `ours`, the directory
    holding our own packages (an editable install's checkout, say). Pure:
    tested as a table."""
    given = {os.path.normpath(os.path.join(cwd, p)) for p in pythonpath.split(os.pathsep) if p}
    out = []
    for i, entry in enumerate(path):
        where = os.path.normpath(os.path.join(cwd, entry))
        if where != os.path.normpath(ours) and ((i == 0 and where == os.path.normpath(cwd)) or where in given):
            out.append(entry)
    return out


def foreign_here() -> list[str]:
    """This process's foreign_paths (none when started -I, -E or -P: the
    interpreter put none there)."""
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"   # removed: then no entry is the cwd, and '' imports nothing
    pythonpath = "" if sys.flags.ignore_environment else os.environ.get("PYTHONPATH", "")
    return foreign_paths(sys.path, cwd, pythonpath, import_paths(["supervisor"])[0])


def _find_origin(name: str) -> str:
    """Where the finders of sys.meta_path would import a top-level module
    from, in their order, as `import` asks them: an editable install's
    import hook maps the package to the checkout with no sys.path entry,
    which PathFinder alone never sees. (importlib.util.find_spec would do
    the same but importing it loads contextlib & co: ~3 ms a start.)"""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec(name, None) if find_spec is not None else None
        if spec is not None:
            if spec.has_location:   # not built in, frozen, or a namespace package
                return str(spec.origin)
            break
    raise ImportError(f"no module {name} in a directory", name=name)


def argv(code: str, modules: Iterable[str], args: Sequence[str] = ()) -> list[str]:
    """`python -I -S -c CODE ARGS...` able to import these modules."""
    paths = import_paths(modules)
    return [sys.executable, "-I", "-S", "-c", _PROLOGUE + code, str(len(paths)), *paths, *args]
