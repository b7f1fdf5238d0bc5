"""The project's own confinement on this kernel: what the library probes,
what it enforces and reports, and the supervisor's spawn path (fork,
confine, exec). Run on the host and in every kernel of scripts/multikernel,
where EXPECT_ABI says what the kernel must be."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import landlock
from landlock import rights
from landlock.ruleset import wanted_features

PYTHON = sys.executable
SYSTEM = ["--rox", "/usr,/lib,/lib64,/bin", "--lax-paths"]
DEFAULT_WANTED = wanted_features(landlock.Spec())  # every feature an empty Spec asks for


def _exec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "landlock", *args], capture_output=True, text=True, timeout=60)


def _report(r: subprocess.CompletedProcess) -> dict:
    """The Report landlock-exec printed (other lines: its root warning, the target's errors)."""
    return json.loads(next(line for line in r.stderr.splitlines() if line.startswith("{")))


def _first_missing(abi: int) -> str | None:
    return next((f.name for f in rights.FEATURES if f.abi > abi and f.name in DEFAULT_WANTED), None)


def test_probe_matches_the_kernel(expected_abi):
    support = landlock.probe()
    assert support.abi == expected_abi
    known = {f.name for f in rights.FEATURES if f.abi <= expected_abi}
    # Nothing the kernel has is left out, nothing it lacks is claimed.
    assert support.features == known, support.missing


@pytest.mark.enforcement
def test_defaults_enforce_everything_the_kernel_has(expected_abi, tmp_path):
    if expected_abi == 0:
        pytest.skip("no Landlock: see test_without_landlock_fails_closed")
    secret = tmp_path / "secret"
    secret.write_text("secret")
    r = _exec(*SYSTEM, "--report", "--", "cat", str(secret))
    assert r.returncode == 1 and "Permission denied" in r.stderr, r.stderr
    report = _report(r)
    assert report["abi"] == expected_abi and report["enforced"]
    assert sorted(report["features"]) == sorted(f for f in DEFAULT_WANTED
                                                if rights.FEATURE_BY_NAME[f].abi <= expected_abi)
    assert sorted(report["downgraded"]) == sorted(f for f in DEFAULT_WANTED
                                                  if rights.FEATURE_BY_NAME[f].abi > expected_abi)
    assert report["unix_connect_unrestricted"] == (expected_abi < 9)
    assert report["udp_unrestricted"] == (expected_abi < 10)


def test_a_required_missing_feature_is_refused(expected_abi):
    missing = _first_missing(expected_abi)
    if missing is None:  # a kernel with every feature the library knows: all of them may be required
        r = _exec(*SYSTEM, "--require", ",".join(DEFAULT_WANTED), "--", "true")
        assert r.returncode == 0, r.stderr
        return
    r = _exec(*SYSTEM, "--require", missing, "--", "true")
    assert r.returncode == landlock.EXIT_UNAVAILABLE, r.stderr
    assert missing in r.stderr


def test_without_landlock_fails_closed(expected_abi):
    if expected_abi != 0:
        pytest.skip("this kernel has Landlock")
    r = _exec(*SYSTEM, "--", "true")
    assert r.returncode == landlock.EXIT_UNAVAILABLE, r.stderr
    r = _exec(*SYSTEM, "--best-effort", "--report", "--", "true")
    assert r.returncode == 0, r.stderr
    assert _report(r)["abi"] == -1


# ---- the supervisor's spawn path -------------------------------------------------

def _manifest(directory, name: str, *, best_effort: bool = False, read: str = "") -> None:
    (directory / f"{name}.yaml").write_text(
        f"command: /bin/cat\nargs: [{read}]\nallow_root: true\n"
        f"sandbox:\n  profiles: [system]\n  best_effort: {'true' if best_effort else 'false'}\n")


@pytest.fixture
def private(tmp_path):
    import supervisor
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("secret\n")
    _manifest(manifests, "strict", read=str(secret))
    _manifest(manifests, "lax", best_effort=True, read=str(secret))
    client = supervisor.start(str(manifests), state_root=str(tmp_path / "state"),
                              extra_args=["--allow-root-servers"])
    yield client
    assert client.close() == 0


def _spawn(client, name):
    r, w = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        child = client.spawn(name, stdin=null, stdout=w, stderr=w)
    finally:
        os.close(w)
        os.close(null)
    with os.fdopen(r) as f, child:
        code = child.wait(30)
        return child, code, f.read()


def test_supervisor_spawn_path(expected_abi, private):
    from supervisor.client import ConfinementUnavailable
    if expected_abi == 0:
        with pytest.raises(ConfinementUnavailable):
            _spawn(private, "strict")
        child, code, out = _spawn(private, "lax")
        assert child.report.abi == -1 and code == 0 and out == "secret\n"  # unconfined, and says so
        return
    child, code, out = _spawn(private, "strict")
    assert child.report.abi == expected_abi and child.report.enforced
    assert code == 1 and "Permission denied" in out
