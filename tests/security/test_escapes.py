"""The escape catalogue: a confined child of a real supervisor tries, for
real, to get out; each test says what it attempts and what stops it.

Every case runs twice: as a dedicated unprivileged uid (64100, the real
deployment: a root supervisor with `user:`) and as capability-less root
(`allow_root: true`). Files the child must be able to read are
world-readable and the directories it attacks are world-writable, so that
a denial comes from Landlock (or from what the case names), not from DAC.
Each case id matches a row of the Escape catalogue in docs/security.md.
Resource bombs run under another dedicated uid (64101) only.
"""
from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from sechelpers import (BOMB, BOMB_UID, FOREIGN_UID, IDENTITIES, KERNEL_ABI, Arena, Outcome, accepted, attack, case,
                        through_a_terminal)
from supervisor.daemon import procfs
from supervisor.client import SupervisorError
from svhelpers import alive, wait_until

pytestmark = pytest.mark.enforcement


def _errnos(outcome: Outcome) -> list[str | None]:
    return [outcome.errname(i) for i in range(len(outcome.results))]


# ---- reading --------------------------------------------------------------------------------------

@pytest.mark.timeout(30)
@case("read-direct")
def test_read_secret_directly(fresh, ident):
    """Attempt: open a world-readable file outside every rule.
    Stopped by: Landlock (no rule grants READ_FILE there): EACCES."""
    o = fresh.attack(ident, [["read", fresh.p("allowed/public")], ["read", fresh.p("secret/secret")]])
    assert o[0]["ok"] and o[0]["value"] == "public\n", o   # the control: a granted file reads
    assert o.errname(1) == "EACCES", o


@pytest.mark.timeout(30)
@case("read-symlink")
def test_read_through_planted_symlink(fresh, ident):
    """Attempt: plant a symlink to the secret in a writable, granted
    directory and read through it. Stopped by: Landlock checks the path the
    open resolves to, not the one named: EACCES."""
    link = fresh.rw(ident, "link")
    o = fresh.attack(ident, [["symlink", fresh.p("secret/secret"), link], ["read", link]])
    assert o[0]["ok"], o                       # planting is allowed (MAKE_SYM)
    assert o.errname(1) == "EACCES", o


@pytest.mark.timeout(30)
@case("read-dotdot")
def test_read_through_dotdot(fresh, ident):
    """Attempt: climb out of a granted directory with `..`.
    Stopped by: Landlock walks the resolved path: EACCES."""
    o = fresh.attack(ident, [["read", fresh.p("allowed/../secret/secret")],
                             ["read", fresh.p("allowed/../../a/allowed/../secret/secret")]])
    assert _errnos(o) == ["EACCES", "EACCES"], o


@pytest.mark.timeout(30)
@case("read-proc-root")
def test_read_through_proc_self_root(fresh, ident):
    """Attempt: reach the secret through /proc/self/root and
    /proc/self/cwd magic links (/proc is granted). Stopped by: the magic
    link resolves to the real path, which Landlock checks: EACCES."""
    o = fresh.attack(ident, [["read", "/proc/self/root" + fresh.p("secret/secret")],
                             ["read", f"/proc/{fresh.sv.pid}/root" + fresh.p("secret/secret")],
                             ["read", "/proc/1/root" + fresh.p("secret/secret")]])
    assert o.errname(0) == "EACCES", o
    # Another process's root link: the ptrace access check (Landlock's, and
    # DAC's for another uid) refuses to follow it.
    assert o.errname(1) == "EACCES" and o.errname(2) == "EACCES", o


@pytest.mark.timeout(30)
@case("link-secret")
def test_hard_link_to_secret(fresh, ident):
    """Attempt: hard-link the secret (world-writable, so
    fs.protected_hardlinks lets any uid link it) into a writable, granted
    directory, then read it there. Stopped by: Landlock: a link into
    another directory is a reparenting (REFER), refused when the source is
    not granted at least what the destination grants: EXDEV."""
    dst = fresh.rw(ident, "stolen")
    o = fresh.attack(ident, [["link", fresh.p("secret/secret"), dst], ["read", dst]])
    assert o.errname(0) == "EXDEV", o
    assert o.errname(1) == "ENOENT", o


# ---- writing ----------------------------------------------------------------------------------------

