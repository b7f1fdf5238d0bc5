"""Warm servers' pure parts: which requests they may serve (supervisor/daemon/warm.py), what counts as
tampering (supervisor/daemon/tamper.py); which manifests may have them is in
tests/unit/test_manifest_keys.py."""
from __future__ import annotations

import errno
import os
import resource
import subprocess
from pathlib import Path

import pytest

from landlock.spec import Spec
from supervisor.daemon import policy, tamper, warm
from supervisor.daemon.limits import Limits
from manifest_text import load_text as _load
from test_downgrade import kernel

INF = resource.RLIM_INFINITY


def test_warm_defaults_to_none(tmp_path: Path) -> None:
    assert _load(tmp_path, "user: dynamic\n").warm == 0
    assert _load(tmp_path, "user: dynamic\nwarm: 2\n").warm == 2


UNFIT = [
    ("the manifest's own process", {}, True, None),
    ("args: [] is no client arg", {"args": []}, True, None),
    ("no warm servers", {}, True, "its manifest keeps no warm server"),
    ("the client's own stdio", {}, False, "the client passed its own stdio"),
    ("client args", {"args": ["x"]}, True, "the request has client args"),
    ("client env", {"env": {"GITHUB_TOKEN": "t"}}, True, "the request has a client environment"),
    ("a cwd, even without args", {"cwd": "/"}, True, "the request has a client cwd"),
    ("a narrowing, even an empty one", {"narrow": {}}, True, "the request has a narrowing"),
    ("env: {} is no client environment", {"env": {}}, True, None),
    # Of the wrong type: fresh, where policy.plan refuses it (a hand-over makes no plan).
    ("args: null", {"args": None}, True, "the request has client args"),
    ("args: {}", {"args": {}}, True, "the request has client args"),
    ("env: []", {"env": []}, True, "the request has a client environment"),
    ("env: null is no client environment (policy.plan's reading)", {"env": None}, True, None),
    ("args: false", {"args": False}, True, "the request has client args"),
]


@pytest.mark.parametrize("case,request_,pipes,why", UNFIT, ids=[c[0] for c in UNFIT])
def test_unfit(tmp_path: Path, case: str, request_: dict, pipes: bool, why: str | None) -> None:
    m = _load(tmp_path, "user: dynamic\n" + ("" if why == "its manifest keeps no warm server" else "warm: 1\n"))
    assert warm.unfit(m, request_, pipes) == why
    if why is None:
        # A hand-over makes no plan: what unfit lets through must be planned
        # exactly as the warm servers' own empty request was.
        env = {"PATH": "/usr/bin:/bin", "HOME": "/root"}
        assert policy.plan(m, request_, Limits(), env) == policy.plan(m, {}, Limits(), env)


S = frozenset({0, 1})
R = 0x40000000     # SCHED_RESET_ON_FORK, as the zygote sets it
SL, NONE = 1_400_000, (0, 1024)   # the kernel's default slice (the zygote's), the clamps reset
Z = tamper.Scheduling
# The zygote's scheduling (policy, nice, slice, clamps) -> its child's.
FORKED = [
    ("normal, kept", Z(os.SCHED_OTHER, 0, S, -1, SL, NONE), Z(os.SCHED_OTHER, 0, S, -1, SL, NONE)),
    ("a nice of 5 kept", Z(os.SCHED_OTHER, 5, S), Z(os.SCHED_OTHER, 5, S)),
    ("no reset: a slice and clamps of its own kept", Z(os.SCHED_OTHER, 0, S, -1, 100_000, (0, 512)),
     Z(os.SCHED_OTHER, 0, S, -1, 100_000, (0, 512))),
    ("reset: negative nice", Z(os.SCHED_OTHER | R, -5, S, -1, SL, NONE), Z(os.SCHED_OTHER, 0, S, -1, SL, NONE)),
    ("reset: clamps none", Z(os.SCHED_OTHER | R, 0, S, -1, SL, (100, 512)), Z(os.SCHED_OTHER, 0, S, -1, SL, NONE)),
    ("reset: real-time, its slice not known", Z(os.SCHED_FIFO | R, 0, S, -1, 0, NONE),
     Z(os.SCHED_OTHER, 0, S, -1, 0, NONE)),
    ("reset: real-time with a nice of 5", Z(os.SCHED_RR | R, 5, S), Z(os.SCHED_OTHER, 0, S, -1, 0, NONE)),
    ("reset: batch kept", Z(os.SCHED_BATCH | R, 3, S, -1, SL, NONE), Z(os.SCHED_BATCH, 3, S, -1, SL, NONE)),
]


@pytest.mark.parametrize("case,zygote,expected", FORKED, ids=[c[0] for c in FORKED])
def test_as_forked(case: str, zygote: tamper.Scheduling, expected: tamper.Scheduling) -> None:
    assert tamper.as_forked(zygote, NONE) == expected


def test_scheduling_of_reads_what_as_forked_needs() -> None:
    """Ours: the policy with sched_getscheduler's reset bit, a fair task's
    slice (which kernels before 6.12 neither report nor let be set)."""
    ours = tamper.scheduling_of(os.getpid())
    assert ours.policy == os.sched_getscheduler(0) and ours.nice == os.getpriority(os.PRIO_PROCESS, 0)
    assert ours.affinity == frozenset(os.sched_getaffinity(0))
    release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    assert ours.slice > 0 or release < (6, 12), (ours, release)


