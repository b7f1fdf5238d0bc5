"""landlock-exec (python -m landlock) confining real programs: landrun-style
flags, the seed's exit codes, the environment, the Go-compat variable, and
the terminal (TIOCSTI)."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
from pathlib import Path

import pytest

import landlock
from landlock import Spec, gocompat
from landlock.enforce import ROOT_WARNING

USR = ["--rox", "/usr"]  # what running any program takes
# This interpreter as a confined target: its real binary, and what it reads.
PYTHON = os.path.realpath(sys.executable)
PYTHON_ROX = ["--rox", ",".join(sorted({"/usr", sys.base_prefix}))]

KERNEL_ABI = landlock.abi_version()


def run_cli(*args: str, env: dict[str, str] | None = None, wrapper: tuple[str, ...] = (),
            **kw) -> subprocess.CompletedProcess:
    """landlock-exec; its warning for capability-less root (once, first) is
    taken off stderr: test_root_without_user_is_warned_once checks it."""
    p = subprocess.run([*wrapper, sys.executable, "-m", "landlock", *args], capture_output=True,
                       text=True, env=env if env is not None else dict(os.environ), timeout=30, **kw)
    p.stderr = p.stderr.removeprefix(ROOT_WARNING + "\n")
    return p


# --- confining a real program ----------------------------------------------

@pytest.mark.enforcement
def test_cat_of_an_allowed_file(layout):
    p = run_cli(*USR, "--ro", str(layout.d), "--", "cat", str(layout.d / "file"))
    assert (p.returncode, p.stdout, p.stderr) == (0, "data", "")


@pytest.mark.enforcement
def test_cat_of_a_denied_file(layout):
    p = run_cli(*USR, "--ro", str(layout.d), "--", "cat", str(layout.out / "file"))
    assert p.returncode == 1 and p.stdout == ""
    assert "Permission denied" in p.stderr


@pytest.mark.enforcement
def test_a_single_file_rule(layout):
    p = run_cli(*USR, "--ro", str(layout.d / "file"), "cat", str(layout.d / "file"), str(layout.d / "a" / "f"))
    assert p.returncode == 1 and p.stdout == "data"
    assert "a/f: Permission denied" in p.stderr


@pytest.mark.enforcement
def test_rw_allows_writing_inside_only(layout):
    script = f"echo new > {layout.d}/new && echo ok && echo no > {layout.out}/new"
    p = run_cli(*USR, "--rw", str(layout.d), "--", "sh", "-c", script)
    assert p.returncode != 0 and p.stdout == "ok\n"
    assert (layout.d / "new").read_text() == "new\n"
    assert not (layout.out / "new").exists()


@pytest.mark.enforcement
def test_connect_tcp_flag(tcp_listener):
    code = f"import socket; socket.create_connection(('127.0.0.1', {tcp_listener}))"
    denied = run_cli(*PYTHON_ROX, "--", PYTHON, "-c", code)
    allowed = run_cli(*PYTHON_ROX, "--connect-tcp", f"1,{tcp_listener}", "--", PYTHON, "-c", code)
    if KERNEL_ABI >= 4:
        assert denied.returncode == 1 and "PermissionError" in denied.stderr
    else:  # TCP is not handled before ABI 4: downgraded, so allowed
        assert denied.returncode == 0, denied.stderr
    assert allowed.returncode == 0, allowed.stderr


# --- exit codes -----------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--ro", "--rox", "--rw", "--rwx"])
def test_help_names_the_manifest_class_of_each_path_flag(flag):
    """The flags keep landrun's names, and --ro is not a manifest's
    read_only (which executes): each flag's help names the class it really
    fills."""
    from landlock.cli import _parser, spec_from_args
    parser = _parser()
    spec = spec_from_args(parser.parse_args([flag, "/usr", "true"]))
    (cls,) = [c for c in ("read_only", "read_only_noexec", "read_write", "read_write_noexec") if getattr(spec, c)]
    help_ = next(a.help for a in parser._actions if flag in a.option_strings)
    assert help_ is not None and help_.endswith(f"(a manifest's {cls})"), help_


def test_help_says_missing_paths_fail_here_not_in_a_manifest():
    """landlock-exec fails on a missing path unless --lax-paths; a manifest
    skips one unless strict_paths: true. The reversal is said."""
    from landlock.cli import _parser, spec_from_args
    parser = _parser()
    assert spec_from_args(parser.parse_args([*USR, "true"])).strict_paths
    assert not spec_from_args(parser.parse_args([*USR, "--lax-paths", "true"])).strict_paths
    text = " ".join(parser.format_help().split())
    assert "A missing path is an error here unless --lax-paths; a manifest does the opposite" in text
    assert "--lax-paths skip missing paths instead of failing (what a manifest does unless strict_paths: true)" \
        in text


@pytest.mark.parametrize("args", [
    [],
    ["--rox", "/usr"],
    pytest.param(["--ro", "/nonexistent-landlock-test", *USR, "--", "true"],
                 marks=pytest.mark.enforcement),  # without Landlock: 3 comes first
    ["--", "true"],
    ["true"],
    [*USR, "--bind-tcp", "http", "--", "true"],
    [*USR, "--connect-tcp", "70000", "--", "true"],
    [*USR, "--rlimit", "NOFILES=64", "--", "true"],
    [*USR, "--rlimit", "NOFILE=lots", "--", "true"],
    [*USR, "--ro", "relative/path", "--", "true"],
    [*USR, "--require", "teleport", "--", "true"],
    [*USR, "--max-abi", "x", "--", "true"],
    [*USR, "--scope", "everything", "--", "true"],
], ids=["no-args", "no-command", "missing-path", "no-rule", "no-rule-positional", "bad-port-name",
        "bad-port-number", "bad-rlimit-name", "bad-rlimit-value", "relative-path", "bad-feature",
        "bad-max-abi", "bad-scope"])
def test_exit_2_bad_invocation(args):
    p = run_cli(*args)
    assert p.returncode == landlock.EXIT_USAGE, p.stderr
    assert p.stderr.strip()


@pytest.mark.parametrize("args", [
    [*USR, "--max-abi", "0", "--", "true"],
    [*USR, "--require", "tcp", "--max-abi", "3", "--", "true"],
], ids=["no-landlock", "required-feature-missing"])
def test_exit_3_unavailable(args):
    p = run_cli(*args)
    assert p.returncode == landlock.EXIT_UNAVAILABLE
    assert "unavailable" in p.stderr


@pytest.mark.enforcement
def test_exit_126_not_executable(layout):
    p = run_cli(*USR, "--rox", str(layout.d), "--", str(layout.d / "file"))
    assert p.returncode == landlock.EXIT_EXEC_FAILED
    assert "Permission denied" in p.stderr


@pytest.mark.enforcement
def test_exit_126_execute_denied_by_landlock(layout):
    p = run_cli(*USR, "--ro", str(layout.d), "--", str(layout.d / "true"))
    assert p.returncode == landlock.EXIT_EXEC_FAILED


def test_exit_127_not_on_path():
    p = run_cli(*USR, "--", "no-such-command-landlock-test")
    assert p.returncode == landlock.EXIT_NOT_FOUND
    assert "not found" in p.stderr


def test_best_effort_without_landlock_runs_unconfined(layout):
    p = run_cli(*USR, "--best-effort", "--max-abi", "0", "--", "cat", str(layout.out / "file"))
    assert (p.returncode, p.stdout) == (0, "secret")
    assert "UNCONFINED" in p.stderr


@pytest.mark.enforcement
def test_report_is_json_on_stderr():
    p = run_cli(*USR, "--report", "--", "true")
    assert p.returncode == 0
    report = landlock.Report.from_dict(json.loads(p.stderr.strip().splitlines()[-1]))
    assert report.abi == landlock.abi_version() and report.enforced and report.no_new_privs


# --- the target's environment, rlimits, signals -----------------------------------

@pytest.mark.enforcement
def test_env_builds_the_whole_environment():
    env = {**os.environ, "HOME": "/home/landlock-test", "SECRET": "leak"}
    p = run_cli(*USR, "--env", "FOO=bar", "--pass-env", "HOME", "--pass-env", "UNSET_LANDLOCK_TEST", "--", "env",
                env=env)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["FOO=bar", "HOME=/home/landlock-test"]
    assert "deprecated" not in p.stderr


@pytest.mark.enforcement
def test_env_set_wins_over_pass_env():
    p = run_cli(*USR, "--pass-env", "FOO", "--env", "FOO=set", "--", "env", env={**os.environ, "FOO": "here"})
    assert (p.returncode, p.stdout) == (0, "FOO=set\n"), p.stderr


@pytest.mark.enforcement
def test_bare_env_still_passes_with_one_line_naming_pass_env():
    """`--env NAME` (passed from here) was the old spelling of --pass-env:
    it works for one release, said once on stderr, however often given."""
    env = {**os.environ, "HOME": "/home/landlock-test", "USER": "u"}
    p = run_cli(*USR, "--env", "HOME", "--env", "USER", "--env", "A=b", "--", "env", env=env)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["A=b", "HOME=/home/landlock-test", "USER=u"]
    warnings = [line for line in p.stderr.splitlines() if "deprecated" in line]
    assert warnings == ["landlock-exec: warning: --env HOME is deprecated: use --pass-env HOME "
                        "(--env takes NAME=VALUE)"]


@pytest.mark.enforcement
def test_rlimit_flag():
    p = run_cli(*USR, "--rlimit", "NOFILE=64", "--", "sh", "-c", "ulimit -n; ulimit -Hn")
    assert (p.returncode, p.stdout) == (0, "64\n64\n")


def _as_under_nohup() -> None:
    """What `nohup` leaves (SIGHUP ignored), and a blocked signal besides."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})


