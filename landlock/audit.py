"""Landlock's audit records (Linux 6.15+, ABI 7): the audit status, a
multicast reader of the audit netlink socket, records parsed to tuples.

A reader only listens (AUDIT_NLGRP_READLOG, needs CAP_AUDIT_READ in the
initial user and network namespaces): it never registers as the audit
daemon, whose place is auditd's, and which stalls every process that logs
when it stops reading. Changing the status needs CAP_AUDIT_CONTROL in the
initial PID namespace and is host-global: only an operator's choice.
"""
from __future__ import annotations

import collections
import errno
import re
import socket
import struct
from collections.abc import Iterator

NETLINK_AUDIT = 9
AUDIT_GET, AUDIT_SET = 1000, 1001
NLMSG_ERROR = 2
NLGRP_READLOG = 1
SO_RCVBUFFORCE = 33
SYSCALL, EOE, LANDLOCK_ACCESS, LANDLOCK_DOMAIN = 1300, 1320, 1423, 1424
# What a reader keeps: a Landlock record, and the SYSCALL record of the same
# event (who was denied); nothing else of the host's audit trail.
KEPT = frozenset({SYSCALL, EOE, LANDLOCK_ACCESS, LANDLOCK_DOMAIN})

# struct audit_status: 11 u32 (include/uapi/linux/audit.h); the mask bits name
# the fields an AUDIT_SET changes.
_STATUS = struct.Struct("=11I")
Status = collections.namedtuple(
    "Status", "mask enabled failure pid rate_limit backlog_limit lost backlog feature_bitmap "
              "backlog_wait_time backlog_wait_time_actual")
MASK = {"enabled": 0x1, "failure": 0x2, "pid": 0x4, "rate_limit": 0x8, "backlog_limit": 0x10,
        "backlog_wait_time": 0x20}
FAILURE_PANIC = 2   # a lost record panics the host
ENABLED_LOCKED = 2  # audit on, its settings immutable until reboot

# An access: the domain (hex id), the rights missing (fs.read_file, net.connect_tcp,
# scope.signal...), and the object: a path (for make_* and remove_* the
# parent directory: the record never names the file), an address and port,
# or another process.
Access = collections.namedtuple("Access", "serial domain blockers path addr port opid ocomm")
# A domain's life: allocated (the pid that called landlock_restrict_self;
# parent: the enclosing domain, for a kernel that names it, which 6.18 does
# not) and deallocated (the kernel's count of its denials, logged or not).
Domain = collections.namedtuple("Domain", "serial domain status pid denials parent", defaults=(None,))
# The SYSCALL record: the process actually denied.
Syscall = collections.namedtuple("Syscall", "serial pid comm exe")
Record = Access | Domain | Syscall

_HEADER = re.compile(rb"audit\(\d+\.\d+:(\d+)\): ")
_FIELD = re.compile(rb'(\w+)=("[^"]*"|\S*)')
_HEX = re.compile(rb"[0-9A-F]*")
_NLMSG = struct.Struct("=IHHII")


class Unavailable(Exception):
    """No Landlock audit here: the reason is the message."""


def _request(kind: int, payload: bytes) -> bytes:
    """One request on a fresh netlink socket: the reply's payload."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_AUDIT) as sock:
        sock.settimeout(2)
        sock.bind((0, 0))
        sock.send(_NLMSG.pack(16 + len(payload), kind, 0x1 | 0x4, 1, 0) + payload)  # REQUEST | ACK
        reply = b""
        while True:
            data = sock.recv(65536)
            for typ, body in _split(data):
                if typ == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", body)[0]
                    if code:
                        raise OSError(code, f"audit netlink: {errno.errorcode.get(code, code)}")
                    if kind != AUDIT_GET:   # a change: its ACK is the answer
                        return b""
                elif typ == kind:
                    reply = body
            if reply:
                return reply


def status() -> Status:
    """The kernel's audit status (needs CAP_AUDIT_CONTROL in the initial PID
    namespace: EPERM otherwise)."""
    return Status._make(_STATUS.unpack_from(_request(AUDIT_GET, b"").ljust(_STATUS.size, b"\0")))


def set_status(**fields: int) -> None:
    """Change the named fields (enabled, failure, rate_limit, backlog_limit,
    backlog_wait_time); never pid: a reader is no audit daemon."""
    values = dict.fromkeys(Status._fields, 0)
    values.update(fields)
    values["mask"] = sum(MASK[name] for name in fields)
    if "pid" in fields:
        raise ValueError("registering as the audit daemon is not done here")
    _request(AUDIT_SET, _STATUS.pack(*(values[name] for name in Status._fields)))


def open_reader(buffer: int = 8 << 20) -> socket.socket:
    """A non-blocking multicast socket with a large receive buffer (a small
    one loses records under a flood: ENOBUFS on recv). Raises Unavailable."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK,
                         NETLINK_AUDIT)
    try:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, buffer)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
        sock.bind((0, NLGRP_READLOG))
    except PermissionError:
        sock.close()
        raise Unavailable("reading audit records needs CAP_AUDIT_READ in the initial namespaces") from None
    except OSError as e:
        sock.close()
        raise Unavailable(f"cannot read audit records: {e.strerror or e}") from None
    return sock


def _split(data: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + 16 <= len(data):
        length, typ = struct.unpack_from("=IH", data, offset)
        if length < 16:
            return
        yield typ, data[offset + 16:offset + length]
        offset += (length + 3) & ~3


def records(data: bytes) -> Iterator[tuple[int, Record | None]]:
    """(serial, record) for each kept record of one datagram; EOE (the end
    of an event) comes as (serial, None)."""
    for typ, body in _split(data):
        if typ not in KEPT:
            continue
        header = _HEADER.match(body)
        if header is None:
            continue
        serial = int(header.group(1))
        if typ == EOE:
            yield serial, None
            continue
        fields = {key.decode(): value for key, value in _FIELD.findall(body, header.end())}
        record = parse(typ, serial, fields)
        if record is not None:
            yield serial, record


def text(value: bytes | None) -> str | None:
    """A string field as the kernel logs it: quoted, or hex when it holds a
    space, a quote or a control character (the server names its own files)."""
    if value is None or value == b"(null)":
        return None
    if value.startswith(b'"'):
        return value[1:-1].decode(errors="replace")
    if _HEX.fullmatch(value) and len(value) % 2 == 0:
        return bytes.fromhex(value.decode()).decode(errors="replace")
    return value.decode(errors="replace")


def _int(value: bytes | None, base: int = 10) -> int | None:
    try:
        return int(value, base) if value is not None else None
    except ValueError:
        return None


def parse(typ: int, serial: int, fields: dict[str, bytes]) -> Record | None:
    if typ == LANDLOCK_ACCESS:
        domain = _int(fields.get("domain"), 16)
        if domain is None:
            return None
        port = fields.get("dest", fields.get("src"))
        return Access(serial, domain, tuple(fields.get("blockers", b"").decode().split(",")),
                      text(fields.get("path")), text(fields.get("daddr", fields.get("saddr"))),
                      _int(port), _int(fields.get("opid")), text(fields.get("ocomm")))
    if typ == LANDLOCK_DOMAIN:
        domain = _int(fields.get("domain"), 16)
        if domain is None:
            return None
        return Domain(serial, domain, fields.get("status", b"").decode(), _int(fields.get("pid")),
                      _int(fields.get("denials")), _int(fields.get("parent"), 16))
    if typ == SYSCALL:
        return Syscall(serial, _int(fields.get("pid")), text(fields.get("comm")), text(fields.get("exe")))
    return None
