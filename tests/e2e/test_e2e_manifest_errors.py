"""A manifest that does not load stops the supervisor from starting, and the
message names the file, the key and what was expected (docs/manifests.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from e2ehelpers import PYTHON, REPO  # noqa: E402

OK = "command: /bin/true\nallow_root: true\n"

CASES = {
    "unknown_key": (OK + "argz: [x]\n", "argz", "unknown key (known: allow_root, args, client_args, "),
    "unknown_sandbox_key": (OK + "sandbox: {read_ony: [/tmp]}\n", "sandbox.read_ony", "unknown key (known: "),
    "wrong_type": (OK + "args: --verbose\n", "args", "expected a list, got a string"),
    "wrong_type_nested": (OK + "sandbox: {network: {connect_tcp: [https]}}\n",
                          "sandbox.network.connect_tcp[0]", "'https' is not a port number (0-65535)"),
    "missing_command": ("allow_root: true\nargs: [x]\n", "command", "missing"),
    "not_executable": ("command: /etc/os-release\nallow_root: true\n", "command",
                       "'/etc/os-release' is not an executable file"),
    "undefined_variable": (OK + "args: [\"${E2E_NEVER_SET}/x\"]\n", "args[0]",
                           "${E2E_NEVER_SET} is not set in the supervisor's environment"),
    # YAML reads 077 as 63 and 77 as 77: only a string says what was meant.
    "umask_number": (OK + "umask: 77\n", "umask", 'expected a quoted octal string such as "077", got the number 77'),
    "umask_not_octal": (OK + "umask: \"089\"\n", "umask", 'expected an octal string such as "077"'),
    "unknown_profile": (OK + "sandbox: {profiles: [system, ruby]}\n", "sandbox.profiles",
                        "unknown profile 'ruby' (known: system, dns-tls, node, npx, python, uvx)"),
    "npx_without_state_dir": ("command: /usr/bin/npx\nallow_root: true\nsandbox: {profiles: [system, npx]}\n",
                              "sandbox.profiles", "profile npx needs `state_dir: true`"),
    "uvx_without_state_dir": (OK + "sandbox: {profiles: [uvx]}\n", "sandbox.profiles",
                              "profile uvx needs `state_dir: true`"),
    "root_without_user": ("command: /bin/true\n", "user", "required when the supervisor runs as root "
                          "(user: dynamic, a user name, or allow_root: true with every capability dropped)"),
}


def serve(manifest: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "E2E_NEVER_SET"}
    return subprocess.run([PYTHON, "-m", "supervisor", "--socket", str(tmp_path / "s"), "serve",
                           "--manifests", str(manifest), "--state-root", str(tmp_path / "state")],
                          cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize("case", CASES)
def test_refused_with_file_and_key(case: str, tmp_path: Path) -> None:
    text, key, message = CASES[case]
    if case == "root_without_user" and os.geteuid() != 0:
        pytest.skip("only a root supervisor requires user or allow_root")
    manifest = tmp_path / f"{case}.yaml"
    manifest.write_text(text)
    result = serve(manifest, tmp_path)
    assert result.returncode == 2, result
    assert f"landlock-supervisor: not starting: {manifest}: {key}: {message}" in result.stderr, result.stderr
    assert not (tmp_path / "s").exists()


def test_yaml_alias_refused(tmp_path: Path) -> None:
    manifest = tmp_path / "alias.yaml"
    manifest.write_text("command: &c /bin/true\nallow_root: true\nargs: [*c]\n")
    result = serve(manifest, tmp_path)
    assert result.returncode == 2, result
    assert f"not starting: {manifest}: not valid YAML: ComposerError: aliases are not allowed" in result.stderr
    assert "line 3, column 8" in result.stderr, result.stderr


def test_one_bad_manifest_in_a_directory_names_its_file(tmp_path: Path) -> None:
    """With --manifests DIR the bad ones do not stop the good one: each is
    named (file, key, what; every unset variable at once), the good one is
    served, `check` exits 2 naming them."""
    d = tmp_path / "manifests"
    d.mkdir()
    (d / "a-good.yaml").write_text(OK)
    (d / "b-bad.yaml").write_text(OK + "sandbox: {read_only: /usr}\n")
    (d / "c-syntax.yaml").write_text("command: [unclosed\n")
    (d / "d-unset.yaml").write_text(OK + "cwd: ${E2E_NEVER_SET}\nargs: [\"${E2E_NEVER_SET_2}\"]\n")
    sock = tmp_path / "s"
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2E_NEVER_SET")}
    argv = [PYTHON, "-m", "supervisor", "--socket", str(sock)]
    proc = subprocess.Popen([*argv, "serve", "--allow-root-servers", "--manifests", str(d), "--state-root",
                             str(tmp_path / "state")], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        listed = _wait_listed(argv, sock)
        assert listed == ["a-good"], listed
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert f"{d / 'b-bad.yaml'}: sandbox.read_only: expected a list, got a string: not served" in err, err
    assert f"{d / 'c-syntax.yaml'}: not valid YAML: " in err, err
    assert (f"{d / 'd-unset.yaml'}: ${{E2E_NEVER_SET}} (cwd), ${{E2E_NEVER_SET_2}} (args[0]) are not set "
            "in the supervisor's environment: not served") in err, err
    assert "Traceback" not in err and "serving 1 manifest(s)" in err, err
    check = subprocess.run([*argv, "check", "--manifests", str(d)], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=20)
    assert check.returncode == 2, check
    assert "a-good" in check.stdout and f"BROKEN, not served: {d / 'b-bad.yaml'}: sandbox.read_only" in check.stdout
    assert check.stderr.count("\n") == 1 and "3 manifest(s) do not load" in check.stderr, check.stderr


def _wait_listed(argv: list[str], sock: Path) -> list[str]:
    for _ in range(100):
        r = subprocess.run([*argv, "list"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            return list(json.loads(r.stdout)["manifests"])
        time.sleep(0.1)
    raise AssertionError(f"the supervisor never answered on {sock}")


def test_private_mode_names_the_broken_manifest_asked_for(tmp_path: Path) -> None:
    """run --manifests DIR NAME where NAME's file is no YAML: its parser's
    error, once, and not a misleading `no manifest named`."""
    d = tmp_path / "manifests"
    d.mkdir()
    (d / "syntax.yaml").write_text("command: [unclosed\n")
    r = subprocess.run([PYTHON, "-m", "supervisor", "run", "--manifests", str(d), "--state-root",
                        str(tmp_path / "state"), "syntax"], cwd=REPO, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 2, r
    assert "no manifest named" not in r.stderr and r.stderr.count(f"{d / 'syntax.yaml'}: not valid YAML") == 1, r
    assert len(r.stderr.splitlines()) == 1, r.stderr
