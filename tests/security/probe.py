"""The attacker: run by a confined child of the supervisor, it tries what the
escape catalogue asks and reports what the kernel said.

    python3 -I probe.py '[["read", "/secret"], ["kill", 1234, 15], ...]'

prints one JSON list: for each operation {"op", "ok", "value"} or
{"op", "ok": false, "errno", "errname", "error"}. Stdlib only, no imports
from the project (the child cannot read it). Each operation is a real
attempt; nothing here asks permission first.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import resource
import socket
import struct
import sys
import termios
import time

IPPROTO_MPTCP = 262
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
PTRACE_ATTACH = 16
PTRACE_DETACH = 17

_libc = None


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _oserror(what):
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


# ---- files -----------------------------------------------------------------

def op_read(path):
    with open(path, "rb") as f:
        return f.read(4096).decode(errors="replace")


def op_open_write(path):
    fd = os.open(path, os.O_WRONLY)
    os.close(fd)


def op_create(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)


def op_write_file(path, text, mode="644"):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, int(mode, 8))
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def op_unlink(path):
    os.unlink(path)


def op_rmdir(path):
    os.rmdir(path)


def op_mkdir(path):
    os.mkdir(path)


def op_rename(src, dst):
    os.rename(src, dst)


def op_link(src, dst):
    os.link(src, dst)


def op_symlink(target, path):
    os.symlink(target, path)


def op_truncate(path):
    os.truncate(path, 0)


def op_open_trunc(path):
    fd = os.open(path, os.O_RDONLY | os.O_TRUNC)
    os.close(fd)


def op_copy(src, dst, mode="755"):
    with open(src, "rb") as f:
        data = f.read()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, int(mode, 8))
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(dst, int(mode, 8))


def op_mknod_char(path, major=1, minor=3):
    import stat
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))


def op_mkfifo(path):
    os.mkfifo(path)


def op_chmod(path, mode):
    os.chmod(path, int(mode, 8))


def op_chown(path, uid, gid):
    os.chown(path, uid, gid)


def op_utime(path):
    os.utime(path, (1, 1))


def op_setxattr(path):
    os.setxattr(path, "user.llsv", b"x")


def op_getxattr(path, name):
    return os.getxattr(path, name).decode(errors="replace")


def op_inotify_names(directory, seconds):
    """Watch a directory for created files; the names seen within `seconds`."""
    import select
    import struct
    c = libc()
    fd = c.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        _oserror("inotify_init1")
    try:
        if c.inotify_add_watch(fd, directory.encode(), 0x100) < 0:  # IN_CREATE
            _oserror("inotify_add_watch")
        names, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            if not select.select([fd], [], [], max(0.0, end - time.monotonic()))[0]:
                continue
            data = os.read(fd, 65536)
            while data:
                _, _, _, length = struct.unpack("iIII", data[:16])
                names.append(data[16:16 + length].rstrip(b"\0").decode(errors="replace"))
                data = data[16 + length:]
        return names
    finally:
        os.close(fd)


def op_fd_write_read(fd, text):
    """Write to an inherited fd, then read it back from the start."""
    os.pwrite(fd, text.encode(), 0)
    return os.pread(fd, 4096, 0).decode(errors="replace")


def op_stat(path):
    st = os.stat(path)
    return {"mode": oct(st.st_mode), "uid": st.st_uid, "size": st.st_size}


# ---- running things --------------------------------------------------------

def _read_to_eof(r):
    """All that comes through pipe end r; r is closed."""
    out = b""
    while chunk := os.read(r, 65536):
        out += chunk
    os.close(r)
    return out


def _spawn(argv, env=None):
    """posix_spawn argv (exec errors raise here), its stdout read to EOF."""
    r, w = os.pipe()
    try:
        pid = os.posix_spawn(argv[0], argv, env or {"PATH": "/usr/bin:/bin"},
                             file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
    finally:
        os.close(w)
    out = _read_to_eof(r)
    _, status = os.waitpid(pid, 0)
    return {"status": os.waitstatus_to_exitcode(status), "out": out.decode(errors="replace")}


def op_exec(*argv):
    return _spawn(list(argv))


def op_memfd_exec(src, *args):
    """Copy an executable into a memfd and fexecve it (in a forked child)."""
    with open(src, "rb") as f:
        data = f.read()
    fd = os.memfd_create("payload", 0)
    os.write(fd, data)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(w, 1)
            os.execve(fd, [src, *args], {"PATH": "/usr/bin:/bin"})
        except OSError as e:
            os.write(2, f"fexecve: {e}\n".encode())
            os._exit(200 + (e.errno or 0) % 50)
    os.close(w)
    out = _read_to_eof(r)
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code >= 200:
        raise OSError(code - 200, "fexecve failed")
    return {"status": code, "out": out.decode(errors="replace")}


# ---- processes -------------------------------------------------------------

def op_kill(pid, sig):
    os.kill(pid, sig)


def op_ptrace_attach(pid):
    c = libc()
    c.ptrace.restype = ctypes.c_long
    if c.ptrace(ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(pid), None, None) < 0:
        _oserror("ptrace(PTRACE_ATTACH)")
    c.ptrace(ctypes.c_long(PTRACE_DETACH), ctypes.c_long(pid), None, None)
    return "attached"


def op_process_vm_readv(pid):
    c = libc()

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    buf = ctypes.create_string_buffer(64)
    local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 64)
    # The remote address hardly matters: the access check comes first.
    remote = IoVec(0x400000, 64)
    c.process_vm_readv.restype = ctypes.c_ssize_t
    n = c.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if n < 0:
        _oserror("process_vm_readv")
    return n


def op_proc_mem(pid):
    with open(f"/proc/{pid}/mem", "rb") as f:
        return len(f.read(1))


def op_environ():
    return dict(os.environ)


def op_fds():
    """Every open fd: fstat'ed one by one, so no listing fd shows up."""
    found = []
    for fd in range(0, resource.getrlimit(resource.RLIMIT_NOFILE)[0]):
        try:
            os.fstat(fd)
        except OSError:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = "?"
        found.append([fd, target])
    return found