@pytest.mark.timeout(30)
@case("write-outside")
def test_write_create_remove_outside(fresh, ident):
    """Attempt: write, create, mkdir, symlink, mkfifo, remove, rename and
    link in a world-writable directory with no rule, and in a read-only
    granted one. Stopped by: Landlock (WRITE_FILE, MAKE_*, REMOVE_* not
    granted there): EACCES; a same-directory link/rename lacks MAKE_REG."""
    s, a = fresh.p("secret"), fresh.p("allowed")
    ops = [["open_write", f"{s}/secret"], ["create", f"{s}/new"], ["mkdir", f"{s}/dir"],
           ["symlink", "/etc/passwd", f"{s}/sym"], ["mkfifo", f"{s}/fifo"], ["unlink", f"{s}/secret"],
           ["rename", f"{s}/secret", f"{s}/renamed"], ["link", f"{s}/secret", f"{s}/linked"],
           ["open_write", f"{a}/public"], ["create", f"{a}/new"], ["unlink", f"{a}/public"],
           ["rename", f"{a}/public", f"{a}/renamed"], ["write_file", f"{fresh.rw(ident)}ok", "ok"]]
    o = fresh.attack(ident, ops)
    assert _errnos(o) == ["EACCES"] * 12 + [None], o
    assert (fresh.root / "secret" / "secret").exists() and (fresh.root / "allowed" / "public").exists()
    assert sorted(os.listdir(fresh.root / "secret")) == sorted(
        ["secret", "sock", *(f"own-{i.name}" for i in IDENTITIES)])


@pytest.mark.timeout(30)
@case("rename-into-readonly")
def test_rename_across_directories(fresh, ident):
    """Attempt: move a file from a writable directory into a read-only one
    and into one with no rule, and one out of a read-only directory.
    Stopped by: Landlock: the destination lacks MAKE_REG, or the source
    REMOVE_FILE: EACCES (EXDEV only when REFER alone is missing). Between
    two read_write_noexec trees the rename works (both grant REFER)."""
    src = fresh.rw(ident, "f")
    ops = [["write_file", src, "x"], ["rename", src, fresh.p("allowed/f")],
           ["rename", src, fresh.p("secret/f")], ["rename", fresh.p("allowed/public"), fresh.rw(ident, "p")],
           ["rename", src, str(fresh.root / "rw2" / ident.name / "f")]]
    o = fresh.attack(ident, ops)
    assert o[0]["ok"], o
    assert _errnos(o)[1:4] == ["EACCES"] * 3, o
    assert o[4]["ok"], o
    assert not (fresh.root / "allowed" / "f").exists() and not (fresh.root / "secret" / "f").exists()


@pytest.mark.timeout(30)
@case("truncate-readonly")
def test_truncate_read_only_file(fresh, ident):
    """Attempt: truncate a world-writable file in a read-only directory,
    by truncate(2) and by open(O_TRUNC). Stopped by: Landlock TRUNCATE
    (ABI 3) and WRITE_FILE: EACCES."""
    pub = fresh.p("allowed/public")
    o = fresh.attack(ident, [["truncate", pub], ["open_trunc", pub]])
    assert _errnos(o) == ["EACCES", "EACCES"], o
    assert (fresh.root / "allowed" / "public").read_text() == "public\n"


# ---- executing ----------------------------------------------------------------------------------------

@pytest.mark.timeout(30)
@case("exec-noexec")
def test_exec_from_writable_noexec_dir(fresh, ident):
    """Attempt: copy a binary into a read_write_noexec directory and run
    it; run one from a read_only_noexec directory. Stopped by: Landlock
    EXECUTE, checked at execve: EACCES. (Through the dynamic loader or a
    memfd it runs: see the limits.)"""
    dst = fresh.rw(ident, "t")
    o = fresh.attack(ident, [["copy", fresh.p("allowed/true"), dst], ["exec", dst],
                             ["exec", fresh.p("allowed/true")], ["exec", fresh.p("exec/true")]])
    assert o[0]["ok"], o
    assert o.errname(1) == "EACCES" and o.errname(2) == "EACCES", o
    assert o[3]["ok"] and o[3]["value"]["status"] == 0, o   # the control: exec where granted


@pytest.mark.timeout(30)
@case("setuid-root")
def test_setuid_root_binary(fresh, ident):
    """Attempt: run a setuid-root copy of cat (in an executable, granted
    directory) and read /proc/self/status through it. Stopped by:
    no_new_privs: execve ignores the setuid bit; the euid stays the child's
    and no capability comes back (for root: the bounding set is empty and
    SECBIT_NOROOT is locked)."""
    o = fresh.attack(ident, [["exec", fresh.p("exec/suid-cat"), "/proc/self/status"], ["ids"]])
    assert o[0]["ok"], o
    status = dict(line.split(":", 1) for line in o[0]["value"]["out"].splitlines() if ":" in line)
    assert status["Uid"].split() == [str(ident.uid)] * 4, status["Uid"]
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, status
    assert status["NoNewPrivs"].strip() == "1"
    assert o[1]["value"]["NoNewPrivs"] == ["1"]


