"""Raw Landlock system calls through ctypes, for the kernel matrix tests.

Deliberately independent of the project's `landlock` package: these tests
check the kernels (and the test-only ABI patch) themselves, so a bug in the
library cannot hide a kernel that behaves differently from what we assume.
"""
import ctypes
import errno
import os
import struct

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
PR_SET_NO_NEW_PRIVS = 38

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13
FS_TRUNCATE = 1 << 14
FS_IOCTL_DEV = 1 << 15
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

# Highest fs right bit, net right bit and scope bit each ABI knows (-1: none),
# from the kernel's uapi header history (10: UDP rights, seen on Debian's
# 7.2). ABIs missing here are newer than these tests; the checks that need
# the table skip on them.
LAST_BITS = {  # abi: (fs, net, scope)
    1: (12, -1, -1), 2: (13, -1, -1), 3: (14, -1, -1), 4: (14, 1, -1),
    5: (15, 1, -1), 6: (15, 1, 1), 7: (15, 1, 1), 8: (15, 1, 1),
    9: (16, 1, 1), 10: (16, 3, 1),
}

# landlock_restrict_self() flags and the ABI that brought each.
RESTRICT_FLAGS = {  # flag: abi
    1 << 0: 7,  # LOG_SAME_EXEC_OFF
    1 << 1: 7,  # LOG_NEW_EXEC_ON
    1 << 2: 7,  # LOG_SUBDOMAINS_OFF
    1 << 3: 8,  # TSYNC
}

# Size of struct landlock_ruleset_attr up to each field.
ATTR_SIZE_FS, ATTR_SIZE_NET, ATTR_SIZE_SCOPED = 8, 16, 24

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(nr, *args):
    ret = _libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def abi():
    """Return (abi, errno name): (N, None), or (0, 'ENOSYS'/'EOPNOTSUPP')."""
    try:
        return _syscall(SYS_CREATE_RULESET, 0, 0, CREATE_RULESET_VERSION), None
    except OSError as e:
        # errno.errorcode would name EOPNOTSUPP by its alias ENOTSUP.
        names = {errno.ENOSYS: "ENOSYS", errno.EOPNOTSUPP: "EOPNOTSUPP"}
        if e.errno in names:
            return 0, names[e.errno]
        raise


def create_ruleset(fs=0, net=0, scoped=0, size=ATTR_SIZE_FS):
    """Create a ruleset passing the first `size` bytes of the attr struct."""
    buf = struct.pack("=QQQ", fs, net, scoped).ljust(size, b"\0")[:size]
    attr = ctypes.create_string_buffer(buf, len(buf))
    return _syscall(SYS_CREATE_RULESET, ctypes.addressof(attr), size, 0)


def add_path_rule(ruleset_fd, path, access):
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        attr = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
        _syscall(SYS_ADD_RULE, ruleset_fd, RULE_PATH_BENEATH,
                 ctypes.addressof(attr), 0)
    finally:
        os.close(fd)


def restrict_self(ruleset_fd, flags=0):
    # Without no_new_privs an unprivileged caller gets EPERM; set it anyway.
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    _syscall(SYS_RESTRICT_SELF, ruleset_fd, flags)