def op_session():
    try:
        tty = os.open("/dev/tty", os.O_RDWR)
        os.close(tty)
        ctty = True
    except OSError as e:
        ctty = errno.errorcode.get(e.errno, str(e.errno))
    return {"pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0), "dev_tty": ctty,
            "isatty0": os.isatty(0)}


def op_tiocsti(text):
    for ch in text.encode():
        fcntl.ioctl(0, termios.TIOCSTI, bytes([ch]))


def op_tiocswinsz(rows, cols):
    import struct
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def op_unshare_userns():
    """A new user (and mount) namespace: every capability, inside it."""
    if libc().unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0:
        _oserror("unshare(CLONE_NEWUSER|CLONE_NEWNS)")
    with open("/proc/self/status") as f:
        return [line.split()[1] for line in f if line.startswith("CapEff:")][0]


def op_mount_tmpfs(target):
    if libc().mount(b"none", target.encode(), b"tmpfs", 0, None) < 0:
        _oserror("mount")
    return "mounted"


# ---- keyrings --------------------------------------------------------------

_KEYCTL_NR = {"x86_64": 250, "aarch64": 219}
_ADD_KEY_NR = {"x86_64": 248, "aarch64": 217}
KEY_SPECS = {"session": -3, "user": -4}


def _keyctl(*args):
    c = libc()
    c.syscall.restype = ctypes.c_long
    ret = c.syscall(ctypes.c_long(_KEYCTL_NR[os.uname().machine]), *args)
    if ret < 0:
        _oserror("keyctl")
    return ret


