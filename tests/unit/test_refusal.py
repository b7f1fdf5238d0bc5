"""supervisor.manifests.refusal.why_not: the one table of what no proposal names
(learn's grants, the denial lines' "allow with"), as a table."""
from __future__ import annotations

import pytest

from supervisor.manifests import refusal

KNOWN = refusal.known(
    homes=["/root", "/home/ann", "/srv/home/bob", "/var/lib/svc-home", None, "", "/"],   # passwd's, $HOME, servers'
    own=["/srv/llsv-state", "/srv/llsv-state/parsed", "/run/user/1000/landlock-supervisor"])

TABLE = [
    # path -> refused (the reason's first word), or None: proposed
    ("/", "the whole filesystem"),
    ("/root", "a whole home directory"),
    ("/home/ann", "a whole home directory"),
    ("/home/ann/", "a whole home directory"),
    ("/srv/home/bob", "a whole home directory"),            # a home passwd does not list ($HOME, a server's)
    ("/var/lib/svc-home", "a whole home directory"),
    ("/home", "a directory holding home directories"),
    ("/srv/home", "a directory holding home directories"),
    ("/srv", "a directory holding home directories"),
    ("/home/ann/projects/x", None),                         # inside a home: proposed
    ("/home/ann/.ssh/id_ed25519", "a location holding secrets"),
    ("/srv/home/bob/.ssh/id_test", "a location holding secrets"),
    ("/opt/elsewhere/.ssh/id_rsa", "a location holding secrets"),     # wherever it lies
    ("/data/project/.aws/credentials", "a location holding secrets"),
    ("/data/project/.gnupg", "a location holding secrets"),
    ("/data/project/.config/gh/hosts.yml", "a location holding secrets"),
    ("/data/project/.config/ghost", None),                  # not .config/gh
    ("/data/project/.env", "a .env file"),
    ("/data/project/.env.local", "a .env file"),
    ("/data/project/.env/settings", "a .env file"),
    ("/data/project/.envrc", None),
    ("/data/project/env", None),
    ("/etc/shadow", "a location holding secrets"),
    ("/etc/ssl/private/key.pem", "a location holding secrets"),
    ("/etc/ssh/ssh_host_ed25519_key", "a location holding secrets"),
    ("/etc/ssh/ssh_config", None),
    ("/var/lib/landlock-supervisor/servers/x", "a location holding secrets"),   # the default state root
    ("/srv/llsv-state", "the supervisor's own files (its state, parsed manifests or socket)"),
    ("/srv/llsv-state/servers/other/state/db", "the supervisor's own files (its state, parsed manifests or socket)"),
    ("/srv/llsv-state/parsed/echo-0000.json", "the supervisor's own files (its state, parsed manifests or socket)"),
    ("/run/user/1000/landlock-supervisor/socket", "the supervisor's own files (its state, parsed manifests or socket)"),
    ("/run/user/1000", "the supervisor's own files (its state, parsed manifests or socket)"),   # holds the socket's
    ("/run/user/1000/bus", None),
    ("/srv/llsv-statefoo", None),                           # a sibling, not inside
    ("/home/ann/.config", "a directory holding a home's secrets"),   # holds ~/.config/gh
    ("/home/ann/.local", "a directory holding a home's secrets"),    # holds ~/.local/share/keyrings
    ("/home/ann/.config/nvim/init.lua", None),
    ("/home/ann/.conf", None),                              # a prefix of .config, not a directory holding it
    ("/home/ann/.config-old", None),                        # sorts among .config's secrets, holds none
    ("/srv/home/bob/.cargo", "a directory holding a home's secrets"),   # holds ~/.cargo/credentials
    ("/var/lib/svc-home/.local/share", "a directory holding a home's secrets"),
    ("/etc/hostname", None),
    ("/usr/share/doc", None),
    ("/tmp/x", None),
]


@pytest.mark.parametrize("path,refused", TABLE)
def test_why_not(path: str, refused: str | None) -> None:
    assert refusal.why_not(path, KNOWN) == refused


def test_known_leaves_out_slash_and_relative() -> None:
    k = refusal.known(["/", "", None, "rel", "/home/x/"], ["/", "/s//t"])
    assert k.homes == frozenset({"/home/x"}) and k.own == ("/s/t",)
