"""What Landlock (and this supervisor) cannot stop, recorded as it is today.

Each test makes the attempt for real, as a confined child, and compares
what happened with the Limits table of docs/security.md: a row says
`allowed` or `denied` and, where one exists, the ABI that fixes it (from
that ABI on the test expects `denied`). A kernel that starts to deny, or
documentation that claims a denial the kernel does not make, fails here.
(Not marked `enforcement`: a limit the machine switches off, MPTCP or user
namespaces, is skipped.)
"""
from __future__ import annotations

import os
import socket
import threading

import pytest

from sechelpers import IDENTITIES, accepted, attack, check_limit
from svhelpers import wait_until

LOADER = "/lib64/ld-linux-x86-64.so.2"


def _sysctl(name: str) -> str | None:
    try:
        with open(f"/proc/sys/{name}") as f:
            return f.read().strip()
    except OSError:
        return None


def _mptcp_enabled() -> bool:
    return _sysctl("net/mptcp/enabled") == "1"


@pytest.mark.timeout(30)
@pytest.mark.skipif(not _mptcp_enabled(), reason="machine setting: MPTCP is off here (net.mptcp.enabled)")
def test_mptcp_passes_the_tcp_rules(fresh, ident):
    """socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP) connects to and binds
    ports the manifest does not list: the TCP rights cover TCP sockets only
    (Landlock erratum 1 made that explicit)."""
    o = fresh.attack(ident, [["mptcp_connect", fresh.ports["mptcp_target"]],
                             ["mptcp_bind", fresh.ports["bind_denied"]]])
    got = accepted(fresh.listeners["mptcp_target"])
    check_limit("mptcp", o[0]["ok"] and got == b"hello from the sandbox")
    check_limit("mptcp", o[1]["ok"])


@pytest.mark.timeout(30)
def test_udp(fresh, ident):
    """UDP datagrams leave to any port (the manifest lists none)."""
    o = fresh.attack(ident, [["udp_send", fresh.ports["udp"]]])
    got = None
    if o[0]["ok"]:
        assert wait_until(lambda: _recv_udp(fresh.listeners["udp"]), 2)
        got = True
    check_limit("udp", bool(got))


def _recv_udp(sock: socket.socket) -> bytes | None:
    try:
        return sock.recv(100)
    except BlockingIOError:
        return None


@pytest.mark.timeout(30)
def test_pathname_unix_socket(fresh, ident):
    """connect() to a pathname socket in a directory with no rule at all
    (the user's session bus, docker.sock, the supervisor's own socket)."""
    o = fresh.attack(ident, [["connect_unix", str(fresh.unix_path)]])
    got = accepted(fresh.listeners["unix"]) if o[0]["ok"] else None
    check_limit("unix-pathname", got == b"hello from the sandbox")


@pytest.mark.timeout(30)
def test_metadata_of_own_files(fresh, ident):
    """chmod, chown (to itself), utime and setxattr of a file the child owns
    in a directory with no rule: Landlock does not handle metadata."""
    own = fresh.p(f"secret/own-{ident.name}")
    o = fresh.attack(ident, [["chmod", own, "600"], ["chown", own, ident.uid, ident.uid], ["utime", own],
                             ["setxattr", own]])
    st = os.stat(own)
    check_limit("own-metadata", all(r["ok"] for r in o.results) and st.st_mode & 0o777 == 0o600
                and st.st_mtime == 1)
    os.chmod(own, 0o644)


@pytest.mark.timeout(30)
def test_dynamic_loader_runs_noexec_code(fresh, ident):
    """A program copied into a read_write_noexec directory cannot be
    execve'd, but the dynamic loader (executable, in /lib64) maps and runs
    it: EXECUTE is checked at execve, the loader's open is a read and its
    mmap(PROT_EXEC) is not checked."""
    prog = fresh.rw(ident, "t")
    o = fresh.attack(ident, [["copy", fresh.p("allowed/true"), prog], ["exec", prog], ["exec", LOADER, prog]])
    assert o[0]["ok"] and o.errname(1) == "EACCES", o
    check_limit("loader-exec", o[2]["ok"] and o[2]["value"]["status"] == 0)


@pytest.mark.timeout(30)
def test_memfd_exec(fresh, ident):
    """Bytes read from a noexec grant, written to memfd_create, run with
    fexecve: a memfd is not a path Landlock has rules for."""
    o = fresh.attack(ident, [["memfd_exec", fresh.p("allowed/true")]])
    check_limit("memfd-exec", o[0]["ok"] and o[0]["value"]["status"] == 0)


