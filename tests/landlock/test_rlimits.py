"""Resource limits take effect in the confined process; requests above the
current hard limit are clamped and reported."""
from __future__ import annotations

import errno
import os
import resource
import signal

import pytest

from landlock import Spec


def _open_until_failure(path: str):
    fds = []
    try:
        while True:
            fds.append(os.open(path, os.O_RDONLY))
    except OSError as e:
        return e.errno, len(fds), max(fds)


@pytest.mark.enforcement
def test_nofile(run_confined):
    spec = Spec(read_only_noexec=("/dev/null",), rlimits={"NOFILE": 16})
    result = run_confined(spec, lambda: _open_until_failure("/dev/null"))
    err, opened, highest = result.unwrap()
    assert err == errno.EMFILE and opened > 0 and highest < 16
    assert result.report.rlimits == {"NOFILE": [16, 16]} and result.report.rlimits_set == 1


@pytest.mark.enforcement
def test_fsize(run_confined, layout):
    """Python ignores SIGXFSZ, so the write past the limit fails with EFBIG."""
    path = layout.d / "big"

    def write():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        written = os.write(fd, b"x" * 1000)
        try:
            os.write(fd, b"x")
        except OSError as e:
            return written, e.errno
        return written, 0

    result = run_confined(Spec(read_write_noexec=(str(layout.d),), rlimits={"FSIZE": 1000}), write)
    assert result.unwrap() == (1000, errno.EFBIG)


@pytest.mark.enforcement
def test_cpu(run_confined):
    def spin():
        while True:
            pass

    result = run_confined(Spec(rlimits={"CPU": 1, "CORE": 0}), spin)
    assert result.signal in (signal.SIGXCPU, signal.SIGKILL)


@pytest.mark.enforcement
def test_above_hard_limit_is_clamped_and_noted(run_confined):
    result = run_confined(Spec(rlimits={"NOFILE": (32, 1000)}),
                          lambda: resource.getrlimit(resource.RLIMIT_NOFILE),
                          before=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 128)))
    assert result.unwrap() == (32, 128)
    assert result.report.rlimits["NOFILE"] == [32, 128]
    assert "NOFILE" in result.report.clamped_rlimits


@pytest.mark.enforcement
def test_soft_above_clamped_hard_follows_it(run_confined):
    result = run_confined(Spec(rlimits={"NOFILE": 1000}),
                          lambda: resource.getrlimit(resource.RLIMIT_NOFILE),
                          before=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 128)))
    assert result.unwrap() == (128, 128)
    assert list(result.report.clamped_rlimits) == ["NOFILE"]


@pytest.mark.enforcement
def test_unlimited_request_under_a_finite_hard_limit_is_clamped(run_confined):
    result = run_confined(Spec(rlimits={"NOFILE": -1}),
                          lambda: resource.getrlimit(resource.RLIMIT_NOFILE),
                          before=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 128)))
    assert result.unwrap() == (128, 128)
    assert "NOFILE" in result.report.clamped_rlimits