LIMITS = [
    ("as forked", {7: (64, 128)}, None),
    ("soft raised (node's NOFILE)", {7: (128, 128)}, None),
    ("soft lowered", {7: (32, 128)}, "its soft limit 7 is 32, below 64"),
    ("hard lowered", {7: (64, 100)}, "its hard limit 7 is 100, not 128"),
    ("unlimited soft is no lowering", {7: (INF, 128)}, None),
]


@pytest.mark.parametrize("case,now,why", LIMITS, ids=[c[0] for c in LIMITS])
def test_limits_tampered(case: str, now: dict, why: str | None) -> None:
    assert tamper.limits_tampered(now, {7: (64, 128)}) == why
    assert tamper.limits_tampered({4: (INF, INF)}, {4: (INF, INF)}) is None
    assert tamper.limits_tampered({4: (1, INF)}, {4: (INF, INF)}) is not None


def test_parse_limits() -> None:
    with open("/proc/self/limits", "rb") as f:
        limits = tamper.parse_limits(f.read())
    assert sorted(limits) == list(range(16))
    for res, value in limits.items():
        assert value == resource.getrlimit(res), res


def test_warm_max_age(tmp_path: Path) -> None:
    """(Its refusals: tests/unit/test_manifest_keys.py.)"""
    assert _load(tmp_path, "user: dynamic\nwarm: 1\n").warm_max_age == 600
    assert _load(tmp_path, "user: dynamic\nwarm: 1\nwarm_max_age: 5\n").warm_max_age == 5


def test_room() -> None:
    from supervisor.errors import Code, Refused
    from supervisor.daemon.limits import Limits
    from supervisor.daemon.policy import room
    limits = Limits(children=2)
    room(1, limits)
    with pytest.raises(Refused) as e:
        room(2, limits)
    assert e.value.code == Code.TOO_MANY_CHILDREN and "runs 2 children, its limit" in str(e.value)


@pytest.mark.parametrize("ioprio,expected", [(-1, -1), (2 << 13 | 4, 2 << 13 | 4), (3 << 13, 3 << 13),
                                             (1 << 13 | 0, 2 << 13 | 4)])
def test_as_forked_io_priority(ioprio: int, expected: int) -> None:
    """A real-time I/O class becomes best-effort 4 in the child (enter.reset_io_priority); others stay."""
    assert tamper.as_forked(tamper.Scheduling(os.SCHED_OTHER, 0, frozenset({0}), ioprio)).ioprio == expected


SIGNAL = [
    # what, spec keywords, kernel ABI, why its sessions may signal outside their domain
    ("the default scopes, ABI 6", {}, 6, None),
    ("scopes without signal", {"scopes": ("abstract_unix_socket",)}, 7, "its `scopes:` leave out signal"),
    ("a kernel before ABI 6, best effort", {"best_effort": True}, 5, "needs ABI 6"),
    ("a kernel before ABI 6: the filesystem is what is required", {}, 4, "needs ABI 6"),
    ("no Landlock, required: its sessions never start", {}, 0, None),
]


@pytest.mark.parametrize("spec,abi,why", [s[1:] for s in SIGNAL], ids=[s[0] for s in SIGNAL])
def test_warm_servers_only_where_signals_are_scoped(spec, abi, why):
    """A warm spare waits among its uid's sessions: kept only where this
    kernel keeps each of them from signalling outside its domain."""
    assert warm.signal_unscoped(Spec(**spec), kernel(abi)) == why


def test_a_spare_whose_limits_cannot_be_opened_leaves_no_fd_open(monkeypatch):
    """tamper.Forked opens /proc/PID/stat then limits at the fork: out of
    fds at the second, the first is closed (the caller gets no object)."""
    real, opened = os.open, []

    def open_(path, *args, **kwargs):
        if str(path).endswith("/limits"):
            raise OSError(errno.EMFILE, "Too many open files")
        opened.append(real(path, *args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(tamper.os, "open", open_)
    with pytest.raises(OSError):
        tamper.Forked(os.getpid(), {}, tamper.Scheduling(os.SCHED_OTHER, 0, frozenset({0})))
    monkeypatch.undo()
    assert len(opened) == 1
    with pytest.raises(OSError):
        os.fstat(opened[0])


def test_limits_noted_untampered_are_not_parsed_again_and_a_change_is_seen(monkeypatch):
    """Forked.note() keeps the limits' text only when it passes; tampered()
    parses only a text unlike it: the same verdict, without the parse."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        limits = tamper.limits_of(child.pid)
        forked = tamper.Forked(child.pid, limits, tamper.as_forked(tamper.scheduling_of(child.pid)))
        forked.note()
        assert forked.passed and forked.tampered() is None
        parsed: list[bytes] = []
        real = tamper.parse_limits
        monkeypatch.setattr(tamper, "parse_limits", lambda text: parsed.append(text) or real(text))
        assert forked.tampered() is None and not parsed    # the text noted: no parse
        soft, hard = limits[resource.RLIMIT_NOFILE]
        resource.prlimit(child.pid, resource.RLIMIT_NOFILE, (soft - 1, hard))
        assert forked.tampered() == f"its soft limit {resource.RLIMIT_NOFILE} is {soft - 1}, below {soft}"
        assert len(parsed) == 1
        forked.note()   # a tampered text is never noted
        assert forked.tampered() is not None and len(parsed) == 3
        forked.close()
    finally:
        child.kill()
        child.wait()
