"""A manifest file read safely (size cap, no YAML aliases or duplicate keys) and typed access to its keys, errors naming file and key.

A supervisor keeps what it parsed (`parsed`, a directory of its own under
its state root): each entry holds a manifest's text and its document, and
serves that exact text only, parsed by the same parser (manifests/document and
PyYAML's files as they were: a refusal added later is not skipped). A
private supervisor, started by every `run --manifests`, then neither
imports PyYAML (~7 ms) nor parses.
"""
from __future__ import annotations

import functools
import json
import os
import re
import stat
import zlib
from collections.abc import Iterable, Mapping

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any, NoReturn

MAX_MANIFEST_BYTES = 256 * 1024
_KEPT_BYTES = 8 * MAX_MANIFEST_BYTES   # an entry: the text and its document, JSON-escaped
_KEPT_ENTRIES = 256                    # the least recently written go (one per manifest path ever parsed)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")   # what the loader expands (manifests/scalar.writable too)


class ManifestError(ValueError):
    pass


def read(source: str, parsed: str | None = None) -> Any:
    """The YAML document of a manifest file, size-capped, aliases refused;
    parsed: the supervisor's directory of documents it parsed before."""
    try:
        size = os.stat(source).st_size
        if size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{source}: file of {size} bytes exceeds {MAX_MANIFEST_BYTES}")
        with open(source, "rb") as f:
            text = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise ManifestError(f"{source}: {e.strerror}") from None
    entry = None
    decoded = _decoded(text) if parsed is not None else None   # (not UTF-8: parsed each time)
    if parsed is not None and decoded is not None:
        where = zlib.crc32(os.path.abspath(source).encode())
        entry = os.path.join(parsed, f"{os.path.basename(source)}-{where:08x}.json")
        kept = _kept(entry)
        if kept is not None and kept.get("text") == decoded and kept.get("parser") == _parser():
            return kept.get("document")
    from . import document as manifest_yaml
    try:
        document = manifest_yaml.parse(source, text)
    except manifest_yaml.NotYaml as e:
        raise ManifestError(str(e)) from None
    if entry is not None:
        _keep(entry, {"text": decoded, "parser": _parser(), "document": document})
    return document


@functools.cache
def _parser() -> str | None:
    """Which parser: the size and mtime of manifests/document's file and of
    PyYAML's (found, not imported); once a process, which parses with the
    parser it had first."""
    from importlib.machinery import PathFinder
    yaml = PathFinder.find_spec("yaml")
    if yaml is None or yaml.origin is None:
        return None
    try:
        stats = [os.stat(os.path.join(os.path.dirname(__file__), "document.py")), os.stat(yaml.origin)]
    except OSError:
        return None
    return " ".join(f"{st.st_size}:{st.st_mtime_ns}" for st in stats)


def _decoded(text: bytes) -> str | None:
    try:
        return text.decode()
    except UnicodeDecodeError:
        return None


def _kept(entry: str) -> dict[str, Any] | None:
    """An entry written by this uid, as it was written; None for anything else."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > _KEPT_BYTES:
            return None
        kept = json.loads(os.read(fd, _KEPT_BYTES + 1))
        return kept if isinstance(kept, dict) else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _keep(entry: str, kept: dict[str, Any]) -> None:
    """Written whole (a rename) when JSON gives the document back exactly
    (YAML's dates, sets and non-string keys it does not: parsed each time)."""
    if kept["parser"] is None:
        return
    try:
        data = json.dumps(kept)
        if json.loads(data)["document"] != kept["document"]:
            return
    except (TypeError, ValueError):
        return
    partial = f"{entry}.{os.getpid()}"
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as f:
            f.write(data.encode())
        os.replace(partial, entry)
        _prune(os.path.dirname(entry))
    except OSError:
        try:
            os.unlink(partial)
        except OSError:
            pass


def _prune(directory: str) -> None:
    with os.scandir(directory) as it:
        entries = [(e.stat(follow_symlinks=False).st_mtime_ns, e.path) for e in it]
    for _, path in sorted(entries)[:-_KEPT_ENTRIES]:
        try:
            os.unlink(path)
        except OSError:
            pass


class Reader:
    """Typed access to one mapping of a manifest, errors naming file and key."""

    def __init__(self, source: str, data: Any, prefix: str, known: set[str]) -> None:
        self.source, self.prefix = source, prefix
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(prefix.rstrip("."), f"expected a mapping, got {_kind(data)}")
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            self.fail(unknown[0], f"unknown key (known: {', '.join(sorted(known))})")
        self.data = data

    def fail(self, key: str, message: str) -> NoReturn:
        raise ManifestError(f"{self.source}: {self.prefix}{key}: {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        value = self.data.get(key, default)
        if value is None and default is None:
            return None
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # YAML's true is an int to isinstance(); a boolean is never a number here.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            self.fail(key, f"expected {' or '.join(_KIND_NAMES[k] for k in kinds)}, got {_kind(value)}")
        return value

    def strings(self, key: str, default: Iterable[str] = ()) -> list[str]:
        value = self.get(key, list, list(default))
        for i, item in enumerate(value):
            if not isinstance(item, (str, int)) or isinstance(item, bool):
                self.fail(f"{key}[{i}]", f"expected a string, got {_kind(item)}")
        return [str(v) for v in value]

    def mapping(self, key: str) -> dict[str, str]:
        value = self.get(key, dict, {})
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not ENV_NAME.match(k):
                self.fail(f"{key}.{k}", "not a valid variable name")
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                self.fail(f"{key}.{k}", f"expected a string, got {_kind(v)}")
            out[k] = str(v)
        return out


_KIND_NAMES = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
               int: "an integer", float: "a number", type(None): "nothing"}


def _kind(value: Any) -> str:
    return _KIND_NAMES.get(type(value), type(value).__name__)


class Expander:
    """${VAR} from the supervisor's environment (plus STATE_DIR), ~ at the start."""

    def __init__(self, reader: Reader, env: Mapping[str, str]) -> None:
        self.reader, self.env = reader, env

    def __call__(self, key: str, text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in self.env:
                self.reader.fail(key, f"${{{m.group(1)}}} is not set in the supervisor's environment")
            return self.env[m.group(1)]
        text = VARIABLE.sub(sub, text)
        if text == "~" or text.startswith("~/"):
            home = self.env.get("HOME")
            if not home:
                self.reader.fail(key, "~ used but HOME is not set")
            text = home + text[1:]
        return text

    def all_set(self, texts: Iterable[tuple[str, Any]], known: set[str]) -> frozenset[str]:
        """(key, text) pairs: the ${VAR}s they use; fail naming every one that is unset."""
        unset: dict[str, str] = {}
        used = set()
        for key, text in texts:
            for var in VARIABLE.findall(text) if isinstance(text, str) else ():
                used.add(var)
                if var not in self.env and var not in known:
                    unset.setdefault(var, key)
        if len(unset) == 1:
            [(var, key)] = unset.items()
            self.reader.fail(key, f"${{{var}}} is not set in the supervisor's environment")
        if unset:
            where = ", ".join(f"${{{var}}} ({key})" for var, key in unset.items())
            raise ManifestError(f"{self.reader.source}: {where} are not set in the supervisor's environment")
        return frozenset(used)


def port_list(reader: Reader, key: str) -> list[int]:
    value = reader.get(key, list, [])
    for i, port in enumerate(value):
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            reader.fail(f"{key}[{i}]", f"{port!r} is not a port number (0-65535)")
    return value
