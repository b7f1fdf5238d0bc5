"""Leaving root (a uid drop, or every capability dropped), no_new_privs,
and RLIMIT_NPROC under an otherwise unused uid."""
from __future__ import annotations

import errno
import os
import pwd
import stat
from pathlib import Path

import prctl
import pytest

from landlock import Spec

CAP_SETS = ("CapInh", "CapPrm", "CapEff", "CapAmb")


def _status_after_confinement(run_confined, spec):
    """/proc/self/status of the confined child, read through an fd opened
    before confinement (/proc is out of the domain's reach)."""
    fd: list[int] = []

    def status():
        text = os.pread(fd[0], 1 << 16, 0).decode()
        fields = dict(line.split(":\t", 1) for line in text.splitlines())
        return ({k: v.strip() for k, v in fields.items()}, prctl.get_no_new_privs(),
                os.getresuid(), os.getresgid(), os.getpid())

    result = run_confined(spec, status,
                          before=lambda: fd.append(os.open("/proc/self/status", os.O_RDONLY)))
    return (*result.unwrap(), result.report)


@pytest.mark.enforcement
def test_identity_capabilities_and_no_new_privs(run_confined, identity):
    fields, nnp, uids, gids, pid, report = _status_after_confinement(run_confined, Spec(**identity.spec))
    assert uids == (identity.uid,) * 3
    assert fields["Uid"].split() == [str(identity.uid)] * 4
    if "user" in identity.spec:
        assert gids == (pwd.getpwuid(identity.uid).pw_gid,) * 3
    for name in CAP_SETS:
        assert int(fields[name], 16) == 0, name
    if identity.uid == 0:
        assert int(fields["CapBnd"], 16) == 0  # root cannot get them back by exec either
    assert fields["NoNewPrivs"] == "1" and nnp == 1
    assert report.no_new_privs and report.capabilities_dropped
    assert (report.uid, report.enforced) == (identity.uid, True)
    assert report.tid == pid  # a single-threaded child: its one thread


@pytest.mark.root_only
@pytest.mark.enforcement
def test_keep_capabilities_keeps_them(run_confined):
    fields, nnp, uids, _, _, report = _status_after_confinement(run_confined, Spec(keep_capabilities=True))
    assert uids == (0, 0, 0) and int(fields["CapEff"], 16) != 0 and nnp == 1
    assert not report.capabilities_dropped


@pytest.mark.root_only
@pytest.mark.enforcement
def test_uid_drop_is_irreversible(confined_errno):
    assert confined_errno(Spec(user=65534), lambda: os.setuid(0)) == errno.EPERM


@pytest.mark.root_only
@pytest.mark.enforcement
@pytest.mark.parametrize("keep", [False, True], ids=["caps-dropped", "caps-kept"])
def test_chmod_outside_the_rules_needs_capabilities(confined_errno, layout, keep):
    """Landlock does not restrict chmod: only dropping root's capabilities
    stops a confined root from changing a file it does not own."""
    target = layout.out / "file"
    os.chown(target, 12345, 12345)
    got = confined_errno(Spec(keep_capabilities=keep), lambda: os.chmod(target, 0o777))
    assert got == (0 if keep else errno.EPERM)


@pytest.mark.enforcement
def test_char_device_denied_even_with_capabilities(confined_errno, layout):
    """MAKE_CHAR is never granted: with CAP_MKNOD kept, only Landlock refuses."""
    spec = Spec(read_write=(str(layout.d),), keep_capabilities=True)
    op = lambda: os.mknod(layout.d / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # noqa: E731
    assert confined_errno(spec, op) == errno.EACCES
    assert confined_errno(spec, lambda: os.mkfifo(layout.d / "fifo")) == 0


def _unused_uid() -> int:
    """A uid no process runs as (RLIMIT_NPROC counts every process of the uid)."""
    used = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("Uid:"):
                        used.update(int(u) for u in line.split()[1:])
            except OSError:
                pass
    start = 64000 + os.getpid() % 1000
    return next(uid for uid in range(start, start + 1000) if uid not in used)


def _fork_once() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return 0


@pytest.mark.root_only
@pytest.mark.enforcement
@pytest.mark.parametrize("limit,expected", [(1, errno.EAGAIN), (2, 0)], ids=["limit-1-refused", "limit-2-allowed"])
def test_nproc_under_an_unused_uid(confined_errno, limit, expected):
    spec = Spec(user=_unused_uid(), rlimits={"NPROC": limit})
    assert confined_errno(spec, _fork_once) == expected


@pytest.mark.root_only
@pytest.mark.enforcement
@pytest.mark.parametrize("user", ["root", 0, "0"], ids=["name", "int", "digits"])
def test_a_user_resolving_to_root_drops_every_capability(run_confined, user):
    """`user: root` switches to uid 0, which keeps every capability: they are
    dropped and the securebits locked all the same, as for no user at all."""
    import _prctl

    from landlock.enter import SECUREBITS
    fields, nnp, uids, gids, _, report = _status_after_confinement(run_confined, Spec(user=user))
    assert uids == (0, 0, 0) and gids == (0, 0, 0)
    for name in (*CAP_SETS, "CapBnd"):
        assert int(fields[name], 16) == 0, name
    assert nnp == 1 and report.capabilities_dropped and report.uid == 0
    bits = run_confined(Spec(user=user), lambda: _prctl.prctl(_prctl.PR_GET_SECUREBITS)).unwrap()
    assert bits & SECUREBITS == SECUREBITS


@pytest.mark.root_only
@pytest.mark.enforcement
def test_user_root_with_keep_capabilities_keeps_them(run_confined):
    fields, _, uids, _, _, report = _status_after_confinement(
        run_confined, Spec(user="root", keep_capabilities=True))
    assert uids == (0, 0, 0) and int(fields["CapEff"], 16) != 0
    assert not report.capabilities_dropped


@pytest.mark.root_only
@pytest.mark.enforcement
def test_chmod_of_a_foreign_file_as_user_root_is_refused(confined_errno, layout):
    target = layout.out / "file"
    os.chown(target, 12345, 12345)
    assert confined_errno(Spec(user="root"), lambda: os.chmod(target, 0o4777)) == errno.EPERM
