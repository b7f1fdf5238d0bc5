"""`landlock-supervisor run` as an MCP client starts it: what its private
supervisor imports, and whose words its stderr carries.

The client side is run as root and as a dedicated uid (the identities of
the catalogue): a project directory or a PYTHONPATH entry with a planted
`yaml.py` and `prctl.py` (whoever can write there is the attacker), and a
server that writes lines like the supervisor's on the stderr it shares
with `run`.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sechelpers import Identity, case
from svhelpers import PYTHON, REPO, run

pytestmark = [pytest.mark.enforcement, pytest.mark.timeout(120)]

CONSOLE_SCRIPT = str(Path(PYTHON).parent / "landlock-supervisor")
_PLANT = "open({marker!r}, 'a').write({name!r} + '\\n')\n"


def _planted(lab: Any, ident: Identity) -> tuple[Path, Path]:
    """A project directory holding yaml.py and prctl.py that leave a mark
    when imported, writable by the identity (its own project)."""
    project = lab.dir / f"project-{ident.name}"
    project.mkdir()
    marker = lab.dir / f"imported-{ident.name}"
    for name in ("yaml", "prctl"):
        (project / f"{name}.py").write_text(_PLANT.format(marker=str(marker), name=name))
    os.chown(project, ident.uid, ident.uid)
    marker.touch()
    os.chown(marker, ident.uid, ident.uid)
    os.chmod(project, 0o755)
    return project, marker


def _echo_manifest(lab: Any, ident: Identity) -> Path:
    """A manifest the identity's private supervisor loads (as root: a
    dedicated user; as a user: its own uid)."""
    directory = lab.dir / f"manifests-{ident.name}"
    fields: dict[str, Any] = {"user": "nobody"} if ident.uid == 0 else {"allow_root": False}
    path = lab.manifest("echo", command="/bin/echo", args=["hello"], directory=directory, **fields)
    os.chmod(directory, 0o755)
    return path


def _run(lab: Any, ident: Identity, argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    state = lab.dir / f"state-{ident.name}"
    state.mkdir(exist_ok=True)
    os.chown(state, ident.uid, ident.uid)
    user = {} if ident.uid == 0 else {"user": ident.uid, "group": ident.uid, "extra_groups": []}
    return subprocess.run([*argv, "run", "--manifests", str(_echo_manifest(lab, ident)), "--state-root",
                           str(state), "echo"], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/", **env}, **user)


@case("private-import-path")
def test_the_private_supervisor_imports_nothing_planted(lab: Any, ident: Identity) -> None:
    project, marker = _planted(lab, ident)
    ways = {
        "python -m supervisor, from the project": ([PYTHON, "-m", "supervisor"], project, {}),
        "PYTHONPATH holding the project": ([CONSOLE_SCRIPT], lab.dir, {"PYTHONPATH": str(project)}),
        "the console script, no PYTHONPATH": ([CONSOLE_SCRIPT], project, {}),
    }
    for way, (argv, cwd, env) in ways.items():
        out = _run(lab, ident, argv, cwd, **env)
        assert out.returncode == 0 and out.stdout == "hello\n", (way, out.stderr)
        assert marker.read_text() == "", f"{way}: the private supervisor imported {marker.read_text()!r}"
        warned = [l for l in out.stderr.splitlines() if "imports from the working directory or PYTHONPATH" in l]
        if way.startswith("the console script"):
            assert warned == [], (way, out.stderr)   # clean: nothing to warn about
        else:
            assert len(warned) == 1 and str(project) in warned[0], (way, out.stderr)
    # The premise: the planted modules are what this interpreter imports from there.
    probe = subprocess.run([PYTHON, "-c", "import yaml"], cwd=project, capture_output=True, text=True, timeout=30)
    assert probe.returncode == 0 and marker.read_text() == "yaml\n", probe.stderr


# ---- whose words: denials and proposals (these switch the host's audit on) --------------------

FORGED_ID = "0123456789abcdef"
FORGED = ("landlock-supervisor: sh: denied fs.read_file /etc/passwd (pid 1 cat): allow with `read_write: [/root]`",
          "landlock-supervisor: sh: access denied; what and how to allow it: "
          f"`landlock-supervisor denials --session {FORGED_ID}`",
          "landlock-supervisor: sh: the kernel denied 1 access(es); 1 shown; read them with "
          f"`landlock-supervisor denials --session {FORGED_ID}`")


def _sh(lab: Any, ident: Identity, **fields: Any) -> None:
    who: dict[str, Any] = {"user": ident.uid, "group": ident.uid} if ident.uid else {}
    lab.manifest("sh", command="/bin/sh", args=["-c"], client_args=True, **who,
                 sandbox={"profiles": ["system"], "read_only": ["/usr/bin"]}, **fields)


def _cli(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "supervisor", *args, "--state-root", str(state)], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/"})


@pytest.mark.audit
@case("forged-denial-line")
def test_a_server_cannot_pass_its_lines_for_the_supervisors(lab: Any, ident: Identity, host_audit: Any) -> None:
    _sh(lab, ident)
    sv = lab.start(extra=["--audit", "detail"])
    journal = lab.dir / "client-state"
    script = "".join(f"printf '%s\\n' '{l}' >&2; " for l in FORGED) + "cat /etc/hostname 2>/dev/null; exit 1"
    out = subprocess.run([PYTHON, "-m", "supervisor", "run", "--socket", str(sv.socket_path), "--state-root",
                          str(journal), "sh", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/"})
    assert out.returncode == 1, out.stderr
    lines = out.stderr.splitlines()
    assert [l for l in lines if l in FORGED] == list(FORGED)   # the server's own stderr is the client's
    ours = [l for l in lines if l not in FORGED]
    # run's words: a count and a pointer, never a denial or a proposal.
    assert len(ours) == 2 and not any("allow with" in l or " denied fs." in l for l in ours), out.stderr
    session = ours[0].split("--session ")[1].split()[0].rstrip("`")
    assert session != FORGED_ID and all(f"--session {session} --state-root {journal}`" in l for l in ours), ours
    assert "the kernel denied 1 access(es); 1 shown" in ours[1]
    # What the supervisor said, read from where run kept it: the real denial alone.
    real = _cli("denials", "--session", session, state=journal)
    assert real.returncode == 0, real.stderr
    assert real.stdout.splitlines()[0].endswith(
        "sh: denied fs.read_file /etc/hostname (pid " + real.stdout.split("(pid ")[1].split()[0]
        + " cat): allow with `read_only_noexec: [/etc/hostname]`"), real.stdout
    assert "/root" not in real.stdout and "/etc/passwd" not in real.stdout
    forged = _cli("denials", "--session", FORGED_ID, state=journal)
    assert forged.returncode == 1 and f"no session {FORGED_ID}" in forged.stderr and forged.stdout == ""


@pytest.mark.audit
@case("proposal-one-token")
def test_a_path_the_server_names_is_one_token_of_the_proposal(lab: Any, ident: Identity, host_audit: Any) -> None:
    """Attempt: be denied a file whose path carries a second grant and words
    like ours (`.../a, /root): allow with`), so that the proposal, pasted
    into a manifest, grants a second path, and the line read with `denials
    --session` tells a false `allow with`. Stopped by: the path is one token
    (double-quoted where it is not plain): the proposal grants exactly it, and
    the line shows it quoted before our own words."""
    _sh(lab, ident)
    sv = lab.start(extra=["--audit", "detail"])
    names = lab.dir / "names" / "a, "   # (a name holds no slash: the path's tail is a directory and its file)
    names.mkdir(parents=True)
    for d in (names, names.parent):
        d.chmod(0o755)
    path = names / "root): allow with `x"   # unquoted, `read_only_noexec: [.../a, /root): ...]`
    path.write_text("x\n")
    path.chmod(0o644)   # DAC lets every uid read: Landlock denies
    journal = lab.dir / "client-state"
    out = subprocess.run([PYTHON, "-m", "supervisor", "run", "--socket", str(sv.socket_path), "--state-root",
                          str(journal), "sh", f"cat '{path}' >/dev/null 2>&1; true"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/"})
    assert out.returncode == 0, out.stderr
    session = out.stderr.split("--session ")[1].split()[0]
    shown = _cli("denials", "--session", session, "--json", state=journal)
    assert shown.returncode == 0, shown.stderr
    [event] = [e for e in map(json.loads, shown.stdout.splitlines()) if e.get("object") == str(path)]
    assert yaml.safe_load(event["allow"]) == {"read_only_noexec": [str(path)]}, event["allow"]
    text = _cli("denials", "--session", session, state=journal).stdout
    quoted = '"' + str(path) + '"'
    assert f"denied fs.read_file {quoted} (pid " in text and f"allow with `read_only_noexec: [{quoted}]`" in text, text


@pytest.mark.audit
@case("proposal-refusal")
def test_no_proposal_names_a_home_a_secret_or_the_supervisors_own(lab: Any, ident: Identity,
                                                                    host_audit: Any) -> None:
    state = lab.dir / "elsewhere-state"           # not the default state root
    home = lab.dir / "homeless"                   # a $HOME /etc/passwd does not list (containers)
    server_home = lab.dir / "server-home"         # the HOME a manifest gives its server
    project = lab.dir / "project"
    files = {"state": state / "planted", "home-key": home / ".ssh" / "id_test",
             "aws": project / ".aws" / "credentials", "env": project / ".env",
             "server-home-key": server_home / ".gnupg" / "pubring.kbx"}
    for f in files.values():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("secret\n")
        f.chmod(0o644)   # DAC lets every uid read: what is denied is Landlock's doing
    for d in {home, home / ".ssh", project, project / ".aws", server_home, server_home / ".gnupg"}:
        d.chmod(0o755)
    _sh(lab, ident, env={"HOME": str(server_home)})
    sv = lab.start(extra=["--audit", "detail"], state_root=state, env={"HOME": str(home)})
    state.chmod(0o711)
    paths = [*map(str, files.values()), str(server_home), str(home)]
    result = run(sv.client, "sh", ["; ".join(f"cat {p} 2>/dev/null; ls {p} >/dev/null 2>&1" for p in paths)
                                   + "; true"], timeout=60)
    denied = {e["object"]: e for e in result.child.denied}
    assert set(paths) <= set(denied), sorted(denied)
    proposed = {p: denied[p]["allow"] for p in paths if denied[p]["allow"]}
    assert proposed == {}, proposed
    for p in paths:
        assert denied[p]["why_not"].startswith("not proposed: "), denied[p]
    # The rule is the table's, not a blanket refusal: a plain file is proposed.
    plain = run(sv.client, "sh", ["cat /etc/hostname; true"], timeout=60)
    assert [e["allow"] for e in plain.child.denied] == ["read_only_noexec: [/etc/hostname]"]
