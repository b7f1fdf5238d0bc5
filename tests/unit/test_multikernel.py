"""scripts/multikernel's pure parts (scripts/kernelmatrix/): the kernel table, the options, a guest's console read, the matrix."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from scripts.kernelmatrix import guest, kernels, main, matrix, qemu
from scripts.kernelmatrix.config import TEST_PATHS

PATCHED = [f"patched-abi{n}" for n in range(1, 11)] + ["patched-nolandlock"]
QEMU = ["bullseye", "bookworm", "trixie", "sid"]


@pytest.mark.parametrize("kver, abi", [
    ("5.10.0-30-amd64", "0"), ("5.13.0", "1"), ("6.1.0-28-amd64", "2"), ("6.12.118+deb13-amd64", "6"),
    ("6.15.1", "7"), ("7.2.13+deb14-amd64", "10"), ("7.3.0", "10+"), ("8.0.1", "10+")])
def test_expected_abi(kver: str, abi: str) -> None:
    assert kernels.expected_abi(kver) == abi


def test_the_table() -> None:
    assert list(kernels.KERNELS) == PATCHED + QEMU
    assert [kernels.KERNELS[n]["expect"] for n in PATCHED] == [str(n) for n in range(1, 11)] + ["0"]


@pytest.mark.parametrize("only, names", [
    (None, PATCHED + QEMU), ("", PATCHED + QEMU), ("patched", PATCHED), ("qemu", QEMU),
    ("bookworm, patched-abi2", ["patched-abi2", "bookworm"]), ("qemu,patched-nolandlock", ["patched-nolandlock"] + QEMU)])
def test_select(only: str | None, names: list[str]) -> None:
    assert kernels.select(only) == names


@pytest.mark.parametrize("only", ["nope", "patched,bogus", " , "])
def test_select_refuses(only: str) -> None:
    with pytest.raises(ValueError, match="unknown kernel"):
        kernels.select(only)


def test_parse() -> None:
    args, names, paths = main.parse(["--only", "patched-abi2", "-j", "3", "tests/kernel"])
    assert (names, paths, args.j, args.prepare_only, args.timeout) == (["patched-abi2"], ["tests/kernel"], 3, False, None)
    args, names, paths = main.parse([])
    assert names == PATCHED + QEMU and args.j == 2 and paths and set(paths) <= set(TEST_PATHS)


@pytest.mark.parametrize("argv", [["--only", "nope"], ["-j", "0"], ["no/such/path"], ["--timeout", "x"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main.parse(argv)
    assert e.value.code == 2
    assert "usage:" in capsys.readouterr().err


CONSOLE = """\
landlock-abi: 2
============ test session starts ============
...
==== 1 failed, 10 passed, 2 skipped, 1 error in 31.20s ====
MULTIKERNEL-EXIT={rc}
"""


@pytest.mark.parametrize("rc, status, reason", [
    ("0", "ok", ""), ("1", "FAIL", "pytest exited 1"), ("5", "FAIL", "pytest collected no test"),
    ("125", "FAIL", "guest setup failed")])
def test_read_console(rc: str, status: str, reason: str) -> None:
    got = guest.read_console(CONSOLE.format(rc=rc), False, 300)
    assert got == {"seen": "2", "passed": 10, "skipped": 2, "failed": 2, "status": status, "reason": reason}


def test_read_console_without_marker_or_in_time() -> None:
    got = guest.read_console("landlock-abi: 0 (EOPNOTSUPP)\nKernel panic\n", False, 300)
    assert (got["seen"], got["passed"], got["status"], got["reason"]) == (
        "0 (EOPNOTSUPP)", 0, "FAIL", "guest ended without its exit marker")
    got = guest.read_console(CONSOLE.format(rc="0"), True, 300)
    assert (got["status"], got["reason"]) == ("FAIL", "guest timed out after 300s")
    assert guest.read_console("", False, 1)["seen"] == "?"


def test_every_guest_is_booted_by_qemu_with_the_chosen_accelerator() -> None:
    """No guest is a User-Mode Linux one (UML 6.12 panics on a CPU with AMX): the patched kernel and Debian's
    boot alike, with the patched kernel's own parameters and the accelerator chosen for the run."""
    info = {"dir": "/c/k", "initrd": "/c/k/initrd.img", "accel": qemu.KVM}
    for name in kernels.KERNELS:
        cmd = qemu.command(info, ["GUEST_CMD=/x"], kernels.KERNELS[name].get("append", []))
        assert cmd[0] == "qemu-system-x86_64" and cmd[1:5] == qemu.KVM
        assert " ".join(kernels.KERNELS[name].get("append", [])) in cmd[-1]
    assert qemu.command({"dir": "/c/k", "initrd": "/i"}, [], [])[1:5] == qemu.TCG