# ---- other processes --------------------------------------------------------------------------------

@pytest.mark.timeout(30)
@case("signal-outside")
def test_signal_outside_the_domain(fresh, ident):
    """Attempt: SIGTERM the supervisor, and a process outside the domain
    running as the child's own uid (DAC would allow it). Stopped by: the
    ABI 6 signal scope: EPERM. (For the unprivileged uid, DAC refuses the
    root supervisor too.) Signalling its own children works."""
    target = fresh.targets[ident.name]
    o = fresh.attack(ident, [["kill", fresh.sv.pid, signal.SIGTERM], ["kill", target.pid, signal.SIGTERM],
                             ["kill", target.pid, 0], ["kill", os.getpid(), signal.SIGTERM]])
    assert _errnos(o) == ["EPERM"] * 4, o
    assert target.poll() is None
    assert fresh.sv.client.ping()["pid"] == fresh.sv.pid


@pytest.mark.timeout(30)
@case("ptrace-supervisor")
def test_ptrace_and_proc_of_the_supervisor(fresh, ident):
    """Attempt: PTRACE_ATTACH to the supervisor, process_vm_readv its
    memory, open /proc/PID/mem and /proc/PID/environ (/proc is granted).
    Stopped by: Landlock's ptrace restriction (a domain may not trace
    outside itself), and DAC for another uid: EPERM/EACCES."""
    pid = fresh.sv.pid
    o = fresh.attack(ident, [["ptrace_attach", pid], ["process_vm_readv", pid], ["proc_mem", pid],
                             ["read", f"/proc/{pid}/environ"], ["ptrace_attach", fresh.targets[ident.name].pid]])
    assert o.errname(0) == "EPERM" and o.errname(1) == "EPERM", o
    assert o.errname(2) == "EACCES" and o.errname(3) == "EACCES", o
    assert o.errname(4) == "EPERM", o
    assert fresh.canary not in json.dumps(o.results)


@pytest.mark.timeout(30)
@case("supervisor-environment")
def test_supervisor_environment(fresh, ident):
    """Attempt: find the supervisor's environment (a secret in it) in the
    child's own. Stopped by: the child's environment is built from the
    manifest only (env + inherit_env + client_env)."""
    o = fresh.attack(ident, [["environ"]])
    env = o[0]["value"]
    assert fresh.canary not in json.dumps(env), env
    assert "LLSV_SUPERVISOR_SECRET" not in env
    assert set(env) <= {"LLS_TEST_TAG", "LC_CTYPE"}, env


@pytest.mark.timeout(30)
@case("inherited-fds")
def test_no_fd_beyond_stdio(fresh, ident):
    """Attempt: find any fd beyond 0, 1, 2 (the listener, other clients'
    connections, ruleset fds, pidfds...) while other connections are open.
    Stopped by: fds received with MSG_CMSG_CLOEXEC, everything the
    supervisor opens O_CLOEXEC, and close_range in the child."""
    from svhelpers import connect
    idle = [connect(str(fresh.sv.socket_path)) for _ in range(3)]
    try:
        o = fresh.attack(ident, [["fds"]])
    finally:
        for s in idle:
            s.close()
    fds = [fd for fd, _ in o[0]["value"]]
    assert fds == [0, 1, 2], o


# ---- sockets ---------------------------------------------------------------------------------------

@pytest.mark.timeout(30)
@case("abstract-socket")
def test_connect_abstract_unix_socket(fresh, ident):
    """Attempt: connect to an abstract Unix socket bound outside the
    sandbox. Stopped by: the ABI 6 abstract-socket scope: EPERM."""
    o = fresh.attack(ident, [["connect_abstract", fresh.abstract]])
    assert o.errname(0) == "EPERM", o
    assert accepted(fresh.listeners["abstract"], 0.05) is None


