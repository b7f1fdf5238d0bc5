"""The steps a confined child takes besides Landlock (a session keyring of
its own, scheduling reset, rule paths opened without links inside writable
grants), on every kernel of the matrix: where the kernel has the feature
they work; where it lacks it (no keyrings, no openat2, no I/O priorities)
they are skipped without failing, and the header line `kernel-steps:` says
which."""
from __future__ import annotations

import errno
import os

import pytest

import landlock
from landlock import enter, resolve, syscalls
from landlock.ruleset import build


def _in_child(fn):
    """fn() in a forked child: its result (an int) or -errno; the test
    process keeps its keyring and scheduling."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            try:
                out = fn()
            except OSError as e:
                out = -(e.errno or 1)
            os.write(w, str(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = os.read(r, 100)
    os.close(r)
    os.waitpid(pid, 0)
    return int(data)


def _ring() -> int:
    return syscalls.keyctl(syscalls.KEYCTL_GET_KEYRING_ID, syscalls.KEY_SPEC_SESSION_KEYRING, 0)


def test_session_keyring_step():
    if not landlock.keyrings_available():
        assert _in_child(lambda: (enter.join_session_keyring(), 0)[1]) == 0  # tolerated, not an error
        assert not landlock.prepare(landlock.Spec(unrestricted_filesystem=True,
                                                  unrestricted_network=True)).report.session_keyring
        return
    before = _in_child(_ring)
    after = _in_child(lambda: (enter.join_session_keyring(), _ring())[1])
    assert before > 0 and after > 0 and after != before


def test_scheduling_reset_step():
    """Works (or does nothing) on every kernel; real-time only as root."""
    def reset():
        if os.geteuid() == 0:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        enter.reset_scheduling()
        return os.sched_getscheduler(0)
    assert _in_child(reset) == os.SCHED_OTHER


def test_io_priority_step():
    got = _in_child(lambda: (enter.reset_io_priority(), syscalls.ioprio_get())[1])
    if got in (-errno.ENOSYS, -errno.EINVAL):
        return  # a kernel without I/O priorities: reset_io_priority did not fail
    assert got >= 0 and got >> syscalls.IOPRIO_CLASS_SHIFT != syscalls.IOPRIO_CLASS_RT


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk-only"])
def test_rule_paths_refuse_links_inside_writable_grants(tmp_path, monkeypatch, openat2, expected_abi):
    """With openat2 (5.6) or without: the same result either way."""
    if expected_abi == 0:
        pytest.skip("no Landlock: build() has no ruleset to make")
    if not openat2:
        monkeypatch.setattr(resolve, "_openat2_works", False)
    state = tmp_path / "state"
    (state / "cache").mkdir(parents=True)
    spec = landlock.Spec(read_write=(str(state), str(state / "cache")), read_only=("/usr",))
    build(spec).close()
    os.rename(state / "cache", state / "away")
    os.symlink("/", state / "cache")
    with pytest.raises(landlock.SpecError, match="symlink"):
        build(spec)
