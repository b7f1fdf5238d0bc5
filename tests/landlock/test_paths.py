"""Rules on single files (masked to file rights, no EINVAL), device ioctls,
missing paths."""
from __future__ import annotations

import errno
import fcntl
import os
import termios

import pytest

from landlock import Spec, SpecError

CLASSES = ["read_only", "read_only_noexec", "read_write", "read_write_noexec", "connect_unix"]
WRITE = {"read_write", "read_write_noexec"}


@pytest.mark.enforcement
@pytest.mark.parametrize("cls", CLASSES)
def test_rule_on_a_regular_file_covers_that_file_only(run_confined, layout, cls, abi):
    target = layout.d / "file"
    spec = Spec(**{cls: (str(target),)}, max_abi=abi)

    def probe():
        out = {}
        for name, op in (("read", lambda: target.read_bytes()),
                         ("write", lambda: os.close(os.open(target, os.O_WRONLY))),
                         ("sibling", lambda: (layout.d / "a" / "f").read_bytes()),
                         ("list_parent", lambda: os.listdir(layout.d))):
            try:
                op()
                out[name] = 0
            except OSError as e:
                out[name] = e.errno
        return out

    got = run_confined(spec, probe).unwrap()  # an EINVAL from add_rule would raise here
    reads = 0 if cls != "connect_unix" else errno.EACCES
    assert got == {"read": reads, "write": 0 if cls in WRITE else errno.EACCES,
                   "sibling": errno.EACCES, "list_parent": errno.EACCES}


@pytest.mark.enforcement
@pytest.mark.parametrize("cls", CLASSES)
def test_rule_on_dev_null_masks_and_ioctl_dev(confined_errno, cls, abi):
    """A device file takes a rule of any class; an ioctl on a device opened
    inside the domain needs IOCTL_DEV (ABI 5), which only write classes grant."""
    def op():
        fd = os.open("/dev/null", os.O_RDWR if cls in WRITE else os.O_RDONLY)
        try:
            fcntl.ioctl(fd, termios.TCGETS, bytes(64))  # not a tty: ENOTTY once allowed
        finally:
            os.close(fd)

    got = confined_errno(Spec(**{cls: ("/dev/null",)}, max_abi=abi), op)
    if cls == "connect_unix":
        assert got == errno.EACCES  # nothing granted before ABI 9: open fails
    elif abi >= 5 and cls not in WRITE:
        assert got == errno.EACCES
    else:
        assert got == errno.ENOTTY


@pytest.mark.enforcement
def test_missing_path_is_skipped_and_reported(run_confined, layout):
    missing = str(layout.root / "missing")
    spec = Spec(read_only_noexec=(missing, str(layout.d)))
    result = run_confined(spec, lambda: (layout.d / "file").read_bytes())
    assert result.unwrap() == b"data"
    assert result.report.skipped_paths == [missing]
    assert missing in result.report.note


@pytest.mark.enforcement
def test_missing_path_under_strict_paths_is_a_spec_error(run_confined, layout):
    missing = str(layout.root / "missing")
    result = run_confined(Spec(read_only_noexec=(missing, str(layout.d)), strict_paths=True),
                          lambda: "ran")
    assert isinstance(result.error, SpecError)
    assert missing in str(result.error)
    assert result.report is None


@pytest.mark.enforcement
def test_rule_binds_to_the_symlink_target(confined_errno, layout):
    """A rule on a symlink covers what it points to when the rule is added."""
    os.symlink(layout.d, layout.root / "link")
    spec = Spec(read_only_noexec=(str(layout.root / "link"),))
    assert confined_errno(spec, lambda: (layout.d / "file").read_bytes()) == 0
    assert confined_errno(spec, lambda: (layout.out / "file").read_bytes()) == errno.EACCES