def op_keyring_id(which):
    return _keyctl(ctypes.c_long(0), ctypes.c_long(KEY_SPECS[which]), ctypes.c_long(0))  # GET_KEYRING_ID


def op_key_search(which, description):
    """KEYCTL_SEARCH the keyring for a user key; its payload when found."""
    key = _keyctl(ctypes.c_long(10), ctypes.c_long(KEY_SPECS[which]), b"user", description.encode(),
                  ctypes.c_long(0))
    return op_key_read(key)


def op_persistent_keyring():
    """KEYCTL_GET_PERSISTENT: this uid's persistent keyring, linked into our session one."""
    return _keyctl(ctypes.c_long(22), ctypes.c_long(-1), ctypes.c_long(KEY_SPECS["session"]))


def op_key_add_to(ring, description, payload):
    c = libc()
    c.syscall.restype = ctypes.c_long
    data = payload.encode()
    ret = c.syscall(ctypes.c_long(_ADD_KEY_NR[os.uname().machine]), b"user", description.encode(), data,
                    ctypes.c_size_t(len(data)), ctypes.c_long(ring))
    if ret < 0:
        _oserror("add_key")
    return ret


def op_key_search_in(ring, description):
    key = _keyctl(ctypes.c_long(10), ctypes.c_long(ring), b"user", description.encode(), ctypes.c_long(0))
    return op_key_read(key)


def op_key_read(key):
    buf = ctypes.create_string_buffer(256)
    n = _keyctl(ctypes.c_long(11), ctypes.c_long(key), buf, ctypes.c_long(256))  # KEYCTL_READ
    return buf.raw[:n].decode(errors="replace")


def op_key_add(which, description, payload):
    c = libc()
    c.syscall.restype = ctypes.c_long
    data = payload.encode()
    ret = c.syscall(ctypes.c_long(_ADD_KEY_NR[os.uname().machine]), b"user", description.encode(), data,
                    ctypes.c_size_t(len(data)), ctypes.c_long(KEY_SPECS[which]))
    if ret < 0:
        _oserror("add_key")
    return ret


# ---- sockets ---------------------------------------------------------------

def op_connect_abstract(name):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect("\0" + name)
        s.sendall(b"hello from the sandbox")


