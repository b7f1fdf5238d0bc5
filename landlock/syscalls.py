"""The three Landlock system calls, and the few others (prctl, keyctl,
ioprio, openat2, inotify) Python and python-prctl lack, via ctypes."""
from __future__ import annotations

import ctypes
import errno
import os

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

# Same numbers on every architecture but alpha.
_NR_CREATE_RULESET, _NR_ADD_RULE, _NR_RESTRICT_SELF = 444, 445, 446

CREATE_RULESET_VERSION = 1 << 0
CREATE_RULESET_ERRATA = 1 << 1
RULE_PATH_BENEATH = 1
RULE_NET_PORT = 2

PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


# The kernel rejects attribute fields it does not know (E2BIG when they are
# non-zero), so an old kernel is given only the prefix it understands.
ATTR_SIZE_FS = RulesetAttr.handled_access_net.offset
ATTR_SIZE_NET = RulesetAttr.scoped.offset
ATTR_SIZE_SCOPED = ctypes.sizeof(RulesetAttr)


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def create_ruleset(attr: RulesetAttr | None, size: int = 0, flags: int = 0) -> int:
    ref = ctypes.byref(attr) if attr is not None else None
    return _check(_syscall(_NR_CREATE_RULESET, ref, ctypes.c_size_t(size), ctypes.c_uint32(flags)),
                  "landlock_create_ruleset")


def add_rule(ruleset_fd: int, rule_type: int, attr: ctypes.Structure) -> None:
    _check(_syscall(_NR_ADD_RULE, ctypes.c_int(ruleset_fd), ctypes.c_int(rule_type),
                    ctypes.byref(attr), ctypes.c_uint32(0)), "landlock_add_rule")


def restrict_self(ruleset_fd: int, flags: int = 0) -> None:
    _check(_syscall(_NR_RESTRICT_SELF, ctypes.c_int(ruleset_fd), ctypes.c_uint32(flags)),
           "landlock_restrict_self")


def kernel_abi() -> int:
    """The ABI the kernel reports; 0 when Landlock is absent or disabled."""
    try:
        return create_ruleset(None, 0, CREATE_RULESET_VERSION)
    except OSError as e:
        # ENOSYS: not built (or gVisor); EOPNOTSUPP: built but not in lsm=.
        if e.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
            return 0
        raise


def errata() -> int:
    try:
        return create_ruleset(None, 0, CREATE_RULESET_ERRATA)
    except OSError:
        return 0


def clear_ambient_capabilities() -> None:
    if _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0:
        err = ctypes.get_errno()
        if err != errno.EINVAL:  # EINVAL: kernel without ambient capabilities
            raise OSError(err, f"prctl(PR_CAP_AMBIENT_CLEAR_ALL): {os.strerror(err)}")


# capset(2) with version 3 (two 32-bit words per set): made once, read by the kernel only.
_CAP_HEADER = (ctypes.c_uint32 * 2)(0x20080522, 0)   # _LINUX_CAPABILITY_VERSION_3, this process
_CAP_NONE = (ctypes.c_uint32 * 6)()                  # effective, permitted, inheritable: empty
_capset = _libc.capset


def clear_capabilities() -> None:
    """Effective, permitted and inheritable sets emptied: one capset, where
    libcap's cap_set_proc (python-prctl's set_caps) probes with two capget first."""
    _check(_capset(_CAP_HEADER, _CAP_NONE), "capset")


class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_NR_OPENAT2 = 437  # the same on every architecture (Linux 5.6)
AT_FDCWD = -100
RESOLVE_NO_SYMLINKS = 0x04


_openat2 = _libc["syscall"]  # an object of its own: typed arguments convert faster
_openat2.restype = ctypes.c_long
_openat2.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(OpenHow), ctypes.c_size_t]


def openat2(dir_fd: int, path: str, flags: int, resolve: int) -> int:
    how = OpenHow(flags, 0, resolve)
    return _check(_openat2(_NR_OPENAT2, dir_fd, os.fsencode(path), how, ctypes.sizeof(OpenHow)), "openat2")


# Numbers that differ between architectures: (keyctl, add_key, ioprio_set, ioprio_get, sched_setattr,
# sched_getattr).
_PER_MACHINE = {
    "x86_64": (250, 248, 251, 252, 314, 315),
    "aarch64": (219, 217, 30, 31, 274, 275),
    "riscv64": (219, 217, 30, 31, 274, 275),
    "ppc64le": (280, 269, 273, 274, 355, 356),
    "i686": (288, 286, 289, 290, 351, 352),
    "i386": (288, 286, 289, 290, 351, 352),
    "armv7l": (311, 309, 314, 315, 380, 381),
}.get(os.uname().machine)

