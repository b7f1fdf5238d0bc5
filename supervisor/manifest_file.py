"""A manifest file read safely (size cap, no YAML aliases or duplicate keys) and typed access to its keys, errors naming file and key."""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

import yaml

MAX_MANIFEST_BYTES = 256 * 1024
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ManifestError(ValueError):
    pass


def read(source: str) -> Any:
    """The YAML document of a manifest file, size-capped, aliases refused."""
    try:
        size = os.stat(source).st_size
        if size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{source}: file of {size} bytes exceeds {MAX_MANIFEST_BYTES}")
        with open(source, "rb") as f:
            text = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise ManifestError(f"{source}: {e.strerror}") from None
    try:
        # Aliases are refused outright: "billion laughs" anchors expand to
        # gigabytes, and no manifest needs them.
        return yaml.load(text, Loader=_SafeNoAliases)
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        # ValueError: a timestamp that is no date, an int of 5,000 digits;
        # RecursionError: nesting thousands deep.
        # One line: PyYAML's own message spans several, with a caret drawing.
        where = " ".join(str(e).split())[:500]
        raise ManifestError(f"{source}: not valid YAML: {type(e).__name__}: {where}") from None


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
        text = _VAR.sub(sub, text)
        if text == "~" or text.startswith("~/"):
            home = self.env.get("HOME")
            if not home:
                self.reader.fail(key, "~ used but HOME is not set")
            text = home + text[1:]
        return text


def port_list(reader: Reader, key: str) -> list[int]:
    value = reader.get(key, list, [])
    for i, port in enumerate(value):
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            reader.fail(f"{key}[{i}]", f"{port!r} is not a port number (0-65535)")
    return value


class _SafeNoAliases(yaml.SafeLoader):
    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases are not allowed", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        # PyYAML keeps the last of two equal keys: a second `sandbox:` would
        # silently replace the first. Refused.
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key_node.value!r}",
                                                            key_node.start_mark)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)