@pytest.mark.enforcement
@pytest.mark.parametrize("caller", [None, _as_under_nohup], ids=["plain", "nohup"])
def test_target_gets_default_signal_dispositions(caller):
    """Python ignores SIGPIPE and SIGXFSZ, a caller under nohup SIGHUP, and
    ignored or blocked signals survive exec: a server gets the defaults,
    as the supervisor's children do, however the test suite was started."""
    p = run_cli(*USR, "--ro", "/proc", "--", "grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status",
                preexec_fn=caller)
    assert p.stdout.split() == ["SigBlk:", "0" * 16, "SigIgn:", "0" * 16], p.stdout + p.stderr


# --- specs carried by the environment --------------------------------------------

def _with_go_spec(spec: dict) -> dict[str, str]:
    return {**os.environ, "SECRET": "passed", gocompat.ENV_GO_SPEC: json.dumps(spec)}


@pytest.mark.enforcement
def test_go_spec_zero_value_restricts_no_path_and_passes_the_environment(layout):
    env = _with_go_spec({})
    p = run_cli("--", "sh", "-c", f"cat {layout.out}/file; echo; env", env=env)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out[0] == "secret"
    assert "SECRET=passed" in out
    assert not any(line.startswith(gocompat.ENV_GO_SPEC) for line in out)