def op_connect_unix(path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(b"hello from the sandbox")


def op_supervisor_spawn(path, manifest):
    """Connect to the supervisor's socket and ask for a spawn with our stdio."""
    import array
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    req = json.dumps({"v": 1, "op": "spawn", "manifest": manifest, "args": []}).encode()
    try:
        s.sendmsg([req], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    except (BrokenPipeError, ConnectionResetError):
        pass
    s.settimeout(5)
    for _ in range(2):
        try:
            data = s.recv(65536)
            break
        except ConnectionResetError:  # closed with our request unread; the reply follows
            continue
    s.close()
    return json.loads(data) if data else None


def op_tcp_connect(port, family=4, proto=0):
    fam = socket.AF_INET if family == 4 else socket.AF_INET6
    host = "127.0.0.1" if family == 4 else "::1"
    with socket.socket(fam, socket.SOCK_STREAM, proto) as s:
        s.settimeout(5)
        s.connect((host, port))
        s.sendall(b"hello from the sandbox")


def op_mptcp_connect(port):
    return op_tcp_connect(port, 4, IPPROTO_MPTCP)


def op_tcp_bind(port, family=4, proto=0):
    fam = socket.AF_INET if family == 4 else socket.AF_INET6
    host = "127.0.0.1" if family == 4 else "::1"
    with socket.socket(fam, socket.SOCK_STREAM, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen()


def op_mptcp_bind(port):
    return op_tcp_bind(port, 4, IPPROTO_MPTCP)


def op_udp_send(port):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return s.sendto(b"hello from the sandbox", ("127.0.0.1", port))


# ---- resources -------------------------------------------------------------

def op_fork_bomb(bound, linger=3.0):
    """Fork up to `bound` children (each sleeps, then leaves): how many succeed."""
    made, failure = 0, None
    for _ in range(bound):
        try:
            pid = os.fork()
        except OSError as e:
            failure = errno.errorcode.get(e.errno, str(e.errno))
            break
        if pid == 0:
            time.sleep(linger)
            os._exit(0)
        made += 1
    return {"forked": made, "failure": failure}


def op_mem_bomb(max_mib, chunk_mib=8):
    held, got = [], 0
    try:
        while got < max_mib:
            b = bytearray(chunk_mib << 20)
            b[::4096] = b"\1" * len(b[::4096])   # touch every page
            held.append(b)
            got += chunk_mib
        failure = None
    except MemoryError:
        failure = "MemoryError"
    return {"mib": got, "failure": failure}


def op_fd_bomb(bound):
    fds, failure = [], None
    try:
        for _ in range(bound):
            fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        failure = errno.errorcode.get(e.errno, str(e.errno))
    n = len(fds)
    for fd in fds:
        os.close(fd)
    return {"opened": n, "failure": failure, "highest": 2 + n}


def op_cpu_spin(seconds):
    """Spin until killed (SIGXCPU) or `seconds` of wall time pass."""
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1
    return {"survived": True}


def op_big_file(path, max_mib):
    """Write 1 MiB blocks. Python ignores SIGXFSZ (so write fails with EFBIG)."""
    block = b"\0" * (1 << 20)
    written, failure = 0, None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(max_mib):
            written += os.write(fd, block)
    except OSError as e:
        failure = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        os.close(fd)
    return {"written": written, "size": os.stat(path).st_size, "failure": failure}


def op_sleep(seconds):
    time.sleep(seconds)


def op_rlimits():
    out = {}
    for name in ("NPROC", "NOFILE", "DATA", "AS", "CPU", "FSIZE"):
        out[name] = list(resource.getrlimit(getattr(resource, "RLIMIT_" + name)))
    return out


def op_ids():
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    return {k: status[k].split() for k in ("Uid", "Gid", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs")}


def _shm_libc():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
    return ctypes, libc


def op_shm_read(key):
    """shmget(key) then shmat and read the segment's first bytes (SysV IPC)."""
    ctypes, libc = _shm_libc()
    shmid = libc.shmget(key, 0, 0)
    if shmid < 0:
        raise OSError(ctypes.get_errno(), "shmget")
    addr = libc.shmat(shmid, None, 0o10000)  # SHM_RDONLY
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "shmat")
    return ctypes.string_at(addr, 16).rstrip(b"\0").decode(errors="replace")


def op_shm_create(key, text):
    """A world-readable segment holding text (left for the test to remove)."""
    ctypes, libc = _shm_libc()
    shmid = libc.shmget(key, 4096, 0o1000 | 0o666)  # IPC_CREAT
    if shmid < 0:
        raise OSError(ctypes.get_errno(), "shmget")
    addr = libc.shmat(shmid, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "shmat")
    ctypes.memmove(addr, text.encode(), len(text))
    return shmid


# ---- the running server (tests/security/test_escapes_runtime.py) ----

def op_prlimit(pid, name, soft=None, hard=None):
    """Read (soft None) or set another process's limit."""
    res = getattr(resource, "RLIMIT_" + name)
    if soft is None:
        return list(resource.prlimit(pid, res))
    return list(resource.prlimit(pid, res, (soft, hard)))


def op_prlimit_siblings(ppid, name, soft, hard):
    """prlimit every other child of ppid (sessions, pooled children, the
    zygote, helpers): {pid: "ok" or the errno's name}."""
    res = getattr(resource, "RLIMIT_" + name)
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
            if int(data[data.rindex(b")") + 2:].split()[1]) != ppid:
                continue
        except (OSError, ValueError):
            continue
        try:
            resource.prlimit(int(entry), res, (soft, hard))
            out[entry] = "ok"
        except OSError as e:
            out[entry] = errno.errorcode.get(e.errno, str(e.errno))
    return out


def op_pid_from(path, timeout=5.0):
    """Wait for a pid the test writes into path; return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.endswith("."):
                return int(text[:-1])
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(path)


def op_prlimit_from(path, name, soft, hard):
    return op_prlimit(op_pid_from(path), name, soft, hard)


def op_leave_session_prlimit_from(path, name, soft, hard, out):
    """A child that leaves the session (setsid), so it outlives it with this
    session's uid and gid: it waits for a pid in path, prlimits it, and
    writes "ok" or the errno's name to out. Its pid."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            op_prlimit(op_pid_from(path, 30), name, soft, hard)
            result = "ok"
        except OSError as e:
            result = errno.errorcode.get(e.errno, str(e.errno))
        with open(out + ".tmp", "w") as f:
            f.write(result)
        os.rename(out + ".tmp", out)
    finally:
        os._exit(0)


def op_sched_attack_from(path):
    """renice, pin and SCHED_IDLE the process named in path."""
    pid = op_pid_from(path)
    os.setpriority(os.PRIO_PROCESS, pid, 10)
    os.sched_setaffinity(pid, {0})
    os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    return {"nice": os.getpriority(os.PRIO_PROCESS, pid), "policy": os.sched_getscheduler(pid),
            "cpus": sorted(os.sched_getaffinity(pid))}


def op_slice_from(path, ns):
    """A time slice of its own (sched_setattr's runtime for a fair task,
    Linux 6.12) given to the process named in path; the slice it has after."""
    pid = op_pid_from(path)
    # struct sched_attr, its first version: size, policy, flags, nice, priority, runtime, deadline, period.
    attr = struct.pack("=IIQiIQQQ", 48, os.sched_getscheduler(pid), 0, os.getpriority(os.PRIO_PROCESS, pid), 0,
                       int(ns), 0, 0)
    nr_set, nr_get = {"x86_64": (314, 315), "aarch64": (274, 275)}[os.uname().machine]
    buf = ctypes.create_string_buffer(attr, 48)
    libc().syscall.restype = ctypes.c_long
    if libc().syscall(ctypes.c_long(nr_set), ctypes.c_long(pid), buf, ctypes.c_uint(0)) != 0:
        _oserror("sched_setattr")
    if libc().syscall(ctypes.c_long(nr_get), ctypes.c_long(pid), buf, ctypes.c_uint(48), ctypes.c_uint(0)) != 0:
        _oserror("sched_getattr")
    return {"slice": struct.unpack("=IIQiIQQQ", buf.raw)[5]}


def op_scheduling():
    """This process's policy, nice and I/O priority (class, level)."""
    nr_get = {"x86_64": 252, "aarch64": 31}[os.uname().machine]
    libc().syscall.restype = ctypes.c_long
    prio = libc().syscall(ctypes.c_long(nr_get), ctypes.c_long(1), ctypes.c_long(0))
    return {"policy": os.sched_getscheduler(0), "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "ioprio_class": prio >> 13, "ioprio_level": prio & 0x1FFF}


def op_tiocsctty():
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


OPS = {name[3:]: fn for name, fn in globals().items() if name.startswith("op_")}


def run(op):
    name, *args = op
    out = {"op": name}
    try:
        out["value"] = OPS[name](*args)
        out["ok"] = True
    except OSError as e:
        out.update(ok=False, errno=e.errno, errname=errno.errorcode.get(e.errno or 0, str(e.errno)),
                   error=str(e))
    except Exception as e:  # noqa: BLE001 - the test reads it
        out.update(ok=False, errno=None, errname=type(e).__name__, error=str(e))
    return out


def main():
    results = []
    for op in json.loads(sys.argv[1]):
        results.append(run(op))
        # Flushed as we go: a resource bomb may kill us before the end.
        print(json.dumps(results[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