@pytest.mark.timeout(30)
@case("supervisor-spawn")
def test_obtain_a_spawn_from_the_supervisor(fresh, ident):
    """Attempt: connect to the supervisor's socket (reachable: pathname
    sockets are not restricted before ABI 9, and this supervisor admits
    uid 64100) and ask for an unconfined-by-this-domain spawn. Stopped by:
    the supervisor refuses a peer that descends from it (SO_PEERCRED +
    pidfd + ppid chain): refused_peer."""
    before = fresh.sv.client.stats()
    o = fresh.attack(ident, [["supervisor_spawn", str(fresh.sv.socket_path), ident.manifest]])
    if KERNEL_ABI >= 9 and not o[0]["ok"]:
        assert o.errname(0) == "EACCES", o      # FS_RESOLVE_UNIX stopped it first
    else:
        assert o[0]["ok"], o
        assert o[0]["value"]["event"] == "error" and o[0]["value"]["code"] == "refused_peer", o
    after = fresh.sv.client.stats()
    assert after["spawned"] == before["spawned"] + 1   # the attacker itself, nothing else


@pytest.mark.timeout(30)
@case("tcp-unlisted")
def test_tcp_to_unlisted_ports(fresh, ident):
    """Attempt: TCP connect (IPv4 and IPv6) and bind to ports the manifest
    does not list. Stopped by: Landlock CONNECT_TCP / BIND_TCP (ABI 4):
    EACCES. The listed ports work."""
    P = fresh.ports
    ops = [["tcp_connect", P["tcp_denied"]], ["tcp_bind", P["bind_denied"]], ["tcp_connect", P["tcp_ok"]],
           ["tcp_bind", P["bind_ok"]]]
    if "tcp6_denied" in P:
        ops.append(["tcp_connect", P["tcp6_denied"], 6])
    o = fresh.attack(ident, ops)
    assert o.errname(0) == "EACCES" and o.errname(1) == "EACCES", o
    assert o[2]["ok"] and o[3]["ok"], o
    if "tcp6_denied" in P:
        assert o.errname(4) == "EACCES", o
    assert accepted(fresh.listeners["tcp_denied"], 0.05) is None
    assert accepted(fresh.listeners["tcp_ok"]) == b"hello from the sandbox"


# ---- the terminal, devices, metadata ------------------------------------------------------------------

@pytest.mark.timeout(30)
@case("tiocsti")
def test_tiocsti_into_inherited_terminal(fresh, ident):
    """Attempt: get a terminal (a pty) as stdin, make it the controlling
    terminal of the child's new session (TIOCSCTTY: the child leads a
    session without one) and push keystrokes into it (TIOCSTI). Stopped by:
    the supervisor refuses a terminal as stdin, stdout or stderr unless the
    manifest says `terminal: true` (`run` relays a terminal through pipes):
    bad_fds, and no child runs. (With `terminal: true` the attack works:
    the `tiocsti-terminal` limit.) Landlock's IOCTL_DEV right is checked
    at open(), so it does not cover an inherited fd."""
    before = fresh.sv.client.stats()["spawned"]

    def refused(slave: int) -> Any:
        with pytest.raises(SupervisorError) as e:
            fresh.attack(ident, [["tiocsctty"], ["tiocsti", "id\n"]], stdin=slave)
        return e
    e, echoed = through_a_terminal(refused)
    assert e.value.code == "bad_fds" and "terminal" in str(e.value), e.value
    assert echoed == b""
    assert fresh.sv.client.stats()["spawned"] == before


@pytest.mark.timeout(30)
@case("mknod")
def test_create_device_node(fresh, ident):
    """Attempt: mknod /dev/null's twin (char 1:3) in a writable directory and
    in one with no rule. Stopped by: Landlock, checked first (no path class
    grants MAKE_CHAR): EACCES; behind it, CAP_MKNOD is gone too."""
    o = fresh.attack(ident, [["mknod_char", fresh.rw(ident, "null")], ["mknod_char", fresh.p("secret/null")]])
    assert _errnos(o) == ["EACCES", "EACCES"], o
    assert not os.path.exists(fresh.rw(ident, "null"))


@pytest.mark.timeout(30)
@case("chmod-chown-foreign")
def test_chmod_chown_foreign_files(fresh, ident):
    """Attempt: chmod and chown files outside the rules that the child does
    not own (root-owned; owned by another uid). Not Landlock's (it does not
    handle metadata): DAC refuses the unprivileged uid, and capability-less
    root lacks CAP_FOWNER/CAP_CHOWN: EPERM."""
    f = fresh.p("foreign")
    ops = [["chmod", f"{f}/other-owned", "777"], ["chown", f"{f}/other-owned", ident.uid, ident.uid],
           ["chmod", f"{f}/root-owned", "777"] if ident.uid else ["chown", f"{f}/root-owned", 1, 1]]
    o = fresh.attack(ident, ops)
    assert _errnos(o) == ["EPERM"] * 3, o
    st = os.stat(fresh.root / "foreign" / "other-owned")
    assert st.st_uid == FOREIGN_UID and st.st_mode & 0o777 == 0o644