@pytest.mark.enforcement
def test_go_spec_paths_and_rlimits(layout):
    env = _with_go_spec({"ReadOnlyPaths": ["/usr", str(layout.d), str(layout.root / "missing")],
                         "ReadWritePaths": [str(layout.d / "b")],
                         "Rlimits": [{"Resource": 7, "Cur": 64, "Max": 64}], "BestEffort": False})
    script = (f"ulimit -n; cat {layout.d}/file; echo; echo w > {layout.d}/b/w && echo wrote; "
              f"env | grep -c {gocompat.ENV_GO_SPEC}; cat {layout.out}/file")
    p = run_cli("--", "sh", "-c", script, env=env)
    assert p.stdout.splitlines() == ["64", "data", "wrote", "0"]
    assert "Permission denied" in p.stderr and p.returncode == 1


@pytest.mark.enforcement
def test_native_spec_variable(layout):
    spec = Spec(read_only=("/usr",), read_only_noexec=(str(layout.d),))
    env = {**os.environ, gocompat.ENV_NATIVE_SPEC: spec.to_json()}
    p = run_cli("--", "sh", "-c", f"cat {layout.d}/file; echo; env | grep -c SPEC; cat {layout.out}/file",
                env=env)
    assert p.stdout.splitlines() == ["data", "0"]
    assert "Permission denied" in p.stderr


@pytest.mark.parametrize("flags", [["--ro", "/usr"], ["--rlimit", "NOFILE=64"], ["--env", "A=b"],
                                   ["--pass-env", "A"], ["--best-effort"], ["--max-abi", "3"]])
def test_spec_in_environment_and_spec_flags_is_refused(flags):
    p = run_cli(*flags, "--", "true", env=_with_go_spec({}))
    assert p.returncode == landlock.EXIT_USAGE
    assert "together" in p.stderr


def test_go_spec_adapter():
    spec = gocompat.spec_from_go(json.dumps({
        "ReadOnlyPaths": None, "ReadWritePaths": ["/tmp"], "BestEffort": True,
        "Rlimits": [{"Resource": 7, "Cur": 64, "Max": 2**64 - 1}]}))
    assert spec.read_write == ("/tmp",) and spec.read_only == ()
    assert spec.best_effort and not spec.unrestricted_filesystem and spec.unrestricted_network
    assert [(r.name, r.soft, r.hard) for r in spec.rlimits] == [("NOFILE", 64, -1)]
    assert gocompat.spec_from_go("{}").unrestricted_filesystem


@pytest.mark.parametrize("text,what", [("[]", "object"), ('{"ReadOnly": []}', "ReadOnly"),
                                       ('{"Rlimits": [{"Resource": 99}]}', "Rlimits"), ("{", "JSON")])
def test_go_spec_errors(text, what):
    with pytest.raises(landlock.SpecError, match=what):
        gocompat.spec_from_go(text)


