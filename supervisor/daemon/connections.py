"""Client connections: accepting (with EMFILE back-off), who may connect, the owner's reserve, deadlines, requests in, replies out.

A request goes to `on_request(conn, message, fds)`; what it raises as a
SupervisorError is answered with an `error` of its code. A closed
connection is reported to `on_close(conn)` (its child may have to go).
"""
from __future__ import annotations

import fcntl
import os
import socket
import struct
import termios
import time
from collections.abc import Callable, Sequence

from . import peers, procfs
from .. import protocol
from ..errors import Code, Refused, SupervisorError
from .limits import Limits, OwnLimits
from .log import log
from .loop import Loop, Periodic
from .session import Connection

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any


if TYPE_CHECKING:
    Handler = Callable[[Connection, dict[str, Any], list[int]], None]
# Bytes a connection may hold unread (kernel accounting) for news to be
# offered: the socket's buffer (~208 KiB) keeps room for what must arrive.
UNREAD_MAX = 64 * 1024


class Connections:
    def __init__(self, loop: Loop, limits: Limits, own: OwnLimits, allow_uids: frozenset[int],
                 allow_gids: frozenset[int], stats: dict[str, int], tick: Periodic,
                 on_request: Handler, on_close: Callable[[Connection], None]) -> None:
        self.loop, self.limits, self.own, self.stats, self.tick = loop, limits, own, stats, tick
        self.allow_uids, self.allow_gids = allow_uids, allow_gids
        self.on_request, self.on_close = on_request, on_close
        self.pid = os.getpid()
        self.open: dict[int, Connection] = {}       # by fd
        self.of_uid: dict[int, int] = {}            # uid -> its open connections
        self.not_descendants: dict[tuple[int, int], bool] = {}  # peers.process_key of peers checked
        self.listener: socket.socket | None = None
        self.accept_paused = False       # out of fds: the listener is not watched for a moment

    def __len__(self) -> int:
        return len(self.open)

    def listen(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.listener = sock
        self.loop.watch(sock, self._accept)

    def stop_listening(self) -> None:
        if self.listener is not None:
            if not self.accept_paused:
                self.loop.unwatch(self.listener)
            self.listener.close()
            self.listener = None

    def _accept(self) -> None:
        """One connection a turn: another waiting keeps the listener readable
        (no accept() that fails to find one on every spawn's path)."""
        while self.listener is not None:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                # EMFILE/ENFILE: the backlog waits. The listener stays readable,
                # so stop watching it for a while rather than spin on it.
                if not self.accept_paused:
                    log(f"accept: {e}; pausing accepts")
                self._pause_accepts()
                return
            sock.setblocking(False)
            try:
                peer = peers.credentials(sock)
            except OSError:
                sock.close()
                continue
            refusal = self._refusal(peer, max(sock.fileno(), peer.pidfd))
            if refusal:
                self.stats["refused"] += 1
                self.reply(sock, protocol.error(refusal.code, str(refusal)))
                peer.close()
                sock.close()
                continue
            self.add(sock, peer)
            return

    def _pause_accepts(self, seconds: float = 0.1) -> None:
        if self.listener is None or self.accept_paused:
            return
        self.loop.unwatch(self.listener)
        self.accept_paused = True

        def resume() -> None:
            self.accept_paused = False
            if self.listener is not None:
                self.loop.watch(self.listener, self._accept)
        self.loop.at(seconds, resume)

    def _refusal(self, peer: peers.Peer, highest_fd: int) -> Refused | None:
        """Why peer may not connect, if it may not. The last connections and
        fds are kept for the supervisor's own uid: others cannot lock it out."""
        limits, count = self.limits, len(self.open)
        if count >= limits.connections:
            return Refused(Code.TOO_MANY_CONNECTIONS, f"the supervisor has {count} connections, its limit")
        owner = peer.uid == os.geteuid()
        if not owner and peer.uid not in self.allow_uids and not (
                self.allow_gids and ({peer.gid} | procfs.groups_of(peer.pid)) & self.allow_gids):
            return Refused(Code.REFUSED_PEER, f"uid {peer.uid} is not allowed to use this supervisor")
        if not owner:
            if count >= limits.connections - limits.owner_connections:
                return Refused(Code.TOO_MANY_CONNECTIONS, f"the supervisor has {count} connections; the last "
                               f"{limits.owner_connections} are kept for its owner")
            if self.of_uid.get(peer.uid, 0) >= limits.connections_per_uid:
                return Refused(Code.TOO_MANY_CONNECTIONS, f"uid {peer.uid} has {limits.connections_per_uid} "
                               "connections, its limit")
            # The lowest free fd is the one accept() gave: every one below is taken.
            fd_limit, reserve = self.own.fd_limit, self.own.fd_reserve
            if highest_fd >= fd_limit - reserve:
                return Refused(Code.TOO_MANY_CONNECTIONS, f"the supervisor is near its limit of {fd_limit} file "
                               f"descriptors; the last {reserve} are kept for its owner")
        if self._descends(peer) or not peer.alive():
            return Refused(Code.REFUSED_PEER, "a process started by this supervisor may not ask it for spawns")
        return None

    def _descends(self, peer: peers.Peer) -> bool:
        """peers.descends_from, remembered for the processes found not to
        descend: one that is not our descendant never becomes one (it can only
        be reparented to an ancestor of its own), and peers.process_key names
        it for good. A proxy reconnecting for every spawn costs one fstat of
        its pidfd, not a walk up to init."""
        pid = peer.pid
        try:
            key = peers.process_key(peer)
        except (OSError, IndexError, ValueError):
            return peers.descends_from(pid, self.pid)
        if key in self.not_descendants:
            return False
        if peers.descends_from(pid, self.pid):
            return True
        if len(self.not_descendants) >= 4096:
            self.not_descendants.clear()
        self.not_descendants[key] = True
        return False

    def add(self, sock: socket.socket, peer: peers.Peer, control: bool = False) -> Connection:
        conn = Connection(sock, peer, control=control)
        self.open[sock.fileno()] = conn
        self.of_uid[peer.uid] = self.of_uid.get(peer.uid, 0) + 1
        self.loop.watch(sock, lambda: self._on_readable(conn))
        if not control:
            # A float, not a timer: a timer per connection keeps a heap entry
            # and a closure for 5 s, thousands at hundreds of spawns a second
            # (+1.5-3.6 MiB RSS that stays). One sweep a second finds the late.
            self.deadline(conn, self.limits.request_deadline)
        return conn

    def adopt(self, control: Connection, fds: list[int]) -> None:
        """Private mode: the proxy hands over one end of a fresh socketpair."""
        if len(fds) != 1:
            raise Refused(Code.BAD_FDS, f"'connect' takes exactly 1 fd, got {len(fds)}")
        try:
            sock = socket.socket(fileno=fds[0])
        except OSError:
            raise Refused(Code.BAD_FDS, "'connect' needs a socket") from None
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
            sock.close()
            raise Refused(Code.BAD_FDS, "'connect' needs an AF_UNIX SOCK_SEQPACKET socket")
        sock.setblocking(False)
        peer = peers.Peer(control.peer.pid, control.peer.uid, control.peer.gid)
        if len(self.open) >= self.limits.connections:
            self.reply(sock, protocol.error(Code.TOO_MANY_CONNECTIONS, "too many connections"))
            sock.close()
            return
        self.add(sock, peer)

    def deadline(self, conn: Connection, seconds: float) -> None:
        conn.deadline = time.monotonic() + seconds
        self.tick.start()

    def expire_due(self) -> bool:
        """Close the connections past their deadline; whether any other waits for one."""
        now = time.monotonic()
        waiting = False
        for conn in list(self.open.values()):
            if conn.deadline is not None:
                if conn.deadline <= now:
                    self._expire(conn)
                else:
                    waiting = True
        return waiting

    def _expire(self, conn: Connection) -> None:
        if conn.sock.fileno() not in self.open:
            return
        if conn.session is None:
            self.reply(conn.sock, protocol.error(Code.TIMEOUT, f"no request within {self.limits.request_deadline} s"))
            self.close(conn)
        elif conn.session.exited is not None or conn.session.kill_reason == "spawn_failed":
            self.close(conn)  # its child is gone and it asked for nothing since

    def close(self, conn: Connection) -> None:
        fd = conn.sock.fileno()
        if self.open.pop(fd, None) is None:
            return
        left = self.of_uid.get(conn.peer.uid, 1) - 1
        if left > 0:
            self.of_uid[conn.peer.uid] = left
        else:
            self.of_uid.pop(conn.peer.uid, None)
        conn.deadline = None
        self.loop.unwatch(conn.sock)
        conn.sock.close()
        conn.peer.close()
        self.on_close(conn)

    def close_all(self) -> None:
        for conn in list(self.open.values()):
            self.close(conn)

    @staticmethod
    def reply(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> bool:
        try:
            try:
                protocol.send(sock, message, fds)
            except protocol.ProtocolError:
                # Over 64 KiB: an error quoting a huge request field. Cut.
                protocol.send(sock, protocol.shortened(message), fds)
            return True
        except OSError:
            return False  # a peer that does not read its replies is dropped by the caller

    def send(self, conn: Connection | None, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        if conn is not None and not self.reply(conn.sock, message, fds):
            self.close(conn)

    def offer(self, conn: Connection | None, message: dict[str, Any]) -> bool:
        """Send news a client may not read (a `denied` event) only while its
        connection holds little unread: never at the cost of its `exited`,
        nor of the connection. Whether it went."""
        if conn is None:
            return False
        try:
            queued = struct.unpack("i", fcntl.ioctl(conn.sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        except OSError:
            return False
        return queued <= UNREAD_MAX and self.reply(conn.sock, message)

    def _on_readable(self, conn: Connection) -> None:
        if conn.sock.fileno() not in self.open:
            return
        try:
            message, fds = protocol.recv(conn.sock)
        except (BlockingIOError, InterruptedError):
            return
        except protocol.ProtocolError as e:
            self.stats["refused"] += 1
            self.send(conn, protocol.error(e.code, str(e)))
            return
        except OSError:
            self.close(conn)
            return
        if message is None:
            self.close(conn)
            return
        if conn.session is not None and conn.deadline is not None:
            self.deadline(conn, self.limits.linger)  # it asked for something: not idle
        try:
            self.on_request(conn, message, fds)
        except SupervisorError as e:
            protocol.close_all(fds)
            self.stats["refused"] += 1
            self.send(conn, protocol.error(e.code, str(e), op=message.get("op")))
        except Exception as e:
            protocol.close_all(fds)
            self.stats["refused"] += 1
            log(f"internal error on {message.get('op')!r}: {type(e).__name__}: {e}")
            self.send(conn, protocol.error(
                Code.INTERNAL, f"internal error: {type(e).__name__}: {e}", op=message.get("op")))
