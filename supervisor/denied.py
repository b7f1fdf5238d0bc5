"""Denials as a person reads them: one line each (`landlock-supervisor denials`, and `--session ID` for what a `run` kept: journal.py), a session's summary.

The names in a denial are the server's to choose (its files, its comm):
each is one token (manifests/scalar.token: double-quoted, escaped, where
it is not plain), and every other character that is not printable is
escaped before it reaches a terminal or a log.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping

from .manifests.scalar import token

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

PREFIX = "landlock-supervisor: "


def clean(text: object) -> str:
    """No control character of a server's choosing reaches the reader."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def line(event: Mapping[str, Any], with_manifest: bool = False) -> str:
    """`denied fs.read_file /etc/hostname (pid 12 node): allow with read_only_noexec: [/etc/hostname]`"""
    who = ""
    process = event.get("process")
    if process:
        who = f" (pid {process.get('pid')} {token(str(process.get('comm') or '?'))})"
    where = f"{event.get('manifest')}: " if with_manifest else ""
    # A path or a comm the server chose, one token: its tail cannot pass for our words.
    obj = event.get("object")
    obj = token(str(obj)) if event.get("kind") in ("path", "abstract_unix_socket") else clean(obj)
    text = f"{where}denied {','.join(event.get('rights', []))} {obj}{who}"
    if event.get("allow"):
        text += f": allow with `{clean(event['allow'])}`"
    elif event.get("why_not"):
        text += f" ({clean(event['why_not'])})"
    return text


def summary(name: str, denials: Mapping[str, Any], visibility: Mapping[str, Any]) -> str | None:
    """After the exit: what was not shown, one line; None when nothing was denied."""
    received, shown = denials.get("received", 0), denials.get("shown", 0)
    kernel = denials.get("kernel")
    total = max(kernel or 0, received)
    if not total:
        return None
    parts = [f"{name}: the kernel denied {total} access(es)"]
    if visibility.get("mode") == "count" and not received:
        parts.append("not logged one by one (`serve --audit detail` shows each)")
    else:
        parts.append(f"{shown} shown")
        for key in ("suppressed", "hidden"):
            if denials.get(key):
                parts.append(f"{denials[key]} {key}")
        if kernel is not None and kernel > received:
            parts.append(f"{kernel - received} not received")
    return "; ".join(parts)


def main(args: argparse.Namespace) -> int:
    """`landlock-supervisor denials [--follow] [--json]`, or `--session ID`
    (a `run` session's journal)."""
    if args.session is not None:
        return _session(args.session, args.state_root, args.json)
    from .client import sync as clients
    from .client.paths import SocketPathError
    from .protocol import ProtocolError
    client = clients.Client(args.socket)
    try:
        if args.follow:
            for message in client.follow_denials():
                _show(message, args.json)
        else:
            _show(client.denials(), args.json)
    except SocketPathError as e:   # (a socket path no one may use, or none at all)
        print(PREFIX + str(e), file=sys.stderr)
        return 2
    except ProtocolError as e:
        where = client.socket_path or "its default socket"
        print(f"{PREFIX}the supervisor at {where} sent {e}", file=sys.stderr)   # ("a malformed reply: what")
        return 1
    except (OSError, TimeoutError, clients.SupervisorError) as e:
        print(PREFIX + str(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _show(message: Mapping[str, Any], as_json: bool) -> None:
    if message.get("event") == "denials":
        if as_json:
            print(json.dumps(message, sort_keys=True), flush=True)
            return
        if message.get("mode") == "off":
            print(PREFIX + "denials are not visible: " + clean(message.get("reason", "")), file=sys.stderr)
        lost = message.get("lost") or {}
        if any(v > 0 for v in lost.values()):
            print(PREFIX + "lost: " + ", ".join(f"{k} {v}" for k, v in sorted(lost.items())), file=sys.stderr)
        if message.get("omitted"):
            print(PREFIX + f"{message['omitted']} older denial(s) omitted", file=sys.stderr)
        for event in message.get("recent", []):
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.get("time", 0)))
            print(f"{stamp} pid {event.get('pid')} {line(event, with_manifest=True)}", flush=True)
    elif message.get("event") == "denied":
        if as_json:
            print(json.dumps(message, sort_keys=True), flush=True)
        else:
            print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} pid {message.get('pid')} {line(message, True)}",
                  flush=True)


def _session(session: str, state_root: str | None, as_json: bool) -> int:
    """What the supervisor said of a `run` session's denials, as `run` kept it (journal.py)."""
    from .client import journal
    from .client.paths import default_state_root
    try:
        entries = journal.read(state_root or default_state_root(), session)
    except (OSError, journal.JournalError) as e:
        print(PREFIX + clean(e), file=sys.stderr)
        return 1
    for entry in entries:
        if as_json:
            print(json.dumps(entry, sort_keys=True))
        elif entry.get("event") == "summary":
            print(clean(entry.get("text")))
        else:
            print(clean(f"pid {entry.get('pid')} {line(entry, with_manifest=True)}"))
    return 0
