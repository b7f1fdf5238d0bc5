"""The supervisor <-> zygote wire: every message a named tuple, one encode and one decode for both ends.

Two SOCK_SEQPACKET channels join the supervisor (zygote.process) to the
zygote (zygote.main), so that each has one reader on either side:

  REQUESTS_FD, asked and answered in turn (the supervisor waits for each answer):
    -> Ready(pid)                                   once, at start
    Spawn(...) + [stdin, stdout, stderr, request, error pipe(, ruleset)]
      -> Forked(pid, canary) | ForkFailed(errno, message)
    Pool(...) + [(ruleset)]: keep forking children for it, one per gid
    Refill(name, generation, gid): one was used, fork another
    Drain(name): stop forking for it
  EVENTS_FD, what the zygote says unasked:
    -> Pooled(name, generation, pid, helper, gid, canary) + [hand-over socket]: one is ready
    -> PoolFailed(name, generation, pid, helper, why, gid): one died first
    -> Unused(gids): gids given for children that will never be forked
       (the pool was replaced or drained, or a fork failed)

Spawn and Pool start with the same four fields, what the child becomes
(program, cwd, umask, entry): the zygote forks with the message as it came.
A gid is the child's session gid (a root supervisor gives each child its
own: it replaces the credentials' gid, or makes an allow_root child uid 0
with that gid), or None: the credentials as they are. helper is the pid of a
pooled child's exec helper, or 0 (see zygote.main). canary is the file the
zygote made for that child alone to mark its Landlock domain with
(zygote.canary.make), or None: the supervisor knows the domain by it.

A child's argv and environment are a Request: a fresh child reads it after
the fork from the `request` memfd (`size` bytes), a pooled one from its
hand-over socket with [stdin, stdout, stderr, error pipe]: a client's
secrets never enter the zygote, whose memory every later child copies.
The error pipe is the supervisor's, made for each child, fresh or pooled:
EOF means exec; anything else is a ChildFailure.

Imported by the zygote: C modules and landlock.enter only.
"""
import array
import collections
import ctypes
import marshal
import os
import _socket as socket  # not socket.py: its enums cost every fork of the zygote

from landlock import enter

REQUESTS_FD = 3
EVENTS_FD = 4
MAX_MESSAGE = 256 * 1024   # a Request (argv and environment), checked by the supervisor
# What a waiting child takes: below malloc's mmap threshold, so receiving it
# costs no mmap/munmap; a larger Request gets a fresh child.
HANDOVER_MAX = 64 * 1024
_FDS_SPACE = socket.CMSG_SPACE(8 * 4)

# Spawn and Pool start with what the child becomes (entry: a landlock.enter.Entry).
Spawn = collections.namedtuple("Spawn", "program cwd umask entry gid size")
Pool = collections.namedtuple("Pool", "program cwd umask entry name generation gids")
Refill = collections.namedtuple("Refill", "name generation gid")
Drain = collections.namedtuple("Drain", "name")
Ready = collections.namedtuple("Ready", "pid")
Forked = collections.namedtuple("Forked", "pid canary")
ForkFailed = collections.namedtuple("ForkFailed", "errno message")
Pooled = collections.namedtuple("Pooled", "name generation pid helper gid canary")
PoolFailed = collections.namedtuple("PoolFailed", "name generation pid helper why gid")
Unused = collections.namedtuple("Unused", "gids")
Request = collections.namedtuple("Request", "argv env")

_TYPES = {kind.__name__: kind for kind in (Spawn, Pool, Refill, Drain, Ready, Forked, ForkFailed, Pooled,
                                           PoolFailed, Unused, Request)}


def encode(message: tuple) -> bytes:
    """(its type's name, *its fields), marshal'd: marshal takes no named
    tuple, so an Entry goes as a plain tuple too."""
    return marshal.dumps((type(message).__name__,
                          *[tuple(field) if isinstance(field, enter.Entry) else field for field in message]))


def decode(data: bytes) -> tuple:
    """The message encode() made; ValueError for anything else."""
    try:
        name, *fields = marshal.loads(data)
        message = _TYPES[name]._make(fields)
    except (EOFError, TypeError, ValueError, KeyError) as e:
        raise ValueError(f"not a message: {e!r}") from None
    if isinstance(message, (Spawn, Pool)):
        message = message._replace(entry=enter.Entry._make(message.entry))
    return message


def send(channel: socket.socket, message: tuple | bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
    """message, or its encoding made already, and fds."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    channel.sendmsg([message if isinstance(message, bytes) else encode(message)], ancillary)


# One receive buffer per size, made once: recvmsg(size) would map, shrink
# and unmap a fresh one for every message (three system calls a spawn).
# ctypes' is calloc'd: its pages untouched until a message is written there
# (a bytearray would be zeroed page by page, in a pooled child too).
_BUFFERS: dict[int, ctypes.Array[ctypes.c_char]] = {}


def receive(channel: socket.socket, size: int, flags: int = 0) -> tuple[tuple | None, list[int]]:
    """A message and its fds (close-on-exec), or None at EOF. When not all
    its fds could be received (the receiver is out of fds), none are."""
    buffer = _BUFFERS.get(size)
    if buffer is None:
        buffer = _BUFFERS[size] = ctypes.create_string_buffer(size)
    length, ancillary, got, _ = channel.recvmsg_into([buffer], _FDS_SPACE, socket.MSG_CMSG_CLOEXEC | flags)
    data = ctypes.string_at(buffer, length)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(array.array("i", payload[:len(payload) - len(payload) % 4]))
    if got & socket.MSG_CTRUNC:
        close(fds)
        fds = []
    if not data:
        close(fds)
        return None, []
    return decode(data), fds


def close(fds: list[int]) -> None:
    """The fds a message brought: one close_range when they are consecutive
    (as received fds are, the lowest free ones), else one by one."""
    if fds and fds == list(range(fds[0], fds[0] + len(fds))):
        os.closerange(fds[0], fds[-1] + 1)
        return
    for fd in fds:
        os.close(fd)


class ChildFailure(collections.namedtuple("ChildFailure", "stage errno message")):
    """Why a child did not reach exec, as it wrote it on its error pipe:
    "stage:errno:message" (the stages: zygote.child.STAGES)."""
    __slots__ = ()

    def encode(self) -> bytes:
        return f"{self.stage}:{self.errno}:{self.message}".encode(errors="replace")[:4096]

    @classmethod
    def decode(cls, data: bytes) -> "ChildFailure":
        stage, _, rest = data.decode(errors="replace").partition(":")
        number, _, message = rest.partition(":")
        return cls(stage, int(number) if number.isdigit() else 0, message)

    def __str__(self) -> str:
        return f"{self.stage}: {self.message}"