# --- the terminal -------------------------------------------------------------

_TIOCSTI = r"""
import fcntl, sys, termios
try:  # adopt the terminal if nobody holds it (a new session's leader may)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
except OSError:
    pass
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"x")
except OSError as e:
    print(e.errno)
    sys.exit(1)
"""


# landlock-exec as the terminal's session leader (as under a terminal
# emulator or sshd), as another member of its session (under a shell), or
# given a pty nobody made a controlling terminal.
SESSION_ROLES = {"leader": (), "member": ("sh", "-c", '"$@"; exit $?', "sh"), "nobody": ()}


def _tiocsti_under_a_terminal(*flags: str, role: str = "leader") -> tuple[subprocess.CompletedProcess, bytes]:
    """landlock-exec with a pty as stdin; the target tries to push a
    keystroke into it. Returns what ran and what the pty's input got."""
    master, slave = os.openpty()
    kw = {} if role == "nobody" else dict(start_new_session=True,
                                          preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    try:
        p = run_cli(*PYTHON_ROX, *flags, "--", PYTHON, "-c", _TIOCSTI, stdin=slave,
                    wrapper=SESSION_ROLES[role], **kw)
        os.set_blocking(master, False)
        try:
            echoed = os.read(master, 100)
        except BlockingIOError:
            echoed = b""
        return p, echoed
    finally:
        os.close(master)
        os.close(slave)


def _legacy_tiocsti() -> bool:
    try:
        return Path("/proc/sys/dev/tty/legacy_tiocsti").read_text().strip() == "1"
    except FileNotFoundError:
        return True  # before 6.2: always allowed


@pytest.mark.enforcement
def test_tiocsti_into_the_session_terminal_fails():
    """Under a shell, the shell's session holds the terminal after
    landlock-exec leaves it: TIOCSCTTY and TIOCSTI both fail."""
    p, echoed = _tiocsti_under_a_terminal(role="member")
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert p.stdout.strip() in ("1", "5")  # EPERM: not our terminal any more; EIO: legacy TIOCSTI off
    assert echoed == b""


@pytest.mark.enforcement
@pytest.mark.parametrize("role", ["leader", "nobody"])
def test_an_adoptable_terminal_is_refused(role):
    """Leading the terminal's session, landlock-exec frees it when it leaves;
    a pty nobody made controlling is free already: the target could adopt
    it (TIOCSCTTY) and inject input (TIOCSTI). Refused unless --allow-terminal."""
    p, echoed = _tiocsti_under_a_terminal(role=role)
    if not _legacy_tiocsti():
        # dev.tty.legacy_tiocsti=0: the kernel refuses TIOCSTI without
        # CAP_SYS_ADMIN, so landlock-exec refuses nothing; nothing gets in.
        assert p.returncode != 2 and echoed == b"", (p.returncode, p.stderr)
        return
    assert p.returncode == 2 and "--allow-terminal" in p.stderr and echoed == b""
    p, echoed = _tiocsti_under_a_terminal("--allow-terminal", role=role)
    assert (p.returncode, p.stdout) == (0, "") and echoed == b"x"  # the cost the flag accepts


@pytest.mark.enforcement
def test_a_terminal_is_accepted_when_tiocsti_is_off(monkeypatch):
    from landlock import enforce
    monkeypatch.setattr(enforce, "_legacy_tiocsti", lambda: False)
    assert enforce.adoptable_terminals() == []


@pytest.mark.enforcement
def test_tiocsti_with_keep_session_succeeds():
    p, _ = _tiocsti_under_a_terminal("--keep-session")
    if not _legacy_tiocsti():  # dev.tty.legacy_tiocsti=0: refused to everyone without CAP_SYS_ADMIN
        assert (p.returncode, p.stdout.strip()) == (1, "5")
        return
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")


# --- as root --------------------------------------------------------------

@pytest.mark.enforcement
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
@pytest.mark.parametrize("flags,warned", [((), True), (("--user", "root"), True),
                                          (("--user", "65534"), False), (("--keep-capabilities",), False)],
                         ids=["no-user", "user-root", "user-nobody", "keep-capabilities"])
def test_root_without_user_is_warned_once(flags, warned):
    """Capability-less root can still chmod root's own files outside the grants."""
    p = subprocess.run([sys.executable, "-m", "landlock", *USR, *flags, "--report", "--", "true"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count(ROOT_WARNING) == (1 if warned else 0)
    assert "--user" in ROOT_WARNING and "root" in ROOT_WARNING
    assert json.loads(p.stderr.splitlines()[-1])["capabilities_dropped"] == ("--keep-capabilities" not in flags)