KEYCTL_GET_KEYRING_ID = 0
KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_SEARCH = 10
KEY_SPEC_SESSION_KEYRING = -3
KEY_SPEC_USER_KEYRING = -4
IOPRIO_WHO_PROCESS = 1
IOPRIO_CLASS_SHIFT = 13
IOPRIO_CLASS_RT, IOPRIO_CLASS_BE = 1, 2


def _number(index: int, name: str) -> int:
    if _PER_MACHINE is None:  # an architecture not listed: as a kernel without the call
        raise OSError(errno.ENOSYS, f"{name}: no syscall number known for {os.uname().machine}")
    return _PER_MACHINE[index]


def keyctl(operation: int, *args: int | bytes | None) -> int:
    """keyctl(2); each argument an int, a C string or NULL."""
    converted = [ctypes.c_char_p(a) if isinstance(a, bytes) or a is None else ctypes.c_long(a)
                 for a in args]
    return _check(_syscall(ctypes.c_long(_number(0, "keyctl")), ctypes.c_long(operation), *converted),
                  "keyctl")


def add_key(key_type: bytes, description: bytes, payload: bytes, keyring: int) -> int:
    return _check(_syscall(ctypes.c_long(_number(1, "add_key")), ctypes.c_char_p(key_type),
                           ctypes.c_char_p(description), ctypes.c_char_p(payload),
                           ctypes.c_size_t(len(payload)), ctypes.c_int(keyring)), "add_key")


def ioprio_get(who: int = 0) -> int:
    # Plain ints go as C ints, as the Landlock calls' numbers do: no ctypes
    # object made (a supervisor asks at every warm server's hand-over).
    return _check(_syscall(_number(3, "ioprio_get"), IOPRIO_WHO_PROCESS, who), "ioprio_get")


def ioprio_set(ioprio: int, who: int = 0) -> None:
    _check(_syscall(ctypes.c_long(_number(2, "ioprio_set")), ctypes.c_int(IOPRIO_WHO_PROCESS),
                    ctypes.c_int(who), ctypes.c_int(ioprio)), "ioprio_set")


class SchedAttr(ctypes.Structure):
    """struct sched_attr as Linux 5.3 made it (SCHED_ATTR_SIZE_VER1: the utilization clamps)."""
    _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32), ("flags", ctypes.c_uint64),
                ("nice", ctypes.c_int32), ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64),
                ("util_min", ctypes.c_uint32), ("util_max", ctypes.c_uint32)]


SCHED_FLAG_RESET_ON_FORK = 0x01
FAIR_POLICIES = (os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_IDLE)   # a time slice, a nice; no real-time priority


def sched_getattr(pid: int) -> SchedAttr:
    """What sched_getattr(2) says of pid: beyond sched_getscheduler and
    getpriority, a fair task's time slice (`runtime`, Linux 6.12) and its
    utilization clamps (0 where the kernel has none)."""
    attr = SchedAttr()
    _check(_syscall(_number(5, "sched_getattr"), pid, ctypes.byref(attr), ctypes.sizeof(attr), 0), "sched_getattr")
    return attr


def sched_setattr(policy: int, flags: int, nice: int, runtime: int = 0, pid: int = 0) -> None:
    """sched_setattr(2) of pid (0: this thread) to a fair policy: its nice,
    and its time slice (`runtime`, Linux 6.12; 0: the kernel's default)."""
    attr = SchedAttr(size=ctypes.sizeof(SchedAttr), policy=policy, flags=flags, nice=nice, runtime=runtime)
    _check(_syscall(_number(4, "sched_setattr"), pid, ctypes.byref(attr), 0), "sched_setattr")


def tcgetsid(fd: int) -> int:
    """The session of fd's terminal when it is our controlling terminal (ENOTTY otherwise)."""
    return _check(_libc.tcgetsid(ctypes.c_int(fd)), "tcgetsid")


def gettid() -> int:
    tid: int = _libc.gettid()
    return tid


# inotify, which Python lacks (libc's functions: no numbers per machine).
IN_CREATE, IN_DELETE, IN_MOVED_FROM, IN_MOVED_TO = 0x100, 0x200, 0x40, 0x80
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_ONLYDIR = 0x400, 0x800, 0x4000, 0x01000000


def inotify_init1(flags: int) -> int:
    return _check(_libc.inotify_init1(flags), "inotify_init1")


def inotify_add_watch(fd: int, path: str, mask: int) -> int:
    return _check(_libc.inotify_add_watch(fd, os.fsencode(path), ctypes.c_uint32(mask)), "inotify_add_watch")


def inotify_rm_watch(fd: int, wd: int) -> None:
    _check(_libc.inotify_rm_watch(fd, wd), "inotify_rm_watch")