@pytest.mark.timeout(30)
def test_proc_reads_where_proc_is_granted(fresh, ident):
    """With /proc granted, a child reads other processes' command lines and
    status (the supervisor's included) and the system's socket tables (the
    supervisor's socket path among them)."""
    pid = fresh.sv.pid
    o = fresh.attack(ident, [["read", f"/proc/{pid}/cmdline"], ["read", f"/proc/{pid}/status"],
                             ["read", "/proc/net/unix"]])
    ok = all(r["ok"] for r in o.results)
    check_limit("proc-reads", ok and "supervisor" in o[0]["value"])


@pytest.mark.timeout(30)
def test_hard_link_planted_in_a_granted_tree(fresh, ident):
    """A hard link to the secret, made beforehand (by someone outside) in a
    granted directory, reads: rules follow the path walked, and a hard link
    is another path to the same inode."""
    o = fresh.attack(ident, [["read", fresh.p("allowed/hardlink")], ["read", fresh.p("secret/secret")]])
    assert o.errname(1) == "EACCES", o
    check_limit("hardlink-planted", o[0]["ok"] and "TOP SECRET" in o[0]["value"])


@pytest.mark.timeout(30)
def test_user_namespaces(fresh, ident):
    """unshare(CLONE_NEWUSER): a confined child gets a user namespace with
    every capability in it (mount is still denied by Landlock): more kernel
    attack surface, not an escape."""
    o = fresh.attack(ident, [["unshare_userns"], ["mount_tmpfs", fresh.rw(ident)]])
    if not o[0]["ok"] and _sysctl("user/max_user_namespaces") == "0":
        pytest.skip("machine setting: user namespaces are off here (user.max_user_namespaces=0)")
    assert o.errname(1) == "EPERM", o
    check_limit("userns", o[0]["ok"])


@pytest.mark.timeout(30)
def test_root_ignores_nproc(arena):
    """Capability-less root is not held by RLIMIT_NPROC: the kernel exempts
    uid 0 (INIT_USER) from the check whatever its capabilities. Bounded at
    24 forks; NPROC 8."""
    root = IDENTITIES[1]
    o = attack(arena.sv.client, root.manifest, [["fork_bomb", 24, 0.5]], narrow={"rlimits": {"NPROC": 8}})
    v = o[0]["value"]
    check_limit("nproc-root", v["forked"] == 24 and v["failure"] is None)


@pytest.mark.timeout(30)
def test_xattr_values_outside_the_grants(fresh, ident):
    """getxattr is no access Landlock handles: the values of extended
    attributes of a file outside every grant read (DAC permitting)."""
    secret = fresh.root / "secret" / "secret"
    os.setxattr(secret, "user.llsv_secret", b"xattr secret")
    try:
        o = fresh.attack(ident, [["read", str(secret)], ["getxattr", str(secret), "user.llsv_secret"]])
    finally:
        os.removexattr(secret, "user.llsv_secret")
    assert o.errname(0) == "EACCES", o
    check_limit("xattr-read", o[1]["ok"] and o[1]["value"] == "xattr secret")


@pytest.mark.timeout(30)
def test_inotify_names_outside_the_grants(fresh, ident):
    """inotify_add_watch is no open: a child watches a directory outside
    every grant and learns the names created there."""
    secret_dir = fresh.root / "secret"
    stop = threading.Event()

    def create() -> None:
        n = 0
        while not stop.wait(0.05):
            path = secret_dir / f"created-{n}"
            path.write_text("x")
            path.unlink()
            n += 1
    t = threading.Thread(target=create)
    t.start()
    try:
        o = fresh.attack(ident, [["inotify_names", str(secret_dir), 1.0], ["read", str(secret_dir / "secret")]])
    finally:
        stop.set()
        t.join()
    assert o.errname(1) == "EACCES", o
    check_limit("inotify-names", o[0]["ok"] and any(n.startswith("created-") for n in o[0]["value"]))


@pytest.mark.timeout(30)
def test_client_fd_keeps_its_access(fresh, ident):
    """An fd the client passes (here a read-write fd on a file outside every
    grant, as stdin) keeps the access it was opened with: Landlock checks
    at open(), and this open was the client's."""
    path = fresh.root / "secret" / "passed"
    path.write_text("client data\n")
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        o = fresh.attack(ident, [["fd_write_read", 0, "overwritten"], ["read", str(path)]], stdin=fd)
    finally:
        os.close(fd)
        content = path.read_text()
        path.unlink()
    assert o.errname(1) == "EACCES", o
    check_limit("client-fd-access", o[0]["ok"] and content.startswith("overwritten"))
