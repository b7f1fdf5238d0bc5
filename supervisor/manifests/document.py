"""A manifest's text -> its YAML document: PyYAML's safe loader, without aliases or duplicate keys.

Imported only when a manifest is parsed anew: PyYAML is ~7 ms of a private
supervisor's start-up, which a parse the supervisor kept (manifests/file)
spares it.
"""
from __future__ import annotations

import yaml

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any


class NotYaml(ValueError):
    """Text that is not a YAML document we accept; manifests/file makes it a ManifestError
    (not imported here: manifests/file imports this module, lazily, and not the other way)."""


def parse(source: str, text: bytes) -> Any:
    try:
        # Aliases are refused outright: "billion laughs" anchors expand to
        # gigabytes, and no manifest needs them.
        return yaml.load(text, Loader=_SafeNoAliases)
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        # ValueError: a timestamp that is no date, an int of 5,000 digits;
        # RecursionError: nesting thousands deep.
        # One line: PyYAML's own message spans several, with a caret drawing.
        where = " ".join(str(e).split())[:500]
        raise NotYaml(f"{source}: not valid YAML: {type(e).__name__}: {where}") from None


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
