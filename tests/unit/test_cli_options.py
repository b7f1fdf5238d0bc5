"""The command line's option names: --socket where a command talks to a
supervisor (and before any command), run's --pass-env and their old spellings."""
from __future__ import annotations

import pytest

from supervisor import cli

_AFTER = {"serve": ["--manifests", "m"], "run": ["x"], "denials": [], "ping": [], "list": [], "stats": [],
          "check": ["m.yaml"], "learn": ["--", "true"]}
_CONNECTING = ("serve", "run", "ping", "list", "stats", "denials")


def _parse(argv: list[str]):
    return cli._parser(cli._command_of(argv)).parse_args(argv)


@pytest.mark.parametrize("command", sorted(_AFTER))
def test_socket_before_any_command(command: str) -> None:
    args = _parse(["--socket", "/s", command, *_AFTER[command]])
    assert args.socket == "/s"


@pytest.mark.parametrize("command", _CONNECTING)
def test_socket_after_a_command_that_connects(command: str) -> None:
    args = _parse([command, "--socket", "/s", *_AFTER[command]])
    assert args.socket == "/s"


@pytest.mark.parametrize("command", sorted(set(_AFTER) - set(_CONNECTING)))
def test_socket_after_a_command_that_does_not_connect_is_not_its_socket(command: str) -> None:
    """Accepted (and unused) until now: kept apart, for main's one warning line."""
    args = _parse([command, "--socket", "/s", *_AFTER[command]])
    assert (args.socket, args.unused_socket) == (None, "/s")


def test_run_pass_env_and_its_old_spelling() -> None:
    args = _parse(["run", "--pass-env", "A", "--env", "B", "x"])
    assert (args.pass_env, args.env) == (["A"], ["B"])
