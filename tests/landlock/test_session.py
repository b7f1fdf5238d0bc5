"""What a confined process shares with whoever confined it besides files:
the session keyring, and the scheduling (a real-time parent's children
must not be real-time)."""
from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

import landlock
from landlock import Spec, enter, syscalls

KEYRINGS = landlock.keyrings_available()
ENOKEY = 126
KEY_DESC = b"llsv-test-session-key"


def _session_keyring() -> int:
    return syscalls.keyctl(syscalls.KEYCTL_GET_KEYRING_ID, syscalls.KEY_SPEC_SESSION_KEYRING, 0)


def _find(keyring: int) -> int:
    """0 when the test key is found searching `keyring`, else the errno."""
    try:
        syscalls.keyctl(syscalls.KEYCTL_SEARCH, keyring, b"user", KEY_DESC, 0)
    except OSError as e:
        return e.errno
    return 0


def _plant() -> dict[str, int]:
    """In the child, unconfined: a session keyring of its own (never the test
    run's), holding a key, as a supervisor's session could."""
    enter.join_session_keyring()
    key = syscalls.add_key(b"user", KEY_DESC, b"secret", syscalls.KEY_SPEC_SESSION_KEYRING)
    return {"ring": _session_keyring(), "key": key}


@pytest.mark.skipif(not KEYRINGS, reason="this kernel has no keyrings")
@pytest.mark.enforcement
def test_confined_child_joins_a_fresh_session_keyring(run_confined, identity):
    planted: dict[str, int] = {}

    def probe():
        return {"ring": _session_keyring(), "search": _find(syscalls.KEY_SPEC_SESSION_KEYRING),
                "old_ring_by_id": _find(planted["ring"]), "planted": planted["ring"]}

    result = run_confined(Spec(**identity.spec), probe, before=lambda: planted.update(_plant()))
    got = result.unwrap()
    assert result.report.session_keyring
    assert got["ring"] != got["planted"]
    assert got["search"] == ENOKEY
    # Not by its id either: no longer a possessor, the child may not search it
    # (uid 0 may still list its key ids: the ring grants its owner uid read);
    # or the ring is gone already (ENOKEY): this child held its last
    # reference, and the kernel's key GC may have run (seen in a slow TCG
    # guest). A live ring it could search would give 0: the key is in it.
    assert got["old_ring_by_id"] in (errno.EACCES, ENOKEY)


@pytest.mark.skipif(not KEYRINGS, reason="this kernel has no keyrings")
def test_without_confinement_the_key_is_found(run_confined):
    """The probe itself works: an unconfined child finds the planted key."""
    result = run_confined(None, lambda: (_find(syscalls.KEY_SPEC_SESSION_KEYRING), _session_keyring()),
                          before=_plant)
    assert result.unwrap()[0] == 0


def test_keyrings_absent_is_tolerated(monkeypatch):
    def no_keyctl(*args):
        raise OSError(errno.ENOSYS, "keyctl")
    monkeypatch.setattr(syscalls, "keyctl", no_keyctl)
    enter.join_session_keyring()  # nothing raised: reported by keyrings_available()


# --- scheduling -----------------------------------------------------------

def _sched() -> tuple[int, int, int]:
    """(policy without the reset-on-fork flag, nice, I/O class)."""
    policy = os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0x40000000)
    try:
        io_class = syscalls.ioprio_get() >> syscalls.IOPRIO_CLASS_SHIFT
    except OSError as e:
        io_class = -e.errno
    return policy, os.getpriority(os.PRIO_PROCESS, 0), io_class


def _make_realtime() -> None:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    os.setpriority(os.PRIO_PROCESS, 0, -5)
    try:
        syscalls.ioprio_set(syscalls.IOPRIO_CLASS_RT << syscalls.IOPRIO_CLASS_SHIFT | 4)
    except OSError as e:
        if e.errno not in (errno.ENOSYS, errno.EINVAL):
            raise


def _realtime_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (CAP_SYS_NICE) to make a real-time process")


def test_reset_scheduling(run_confined):
    _realtime_or_skip()
    before = run_confined(None, _sched, before=_make_realtime).unwrap()
    assert before[:2] == (os.SCHED_FIFO, -5)
    after = run_confined(None, lambda: (enter.reset_scheduling(), _sched())[1], before=_make_realtime).unwrap()
    assert after[:2] == (os.SCHED_OTHER, 0)
    if before[2] > 0:  # a kernel with I/O priorities
        assert (before[2], after[2]) == (syscalls.IOPRIO_CLASS_RT, syscalls.IOPRIO_CLASS_BE)


def test_reset_io_priority_leaves_the_cpu_policy(run_confined):
    _realtime_or_skip()
    after = run_confined(None, lambda: (enter.reset_io_priority(), _sched())[1], before=_make_realtime).unwrap()
    assert after[:2] == (os.SCHED_FIFO, -5)
    assert after[2] in (syscalls.IOPRIO_CLASS_BE, -errno.ENOSYS, -errno.EINVAL)


def test_ordinary_scheduling_is_left_alone(run_confined):
    def nice_batch():
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, 0, 7)
    got = run_confined(None, lambda: (enter.reset_scheduling(), _sched())[1], before=nice_batch).unwrap()
    assert got[:2] == (os.SCHED_BATCH, 7)


# --- landlock-exec ---------------------------------------------------------

_PROBE = r"""
import json, os, sys
sys.path[:0] = [sys.argv[1]]
from landlock import syscalls
policy = os.sched_getscheduler(0) & ~0x40000000
try:
    io_class = syscalls.ioprio_get() >> syscalls.IOPRIO_CLASS_SHIFT
except OSError as e:
    io_class = -e.errno
try:
    ring = syscalls.keyctl(syscalls.KEYCTL_GET_KEYRING_ID, syscalls.KEY_SPEC_SESSION_KEYRING, 0)
except OSError as e:
    ring = -e.errno
print(json.dumps([policy, os.getpriority(os.PRIO_PROCESS, 0), io_class, ring]))
"""


def test_landlock_exec_resets_scheduling_and_keyring():
    """Started real-time (as under `chrt -f 10 ionice -c1 nice -n -5`), the
    target reads its own scheduling: ordinary; and its own session keyring."""
    _realtime_or_skip()
    repo = os.path.dirname(os.path.dirname(landlock.__file__))
    python = os.path.realpath(sys.executable)
    # --best-effort: these steps are taken on a kernel without Landlock too.
    r = subprocess.run([sys.executable, "-m", "landlock", "--rox", f"/usr,{sys.base_prefix},{repo}",
                        "--best-effort", "--user", "65534", "--", python, "-c", _PROBE, repo],
                       capture_output=True, text=True, timeout=30, preexec_fn=_make_realtime)
    assert r.returncode == 0, r.stderr
    import json
    policy, nice, io_class, ring = json.loads(r.stdout)
    assert (policy, nice) == (os.SCHED_OTHER, 0)
    assert io_class in (syscalls.IOPRIO_CLASS_BE, -errno.ENOSYS, -errno.EINVAL)
    if KEYRINGS:
        assert ring > 0 and ring != _session_keyring()