@pytest.mark.timeout(30)
@case("userns-mount")
def test_mount_in_a_new_user_namespace(fresh, ident):
    """Attempt: unshare a user and mount namespace (all capabilities inside
    it) and mount a tmpfs over a directory. Stopped by: Landlock denies
    every mount in a domain (EPERM), if unshare itself was allowed."""
    o = fresh.attack(ident, [["unshare_userns"], ["mount_tmpfs", fresh.rw(ident)]])
    assert o.errname(1) == "EPERM", o


# ---- resources, under a dedicated uid ------------------------------------------------------------------

def _bomb(arena: Arena, ops: list[list[Any]], rlimits: dict[str, Any], timeout: float = 20) -> Outcome:
    return attack(arena.sv.client, BOMB.manifest, ops, narrow={"rlimits": {"CORE": 0, **rlimits}},
                  timeout=timeout)


def _uid_processes(uid: int) -> list[int]:
    return [pid for pid in procfs.of_uid(uid) if alive(pid)]


@pytest.mark.timeout(30)
@case("fork-bomb")
def test_fork_bomb_under_nproc(arena):
    """Attempt: fork 200 times (bounded) as the dedicated uid 64101.
    Stopped by: RLIMIT_NPROC 16 counts that uid's processes: EAGAIN. Every
    one of them is gone with the child (its process group is ended)."""
    o = _bomb(arena, [["fork_bomb", 200, 2.0]], {"NPROC": 16})
    v = o[0]["value"]
    assert v["failure"] == "EAGAIN" and v["forked"] <= 15, o
    assert wait_until(lambda: not _uid_processes(BOMB_UID), 5), _uid_processes(BOMB_UID)


@pytest.mark.timeout(30)
@case("memory-bomb")
def test_memory_bomb_under_data(arena):
    """Attempt: allocate and touch 1 GiB in 8 MiB blocks.
    Stopped by: RLIMIT_DATA 128 MiB: MemoryError (mmap fails: ENOMEM)."""
    o = _bomb(arena, [["mem_bomb", 1024]], {"DATA": "128MiB"})
    v = o[0]["value"]
    assert v["failure"] == "MemoryError" and v["mib"] <= 128, o
    o = _bomb(arena, [["mem_bomb", 1024]], {"AS": "256MiB"})
    v = o[0]["value"]
    assert v["failure"] == "MemoryError" and v["mib"] <= 256, o


@pytest.mark.timeout(30)
@case("fd-exhaustion")
def test_fd_exhaustion_under_nofile(arena):
    """Attempt: open 10,000 files. Stopped by: RLIMIT_NOFILE 64: EMFILE."""
    o = _bomb(arena, [["fd_bomb", 10000]], {"NOFILE": 64})
    v = o[0]["value"]
    assert v["failure"] == "EMFILE" and v["highest"] <= 63, o


@pytest.mark.timeout(30)
@case("cpu-spin")
def test_cpu_spin_under_cpu(arena):
    """Attempt: spin for 20 s. Stopped by: RLIMIT_CPU 1 s: SIGXCPU (the
    child's disposition is the default: terminate), SIGKILL at the hard
    limit."""
    o = _bomb(arena, [["cpu_spin", 20]], {"CPU": 1}, timeout=25)
    assert not o.results, o
    assert o.exited["signal"] in (signal.SIGXCPU, signal.SIGKILL), o
    cpu = o.exited["rusage"]["utime"] + o.exited["rusage"]["stime"]
    assert cpu <= 2.5, o.exited   # (rusage samples: it may read below the 1 s the kernel counted)


@pytest.mark.timeout(30)
@case("huge-file")
def test_huge_file_under_fsize(arena):
    """Attempt: write 64 MiB to a file. Stopped by: RLIMIT_FSIZE 1 MiB:
    EFBIG (SIGXFSZ for a program that does not ignore it)."""
    path = str(arena.root / "rw" / "bomb-big")
    os.chmod(arena.root / "rw", 0o777)
    o = _bomb(arena, [["big_file", path, 64]], {"FSIZE": "1MiB"})
    v = o[0]["value"]
    assert v["failure"] == "EFBIG" and v["size"] == 1 << 20, o
    os.unlink(path)