@pytest.mark.parametrize("kvm_opens, console, accel, why", [
    (False, "", qemu.TCG, "TCG: /dev/kvm: No such file or directory"),
    (True, "Run /init\nMULTIKERNEL-EXIT=0\n", qemu.KVM, "KVM"),
    (True, "KVM internal error. Suberror: 1\nemulation failure\n", qemu.TCG, "TCG: a KVM guest did not run"),
    (True, "", qemu.TCG, "TCG: a KVM guest did not run")])
def test_kvm_only_where_a_guest_boots_under_it(kvm_opens: bool, console: str, accel: list[str], why: str,
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/kvm opening is not enough (nested KVM was seen to fail at a guest's first cmpxchg16b): a guest
    must boot under it, else every guest runs under TCG, and the run says why."""
    real_open = os.open

    def fake_open(path: str, flags: int) -> int:
        if not kvm_opens:
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_open("/dev/null", flags)

    def fake_spawn(cmd: list[Any], log: Path, timeout: float) -> int:
        assert cmd[1:5] == qemu.KVM and "GUEST_CMD=/bin/true" in cmd[-1]
        log.write_text(console)
        return 0

    monkeypatch.setattr(qemu.os, "open", fake_open)
    monkeypatch.setattr(qemu, "spawn", fake_spawn)
    got_accel, got_why = qemu.choose_accel({"dir": "/c/k", "initrd": "/i"}, tmp_path / "probe.log")
    assert got_accel == accel and got_why.startswith(why)


@pytest.mark.parametrize("repo, cache, keep", [
    ("/srv/repo", "/var/cache/mk", ""), ("/tmp/repo", "/var/cache/mk", "/tmp/repo"), ("/srv/repo", "/tmp", "/tmp"),
    ("/tmp/r", "/tmp/r/.cache", "/tmp/r,/tmp/r/.cache")])
def test_guest_params(repo: str, cache: str, keep: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository and the cache, when under the host's /tmp, are bound back over the guest's
    own /tmp (a tmpfs: the tests write there); /tmp itself stays the host's."""
    monkeypatch.setattr(guest, "REPO", Path(repo))
    monkeypatch.setattr(guest, "CACHE", Path(cache))
    assert guest.params(Path("/c/run/x.sh")) == ["GUEST_CMD=/c/run/x.sh", f"MK_KEEP_TMP={keep}"]


def test_matrix() -> None:
    results: dict[str, dict[str, Any]] = {
        "patched-abi2": {"status": "ok", "reason": "", "expect": "2", "seen": "2", "passed": 41, "failed": 0,
                     "skipped": 3, "secs": 12.4},
        "bookworm": {"status": "FAIL", "reason": "pytest exited 1", "expect": "2", "seen": "2", "passed": 40,
                     "failed": 1, "skipped": 3, "secs": 301.0},
        "sid": {"status": "skip", "reason": "sid has no linux-image-amd64", "expect": "-"},
    }
    versions = {"patched-abi2": "6.12.57-1 patched landlock_abi=2", "bookworm": "6.1.0-28-amd64 (bookworm)"}
    assert matrix.render(["patched-abi2", "bookworm", "sid"], results, versions) == [
        "kernel        version                           ABI expected  ABI seen  passed  failed  skipped  time  result",
        "patched-abi2  6.12.57-1 patched landlock_abi=2  2             2         41      0       3        12s   ok",
        "bookworm      6.1.0-28-amd64 (bookworm)         2             2         40      1       3        301s  "
        "FAIL: pytest exited 1",
        "sid           -                                 -             -         -       -       -        -     "
        "skip: sid has no linux-image-amd64",
    ]
