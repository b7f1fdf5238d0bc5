"""A manifest that does not load stops the supervisor from starting, and the
message names the file, the key and what was expected (docs/manifests.md)."""
from __future__ import annotations

import os
import subprocess
import sys
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
    """With --manifests DIR the good ones do not carry the bad one through."""
    d = tmp_path / "manifests"
    d.mkdir()
    (d / "a-good.yaml").write_text(OK)
    (d / "b-bad.yaml").write_text(OK + "sandbox: {read_only: /usr}\n")
    result = serve(d, tmp_path)
    assert result.returncode == 2, result
    assert f"{d / 'b-bad.yaml'}: sandbox.read_only: expected a list, got a string" in result.stderr
