"""landlock.ruleset.downgrade: a Spec on a kernel of each ABI -> what is handled,
what is dropped and why, without a system call (go-landlock's TestDowngrade)."""
from __future__ import annotations

import pytest

from landlock import rights
from landlock.ruleset import Downgrade, LandlockUnavailable, downgrade
from landlock.spec import Spec
from landlock.support import Support

FS, NET, SCOPE = rights.FS, rights.Net, rights.Scope
ABI1_FS = rights.FEATURE_BY_NAME["filesystem"].fs
SCOPES = ("scope_abstract_unix_socket", "scope_signal")
LOG = int(rights.RestrictFlag.LOG_NEW_EXEC_ON)


def kernel(abi: int) -> Support:
    """A kernel of this ABI that accepts every feature up to it."""
    return Support(abi, abi, 0, frozenset(f.name for f in rights.FEATURES if f.abi <= abi),
                   {f.name: f"needs ABI {f.abi}" for f in rights.FEATURES if f.abi > abi})


NO_NET = dict(unrestricted_network=True)
NOTHING = dict(unrestricted_filesystem=True, unrestricted_network=True, scopes=())


# (spec keywords, ABI) -> (features handled, features dropped, fs, net, scope, restrict flags)
@pytest.mark.parametrize("spec, abi, handled, dropped, fs, net, scope, flags", [
    ({}, 1, ["filesystem"], ["refer", "truncate", "ioctl_dev", "unix", "tcp", "udp", *SCOPES],
     ABI1_FS, 0, 0, 0),
    ({}, 3, ["filesystem", "refer", "truncate"], ["ioctl_dev", "unix", "tcp", "udp", *SCOPES],
     ABI1_FS | FS.REFER | FS.TRUNCATE, 0, 0, 0),
    ({}, 4, ["filesystem", "refer", "truncate", "tcp"], ["ioctl_dev", "unix", "udp", *SCOPES],
     ABI1_FS | FS.REFER | FS.TRUNCATE, NET.BIND_TCP | NET.CONNECT_TCP, 0, 0),
    ({}, 7, ["filesystem", "refer", "truncate", "ioctl_dev", "tcp", *SCOPES], ["unix", "udp"],
     ABI1_FS | FS.REFER | FS.TRUNCATE | FS.IOCTL_DEV, NET.BIND_TCP | NET.CONNECT_TCP,
     SCOPE.ABSTRACT_UNIX_SOCKET | SCOPE.SIGNAL, 0),
    ({}, 10, ["filesystem", "refer", "truncate", "ioctl_dev", "unix", "tcp", "udp", *SCOPES], [],
     ABI1_FS | FS.REFER | FS.TRUNCATE | FS.IOCTL_DEV | FS.RESOLVE_UNIX,
     NET.BIND_TCP | NET.CONNECT_TCP | NET.BIND_UDP | NET.CONNECT_SEND_UDP, SCOPE.ABSTRACT_UNIX_SOCKET | SCOPE.SIGNAL, 0),
    (NO_NET, 2, ["filesystem", "refer"], ["truncate", "ioctl_dev", "unix", *SCOPES],
     ABI1_FS | FS.REFER, 0, 0, 0),
    ({**NO_NET, "scopes": ("signal",)}, 6, ["filesystem", "refer", "truncate", "ioctl_dev", "scope_signal"],
     ["unix"], ABI1_FS | FS.REFER | FS.TRUNCATE | FS.IOCTL_DEV, 0, SCOPE.SIGNAL, 0),
    (NOTHING, 10, [], [], 0, 0, 0, 0),
    ({**NOTHING, "scopes": ("signal",)}, 5, [], ["scope_signal"], 0, 0, 0, 0),
    ({**NOTHING, "log": ("new_exec_on",)}, 6, [], ["logging"], 0, 0, 0, 0),
    ({**NOTHING, "log": ("new_exec_on",)}, 7, ["logging"], [], 0, 0, 0, LOG),
    ({"best_effort": True}, 0, [], ["filesystem", "refer", "truncate", "ioctl_dev", "unix", "tcp", "udp", *SCOPES],
     0, 0, 0, 0),
    ({"unrestricted_filesystem": True, "require": frozenset({"tcp"})}, 4, ["tcp"], ["udp", *SCOPES],
     0, NET.BIND_TCP | NET.CONNECT_TCP, 0, 0),
])
def test_downgrade(spec: dict, abi: int, handled: list[str], dropped: list[str],
                   fs: int, net: int, scope: int, flags: int) -> None:
    d = downgrade(Spec(**spec), kernel(abi))
    assert d == Downgrade(features=tuple(sorted(handled)),
                          dropped={f: kernel(abi).missing[f] for f in dropped},
                          fs=int(fs), net=int(net), scope=int(scope), restrict_flags=flags)
    # The dropped are exactly the wanted ones the kernel lacks; in the order wanted.
    assert list(d.dropped) == dropped


@pytest.mark.parametrize("spec, abi, missing", [
    ({}, 0, "filesystem"),                                           # fails closed unless best_effort
    ({"best_effort": True, "require": frozenset({"tcp"})}, 3, "tcp"),
    ({"require": frozenset({"udp", "unix"})}, 7, "udp: needs ABI 10; unix: needs ABI 9"),
    ({"require": frozenset({"scopes"})}, 5, "scope_abstract_unix_socket"),
])
def test_a_missing_requirement_is_refused(spec: dict, abi: int, missing: str) -> None:
    with pytest.raises(LandlockUnavailable, match=missing):
        downgrade(Spec(**spec), kernel(abi))


def test_without_landlock_an_unrestricted_filesystem_is_not_required() -> None:
    d = downgrade(Spec(unrestricted_filesystem=True), kernel(0))
    assert not d.handles_anything and list(d.dropped) == ["tcp", "udp", *SCOPES]
