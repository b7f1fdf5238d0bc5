"""The fork-server: one thread, one selectors loop, for its whole life.

Imports stay lean (no threading, logging, asyncio or subprocess): each of
them makes every fork slower, and threading would make fork unsound.
"""
from __future__ import annotations

import errno
import fcntl
import heapq
import itertools
import os
import resource
import selectors
import signal
import socket
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import prctl

import landlock

from . import ids, namespaces, peers, protocol, reap, state
from . import manifest as manifests
from .paths import default_socket_path
from .manifest import Manifest, ManifestError
from .zygote.messages import ChildFailure
from .zygote.pools import Gids
from .zygote.process import Launch, ZygoteProcess

# What a root supervisor keeps in its bounding set: users and groups to
# switch to, capabilities and securebits to drop, state directories to chown,
# paths of other users to read, children of other uids to signal, its own
# resource limits to restore.
KEEP_CAPABILITIES = (prctl.CAP_CHOWN, prctl.CAP_DAC_OVERRIDE, prctl.CAP_DAC_READ_SEARCH,
                     prctl.CAP_FOWNER, prctl.CAP_KILL, prctl.CAP_SETGID, prctl.CAP_SETUID,
                     prctl.CAP_SETPCAP, prctl.CAP_SYS_RESOURCE)
CAUGHT_SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SPAWN_FIELDS = frozenset({"v", "op", "manifest", "args", "env", "narrow"})
RLIMITS = tuple(range(16))   # RLIMIT_CPU .. RLIMIT_RTTIME


@dataclass
class Limits:
    children: int = 256           # in total
    children_per_uid: int = 64
    connections: int = 512
    connections_per_uid: int = 128  # for every uid but the supervisor's own
    owner_connections: int = 32    # of `connections`, kept for the supervisor's own uid
    request_deadline: float = 5.0  # seconds a connection has to send its first request
    linger: float = 5.0           # seconds a connection stays open, idle, after its child's exit
    grace: float = 5.0            # TERM, then KILL this long after
    max_args: int = 256
    max_arg_bytes: int = 32 * 1024


@dataclass
class Connection:
    sock: socket.socket
    peer: peers.Peer
    control: bool = False          # private mode's control channel
    session: "Session | None" = None
    deadline: float | None = None   # monotonic time it is closed by unless it asks for something


@dataclass
class Session:
    pid: int
    manifest: Manifest
    conn: Connection | None
    report: dict[str, Any]
    uid: int
    errpipe: int = -1               # open until exec (EOF) or a failure report
    spawned: bool = False           # the `spawned` reply went out
    exited: dict[str, Any] | None = None
    kill_reason: str | None = None
    record: str | None = None       # the file in sessions/ that outlives a crash
    kill_timer: Any = None
    gid: int | None = None          # its session gid (Config.session_gids)
    leftovers: bool = False         # processes of its session outlived it: its gid stays taken until the KILL
    retry: "tuple[Launch, list[int]] | None" = None  # a pooled child's request and the client's stdio,
                                                          # kept until it execs: a fresh child's if it was tampered with


@dataclass
class Config:
    manifest_paths: list[str]
    socket_path: str | None = None
    listen_fd: int | None = None    # systemd socket activation
    control_fd: int | None = None   # private mode
    allow_uids: frozenset[int] = frozenset()
    allow_gids: frozenset[int] = frozenset()
    state_root: str | None = None
    limits: Limits = field(default_factory=Limits)
    allow_root_servers: bool = False   # load manifests that run as uid 0 (allow_root, user: root)
    dynamic_uids: tuple[int, int] = ids.DEFAULT_DYNAMIC_UIDS
    session_gids: tuple[int, int] | None = None   # a root supervisor's per-session gids
    only: str | None = None         # private mode for one server: load that manifest alone


def log(message: str) -> None:
    try:
        os.write(2, f"landlock-supervisor[{os.getpid()}]: {message}\n".encode(errors="replace"))
    except OSError:
        pass


class Supervisor:
    def __init__(self, config: Config) -> None:
        _keep_stdio_open()
        self.config = config
        self.limits = config.limits
        self.pid = os.getpid()
        self.selector = selectors.DefaultSelector()
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self.timer_seq = itertools.count()
        self.connections: dict[int, Connection] = {}
        self.sessions: dict[int, Session] = {}
        self.confinements: dict[landlock.Spec, landlock.Confinement] = {}
        self.gids = Gids(*config.session_gids) if config.session_gids else None
        # Connections cost fds: ours go up to the hard limit; children keep
        # the limit we were given (the zygote's, set back at its start).
        self.nofile_start = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile_start[1], self.nofile_start[1]))
        except (OSError, ValueError) as e:
            log(f"cannot raise the soft NOFILE limit to the hard one: {e}")
        self.fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        # fds kept for the owner: a spawn takes ~10 at once, more to build a ruleset.
        self.fd_reserve = max(16, min(64, self.fd_limit // 8))
        self.own_limits = _own_limits()
        self.connections_of: dict[int, int] = {}   # uid -> its open connections
        self.zygote = ZygoteProcess(self.selector, self.gids, self.nofile_start)
        self.not_descendants: dict[tuple[int, str], bool] = {}  # (pid, starttime) of peers checked
        self.sweeping = False                                 # the request-deadline sweep is scheduled
        self.stats = {"spawned": 0, "refused": 0, "failed": 0, "exited": 0, "reaped_orphans": 0}
        self.stopping = False
        self.listener: socket.socket | None = None
        self.accept_paused = False       # out of fds: the listener is not watched for a moment
        self.owns_socket_path = False
        self.isolation: namespaces.Isolation | None = None
        self.manifests = self._load_manifests()

    # ---- start-up -------------------------------------------------------

    def _load_manifests(self) -> dict[str, Manifest]:
        """Every manifest; one that does not load stops the (re)load, while one
        refused here (runs as root without the option, state in the way) is
        logged and left out, the others loaded."""
        table = None
        if os.geteuid() == 0 and self.config.state_root:
            table = ids.Table(self.config.state_root, self.config.dynamic_uids)
        loaded = manifests.load_all(self.config.manifest_paths, only=self.config.only, warn=log,
                                    state_root=self.config.state_root,
                                    dynamic_uid=(lambda name: table.assign([name])[name]) if table else None)
        out = {}
        for m in loaded.values():
            if m.runs_as_root and not self.config.allow_root_servers:
                why = "allow_root: true" if m.allow_root else f"user {m.spec.user!r} is uid 0"
                log(f"{m.source}: refused: it runs as root ({why}), which needs `serve --allow-root-servers`")
                continue
            for warning in m.warnings:
                log(f"{m.source}: warning: {warning}")
            if state.prepare(m, log):
                out[m.name] = m
        if self.isolation is not None:
            self.isolation.users(_dynamic_users(out))
        return out

    def _open_listener(self) -> None:
        if self.config.listen_fd is not None:
            sock = socket.socket(fileno=self.config.listen_fd)
            if sock.type != socket.SOCK_SEQPACKET or sock.family != socket.AF_UNIX:
                raise SystemExit("landlock-supervisor: the activation socket must be AF_UNIX SOCK_SEQPACKET")
            sock.set_inheritable(False)  # systemd passes it inheritable
        else:
            path = self.config.socket_path or default_socket_path()
            open_to_others = bool(self.config.allow_uids or self.config.allow_gids)
            _socket_directory(os.path.dirname(path) or ".", open_to_others)
            self._clear_stale(path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            old = os.umask(0o177)
            try:
                sock.bind(path)
            finally:
                os.umask(old)
            os.chmod(path, 0o666 if open_to_others else 0o600)
            self.config.socket_path = path
            self.owns_socket_path = True
            sock.listen(128)
        sock.setblocking(False)
        self.listener = sock
        self.selector.register(sock, selectors.EVENT_READ, self._accept)

    @staticmethod
    def _clear_stale(path: str) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise SystemExit(f"landlock-supervisor: {path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody listens: a crashed supervisor's
            return
        finally:
            probe.close()
        raise SystemExit(f"landlock-supervisor: another supervisor is listening on {path}")

    def _sessions_dir(self) -> str | None:
        if self.config.control_fd is not None or not self.config.state_root:
            return None  # private mode: our proxy's lifetime bounds the children
        return os.path.join(self.config.state_root, "sessions")

    def _end_survivors(self) -> None:
        """Sessions a crashed supervisor left: PDEATHSIG ends direct children
        only, so their descendants may still run."""
        directory = self._sessions_dir()
        if directory is None:
            return
        os.makedirs(directory, mode=0o700, exist_ok=True)
        for name in os.listdir(directory):
            sid_text, _, start = name.partition(".")
            if sid_text.isdigit():
                killed = _kill_session(int(sid_text), start)
                if killed:
                    log(f"ended {killed} process(es) left from session {sid_text} by a previous supervisor")
            os.unlink(os.path.join(directory, name))

    def _install_signals(self) -> None:
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wakeup_r = r
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for sig in CAUGHT_SIGNALS:
            signal.signal(sig, lambda *_: None)  # the wakeup fd carries the number
        self.selector.register(r, selectors.EVENT_READ, self._on_signals)

    # ---- the loop -------------------------------------------------------

    def serve(self) -> int:
        prctl.set_child_subreaper(1)
        if os.geteuid() == 0:
            # Before the zygote: it and every child inherit the namespaces.
            self.isolation = namespaces.isolate(
                log, _dynamic_users(self.manifests),
                os.path.join(self.config.state_root, "nss") if self.config.state_root else None)
        if prctl.cap_effective.setpcap:
            landlock.privileges.limit_bounding_set(KEEP_CAPABILITIES)
        try:
            self.zygote.start()  # after the bounding set shrank: it inherits that
        except OSError as e:
            raise SystemExit(f"landlock-supervisor: cannot start the zygote: {e}") from None
        self._end_survivors()
        self._install_signals()
        if self.config.control_fd is not None:
            control = socket.socket(fileno=self.config.control_fd)
            control.set_inheritable(False)
            control.setblocking(False)
            self._add_connection(control, peers.credentials(control), control=True)
        else:
            self._open_listener()
            where = self.config.socket_path or "the socket systemd passed"
            log(f"serving {len(self.manifests)} manifest(s) on {where}")
        while not (self.stopping and not self.sessions):
            timeout = None
            if self.timers:
                timeout = max(0.0, self.timers[0][0] - time.monotonic())
            for key, _ in self.selector.select(timeout):
                _guarded(key.data, key)
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                _, _, callback = heapq.heappop(self.timers)
                _guarded(callback)
        self._finish()
        return 0

    def _at(self, delay: float, callback: Callable[[], None]) -> list[bool]:
        """Run callback after delay; the returned flag cancels it when set."""
        cancelled = [False]
        heapq.heappush(self.timers, (time.monotonic() + delay, next(self.timer_seq),
                                     lambda: None if cancelled[0] else callback()))
        return cancelled

    def _on_signals(self, key: Any) -> None:
        try:
            data = os.read(self.wakeup_r, 512)
        except BlockingIOError:
            return
        received = set(data)
        if signal.SIGCHLD in received:
            self._reap()
        if signal.SIGHUP in received:
            self._reload()
        if received & {signal.SIGTERM, signal.SIGINT}:
            self.shutdown("shutdown")

    def _reload(self) -> None:
        try:
            new = self._load_manifests()
        except (ManifestError, OSError) as e:
            log(f"reload failed, keeping the {len(self.manifests)} manifest(s) in force: {e}")
            return
        self.manifests = new
        self.zygote.drain()
        for confinement in self.confinements.values():
            confinement.close()
        self.confinements.clear()
        log(f"reloaded {len(new)} manifest(s)")

    def shutdown(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.zygote.close()  # the pooled children exit with it
        if self.listener is not None:
            if not self.accept_paused:
                self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None
            self._remove_socket_path()
        for session in list(self.sessions.values()):
            self._terminate(session, reason)

    def _remove_socket_path(self) -> None:
        if self.owns_socket_path and self.config.socket_path:
            try:
                os.unlink(self.config.socket_path)
            except FileNotFoundError:
                pass
            self.owns_socket_path = False

    def _finish(self) -> None:
        # Reparented descendants that outlived their session's leader; killing
        # one orphans its own children to us in turn.
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            left = _children_of(self.pid)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for _ in reap.reap_all():
                pass
            time.sleep(0.01)
        for conn in list(self.connections.values()):
            self._close(conn)
        self._remove_socket_path()

    # ---- connections ----------------------------------------------------

    def _accept(self, key: Any) -> None:
        while True:
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
                self._reply(sock, {"event": "error", "code": refusal[0], "error": refusal[1]})
                peer.close()
                sock.close()
                continue
            self._add_connection(sock, peer)

    def _pause_accepts(self, seconds: float = 0.1) -> None:
        if self.listener is None or self.accept_paused:
            return
        self.selector.unregister(self.listener)
        self.accept_paused = True

        def resume() -> None:
            self.accept_paused = False
            if self.listener is not None:
                self.selector.register(self.listener, selectors.EVENT_READ, self._accept)
        self._at(seconds, resume)

    def _refusal(self, peer: peers.Peer, highest_fd: int) -> tuple[str, str] | None:
        """(code, why) when peer may not connect. The last connections and
        fds are kept for the supervisor's own uid: others cannot lock it out."""
        limits, count = self.limits, len(self.connections)
        if count >= limits.connections:
            return "too_many_connections", f"the supervisor has {count} connections, its limit"
        owner = peer.uid == os.geteuid()
        if not owner and peer.uid not in self.config.allow_uids and not (
                self.config.allow_gids and ({peer.gid} | peers.groups_of(peer.pid)) & self.config.allow_gids):
            return "refused_peer", f"uid {peer.uid} is not allowed to use this supervisor"
        if not owner:
            if count >= limits.connections - limits.owner_connections:
                return "too_many_connections", (f"the supervisor has {count} connections; the last "
                                                f"{limits.owner_connections} are kept for its owner")
            if self.connections_of.get(peer.uid, 0) >= limits.connections_per_uid:
                return "too_many_connections", (f"uid {peer.uid} has {limits.connections_per_uid} "
                                                "connections, its limit")
            # The lowest free fd is the one accept() gave: every one below is taken.
            if highest_fd >= self.fd_limit - self.fd_reserve:
                return "too_many_connections", (f"the supervisor is near its limit of {self.fd_limit} file "
                                                f"descriptors; the last {self.fd_reserve} are kept for its owner")
        if self._descends(peer.pid) or not peer.alive():
            return "refused_peer", "a process started by this supervisor may not ask it for spawns"
        return None

    def _descends(self, pid: int) -> bool:
        """peers.descends_from, remembered for the processes found not to
        descend: one that is not our descendant never becomes one (it can only
        be reparented to an ancestor of its own), and (pid, starttime) names
        it for good. A proxy reconnecting for every spawn costs one read of
        /proc/PID/stat, not a walk up to init."""
        try:
            key = (pid, peers.stat_fields(pid)[19])
        except (OSError, IndexError):
            return peers.descends_from(pid, self.pid)
        if key in self.not_descendants:
            return False
        if peers.descends_from(pid, self.pid):
            return True
        if len(self.not_descendants) >= 4096:
            self.not_descendants.clear()
        self.not_descendants[key] = True
        return False

    def _add_connection(self, sock: socket.socket, peer: peers.Peer, control: bool = False) -> Connection:
        conn = Connection(sock, peer, control=control)
        self.connections[sock.fileno()] = conn
        self.connections_of[peer.uid] = self.connections_of.get(peer.uid, 0) + 1
        self.selector.register(sock, selectors.EVENT_READ, lambda key: self._on_readable(conn))
        if not control:
            # A float, not a timer: a timer per connection keeps a heap entry
            # and a closure for 5 s, thousands at hundreds of spawns a second
            # (+1.5-3.6 MiB RSS that stays). One sweep a second finds the late.
            self._deadline(conn, self.limits.request_deadline)
        return conn

    def _deadline(self, conn: Connection, seconds: float) -> None:
        conn.deadline = time.monotonic() + seconds
        if not self.sweeping:
            self.sweeping = True
            self._at(1.0, self._sweep)

    def _sweep(self) -> None:
        now = time.monotonic()
        waiting = False
        for conn in list(self.connections.values()):
            if conn.deadline is not None:
                if conn.deadline <= now:
                    self._expire(conn)
                else:
                    waiting = True
        self._check_own_limits()
        self.sweeping = waiting or bool(self.sessions)
        if self.sweeping:
            self._at(1.0, self._sweep)

    def _expire(self, conn: Connection | None) -> None:
        if conn is None or conn.sock.fileno() not in self.connections:
            return
        if conn.session is None:
            self._reply(conn.sock, {"event": "error", "code": "timeout",
                                    "error": f"no request within {self.limits.request_deadline} s"})
            self._close(conn)
        elif conn.session.exited is not None or conn.session.kill_reason == "spawn_failed":
            self._close(conn)  # its child is gone and it asked for nothing since

    def _check_own_limits(self) -> None:
        """A process that may prlimit(2) us (one of our uid and gid: under a
        user's supervisor, any child) may have lowered our limits: put them
        back where we still can (a soft limit up to its hard one; a hard one
        only with CAP_SYS_RESOURCE) and say so."""
        now = _own_limits()
        if now == self.own_limits:
            return
        for res, (was, got) in enumerate(zip(self.own_limits, now)):
            if was == got:
                continue
            try:
                resource.setrlimit(res, was)
                log(f"resource limit {res} was lowered to {got} by another process: restored to {was}")
            except (OSError, ValueError):
                try:
                    resource.setrlimit(res, (got[1], got[1]))
                except (OSError, ValueError):
                    pass
                log(f"resource limit {res} was lowered to {got} by another process: cannot restore {was}")
        self.own_limits = _own_limits()

    def _close(self, conn: Connection) -> None:
        fd = conn.sock.fileno()
        if self.connections.pop(fd, None) is None:
            return
        left = self.connections_of.get(conn.peer.uid, 1) - 1
        if left > 0:
            self.connections_of[conn.peer.uid] = left
        else:
            self.connections_of.pop(conn.peer.uid, None)
        conn.deadline = None
        self.selector.unregister(conn.sock)
        conn.sock.close()
        conn.peer.close()
        session = conn.session
        if session is not None:
            session.conn = None
            if session.manifest.on_disconnect == "kill" and session.exited is None:
                self._terminate(session, "client_gone")
        if conn.control:
            self.shutdown("shutdown")

    def _reply(self, sock: socket.socket, message: dict[str, Any], fds: list[int] = ()) -> bool:
        try:
            try:
                protocol.send(sock, message, fds)
            except protocol.ProtocolError:
                # Over 64 KiB: an error quoting a huge request field. Cut.
                protocol.send(sock, protocol.shortened(message), fds)
            return True
        except OSError:
            return False  # a peer that does not read its replies is dropped by the caller

    def _send(self, conn: Connection | None, message: dict[str, Any]) -> None:
        if conn is not None and not self._reply(conn.sock, message):
            self._close(conn)

    def _on_readable(self, conn: Connection) -> None:
        if conn.sock.fileno() not in self.connections:
            return
        try:
            message, fds = protocol.recv(conn.sock)
        except (BlockingIOError, InterruptedError):
            return
        except protocol.ProtocolError as e:
            self.stats["refused"] += 1
            self._send(conn, {"event": "error", "code": e.code, "error": str(e)})
            return
        except OSError:
            self._close(conn)
            return
        if message is None:
            self._close(conn)
            return
        if conn.session is not None and conn.deadline is not None:
            self._deadline(conn, self.limits.linger)  # it asked for something: not idle
        try:
            self._dispatch(conn, message, fds)
        except protocol.ProtocolError as e:
            protocol.close_all(fds)
            self.stats["refused"] += 1
            self._send(conn, {"event": "error", "code": e.code, "error": str(e), "op": message.get("op")})
        except Exception as e:
            protocol.close_all(fds)
            self.stats["refused"] += 1
            log(f"internal error on {message.get('op')!r}: {type(e).__name__}: {e}")
            self._send(conn, {"event": "error", "code": "internal",
                              "error": f"internal error: {type(e).__name__}: {e}", "op": message.get("op")})

    def _dispatch(self, conn: Connection, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        if conn.control:
            if op != "connect":
                raise protocol.ProtocolError(f"the control channel takes only 'connect', not {op!r}")
            self._connect(conn, fds)
            return
        if op == "spawn":
            if conn.session is not None:
                raise protocol.ProtocolError("this connection has spawned already: one connection per child",
                                             "already_spawned")
            self._spawn(conn, message, fds)
            return
        if op == "connect":
            raise protocol.ProtocolError("'connect' is for a private supervisor's control channel only", "bad_op")
        if fds:
            raise protocol.ProtocolError(f"{op!r} takes no file descriptors", "bad_fds")
        if op == "ping":
            self._send(conn, {"event": "pong", "pid": self.pid})
        elif op == "list":
            # Other uids' sessions (pids, uids, clients) are the owner's to see.
            everyone = conn.peer.uid == os.geteuid()
            self._send(conn, {"event": "list", "manifests": sorted(self.manifests), "children": [
                {"pid": s.pid, "manifest": s.manifest.name, "peer_uid": s.uid,
                 "peer_pid": s.conn.peer.pid if s.conn else None, "running": s.exited is None}
                for s in self.sessions.values() if everyone or s.uid == conn.peer.uid]})
        elif op == "stats":
            self._send(conn, {"event": "stats", **self.stats, "children": len(self.sessions),
                              "zygote": self.zygote.pid,
                              "pooled": {name: len(ready) for name, ready in self.zygote.ready.items() if ready},
                              "connections": len(self.connections), "fds": _fd_count(),
                              "rss_kib": _rss_kib()})
        elif op == "describe":
            name = message.get("manifest")
            m = self.manifests.get(name) if isinstance(name, str) else None
            if m is None:
                raise protocol.ProtocolError(f"no such manifest {name!r}", "no_such_manifest")
            # What a client may give it: `run` passes the client_env names it
            # has (an MCP client config's `env`), and says which it keeps.
            self._send(conn, {"event": "described", "manifest": m.name, "client_env": sorted(m.client_env),
                              "client_args": m.client_args})
        elif op in ("signal", "status"):
            session = conn.session
            if session is None:
                raise protocol.ProtocolError(f"{op!r} needs a spawned child on this connection", "no_child")
            if op == "status":
                self._send(conn, {"event": "status", "pid": session.pid, "running": session.exited is None,
                                  "exited": session.exited})
            else:
                self._signal(conn, session, message)
        else:
            raise protocol.ProtocolError(f"unknown operation {op!r}", "bad_op")

    def _connect(self, control: Connection, fds: list[int]) -> None:
        """Private mode: the proxy hands over one end of a fresh socketpair."""
        if len(fds) != 1:
            raise protocol.ProtocolError(f"'connect' takes exactly 1 fd, got {len(fds)}", "bad_fds")
        try:
            sock = socket.socket(fileno=fds[0])
        except OSError:
            raise protocol.ProtocolError("'connect' needs a socket", "bad_fds") from None
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
            sock.close()
            raise protocol.ProtocolError("'connect' needs an AF_UNIX SOCK_SEQPACKET socket", "bad_fds")
        sock.setblocking(False)
        peer = peers.Peer(control.peer.pid, control.peer.uid, control.peer.gid)
        if len(self.connections) >= self.limits.connections:
            self._reply(sock, {"event": "error", "code": "too_many_connections", "error": "too many connections"})
            sock.close()
            return
        self._add_connection(sock, peer)

    def _signal(self, conn: Connection, session: Session, message: dict[str, Any]) -> None:
        sig = message.get("signal", signal.SIGTERM)
        try:
            if isinstance(sig, bool):  # JSON true is no signal number
                raise ValueError(sig)
            sig = signal.Signals[sig] if isinstance(sig, str) else signal.Signals(sig)
        except (KeyError, ValueError):
            raise protocol.ProtocolError(f"unknown signal {message.get('signal')!r}", "bad_signal") from None
        if session.exited is not None:
            self._send(conn, {"event": "error", "code": "exited", "error": "the child has exited", "op": "signal"})
            return
        session.kill_reason = "signalled_on_request"
        try:
            if message.get("group", True):
                os.killpg(session.pid, sig)
            else:
                os.kill(session.pid, sig)
        except ProcessLookupError:
            pass
        self._send(conn, {"event": "signalled", "signal": sig.value})

    # ---- spawning -------------------------------------------------------

    def _spawn(self, conn: Connection, request: dict[str, Any], fds: list[int]) -> None:
        try:
            launch, stdio = self._plan(conn, request, fds)
        except landlock.LandlockUnavailable as e:
            raise protocol.ProtocolError(str(e), "confinement_unavailable") from None
        except landlock.SpecError as e:
            raise protocol.ProtocolError(str(e), "bad_spec") from None
        except OSError as e:  # out of fds or memory while building the ruleset
            raise protocol.ProtocolError(f"cannot prepare the sandbox: {e.strerror or e}", "spawn_failed") from None
        m = self.manifests[request["manifest"]]
        self._check_own_limits()
        conn.deadline = None
        try:
            pooled = self.zygote.take(launch, stdio) if launch.pool else None
        except OSError as e:
            protocol.close_all(fds)
            self._deadline(conn, self.limits.linger)
            raise protocol.ProtocolError(f"fork failed: {e.strerror or e}", "fork_failed") from None
        while self.zygote.tampered:
            log(f"{m.name}: pooled child {self.zygote.tampered.pop()} had its resource limits changed while it "
                "waited: discarded, a fresh child serves the request")
        if pooled is None:
            self._fresh(conn, m, launch, stdio)
            return
        pid, errpipe, gid = pooled
        retry = None
        if gid is None:
            # Others of its uid and gid could prlimit it while it waited: it
            # compares its limits at hand-over, and a fresh child serves the
            # request if they changed. The client's fds stay here until then.
            retry = (launch, stdio)
        else:
            protocol.close_all(fds)
        self._track(conn, m, launch, pid, errpipe, gid, retry)

    def _fresh(self, conn: Connection, m: Manifest, launch: Launch, stdio: list[int]) -> None:
        """A fresh child for the request: the zygote forks it. Closes stdio."""
        try:
            try:
                gid = self.gids.take() if self.gids is not None and launch.session_gid else None
            except OSError as e:
                raise protocol.ProtocolError(str(e), "too_many_children") from None
            try:
                pid, errpipe, gid = self.zygote.spawn(launch, stdio, gid)
            except OSError as e:
                self._release_gid(gid)
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    raise protocol.ProtocolError(f"{m.name}: out of file descriptors: {e.strerror}",
                                                 "spawn_failed") from None
                raise protocol.ProtocolError(f"fork failed: {e.strerror or e}", "fork_failed") from None
        except protocol.ProtocolError:
            self._deadline(conn, self.limits.linger)
            raise
        finally:
            protocol.close_all(stdio)
        self._track(conn, m, launch, pid, errpipe, gid, None)

    def _track(self, conn: Connection, m: Manifest, launch: Launch, pid: int, errpipe: int,
               gid: int | None, retry: "tuple[Launch, list[int]] | None") -> None:
        previous = self.sessions.get(pid)
        if previous is not None:
            # pids wrap: the last child with this pid was reaped in this same
            # select batch, its error pipe not read yet. Settle it first, or
            # it would take the new child's session with it when forgotten.
            self._on_errpipe(previous)
            self.sessions.pop(pid, None)
        session = Session(pid, m, conn,
                          {**launch.confinement.report_dict, "tid": pid}, conn.peer.uid, errpipe,
                          gid=gid, retry=retry)
        # Now, while the child execs on the other CPU; a failed one is forgotten with its record.
        session.record = self._record(pid)
        conn.session = session
        self.sessions[pid] = session
        self.selector.register(errpipe, selectors.EVENT_READ, lambda key: self._on_errpipe(session))
        if not self.sweeping:  # the sweep also watches our own limits while children run
            self.sweeping = True
            self._at(1.0, self._sweep)

    def _release_gid(self, gid: int | None) -> None:
        if self.gids is not None:
            self.gids.release(gid)

    def _plan(self, conn: Connection, request: dict[str, Any], fds: list[int]) -> tuple[Launch, list[int]]:
        unknown = sorted(set(request) - SPAWN_FIELDS)
        if unknown:  # a misspelt "narrow" must not go unnoticed: the child would get more
            raise protocol.ProtocolError(f"spawn: unknown field(s) {', '.join(unknown)[:200]}")
        name = request.get("manifest")
        if not isinstance(name, str) or name not in self.manifests:
            raise protocol.ProtocolError(f"no such manifest {name!r}", "no_such_manifest")
        if self.stopping:
            raise protocol.ProtocolError("the supervisor is shutting down", "shutting_down")
        m = self.manifests[name]
        if len(fds) != 3:
            raise protocol.ProtocolError(f"'spawn' takes exactly 3 fds (stdin, stdout, stderr), got {len(fds)}",
                                         "bad_fds")
        for i, fd in enumerate(fds):
            _check_stdio(i, fd, m)
        if len(self.sessions) >= self.limits.children:
            raise protocol.ProtocolError(f"the supervisor runs {len(self.sessions)} children, its limit",
                                         "too_many_children")
        if sum(s.uid == conn.peer.uid for s in self.sessions.values()) >= self.limits.children_per_uid:
            raise protocol.ProtocolError(f"uid {conn.peer.uid} has {self.limits.children_per_uid} children, "
                                         "its limit", "too_many_children")
        args = request.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
            raise protocol.ProtocolError("args: expected a list of strings")
        if args and not m.client_args:
            raise protocol.ProtocolError(f"manifest {name!r} does not let clients add arguments", "args_refused")
        if len(args) > self.limits.max_args or sum(map(len, args)) > self.limits.max_arg_bytes:
            raise protocol.ProtocolError("args: too many or too long", "too_large")
        client_env = request.get("env")
        client_env = {} if client_env is None else client_env  # [] or false is a wrong type, not "none"
        if not isinstance(client_env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and "\0" not in v for k, v in client_env.items()):
            raise protocol.ProtocolError("env: expected an object of strings")
        refused = sorted(set(client_env) - m.client_env)
        if refused:
            raise protocol.ProtocolError(f"env: manifest {name!r} does not take {', '.join(refused)} from clients "
                                         f"(it takes: {', '.join(sorted(m.client_env)) or 'nothing'})",
                                         "env_refused")
        spec = manifests.narrow(m, request.get("narrow"))
        launch = Launch(m.command, [m.command, *m.args, *args],
                              m.environment(os.environ, client_env), m.cwd, m.umask, self._confinement(spec),
                              # A pool serves the manifest's own spec (or a narrowing equal to it).
                              pool=(m.name, m.pool) if m.pool and spec == m.spec else None,
                              # A manifest that names its group keeps it.
                              session_gid=m.spec.group is None)
        return launch, fds

    def _confinement(self, spec: landlock.Spec) -> landlock.Confinement:
        """Built once per spec, reused while its paths are the same inodes."""
        confinement = self.confinements.get(spec)
        if confinement is not None and confinement.ruleset.is_current():
            return confinement
        if confinement is not None:
            confinement.close()
            del self.confinements[spec]
        if len(self.confinements) >= 64:  # narrowed specs: keep the cache bounded
            oldest = next(iter(self.confinements))
            self.confinements.pop(oldest).close()
        confinement = landlock.prepare(spec)
        self.confinements[spec] = confinement
        return confinement

    def _on_errpipe(self, session: Session) -> None:
        try:
            data = os.read(session.errpipe, 4096)
        except BlockingIOError:
            return
        self.selector.unregister(session.errpipe)
        os.close(session.errpipe)
        session.errpipe = -1
        retry, session.retry = session.retry, None
        if data and retry is not None and ChildFailure.decode(data).stage == "tampered":
            self._replace_tampered(session, *retry)
            return
        if retry is not None:
            protocol.close_all(retry[1])
        if data:
            error = ChildFailure.decode(data)
            self.stats["failed"] += 1
            self._send(session.conn, {"event": "error", "code": "spawn_failed", "stage": error.stage,
                                      "errno": error.errno, "error": f"{session.manifest.name}: {error}",
                                      "op": "spawn"})
            session.kill_reason = "spawn_failed"
            if session.conn is not None:
                self._deadline(session.conn, self.limits.linger)
            if session.exited is not None:
                self._forget(session)
            return
        self.stats["spawned"] += 1
        session.spawned = True
        self._send(session.conn, {"event": "spawned", "pid": session.pid, "pgid": session.pid,
                                  "manifest": session.manifest.name, "report": session.report})
        if session.exited is not None:
            self._announce_exit(session)
        elif session.kill_reason in ("client_gone", "shutdown"):
            self._terminate(session, session.kill_reason)

    def _replace_tampered(self, session: Session, launch: Launch, stdio: list[int]) -> None:
        """A pooled child whose limits were changed while it waited (it
        said so and exits): the request goes to a fresh child, the client
        none the wiser."""
        log(f"{session.manifest.name}: pooled child {session.pid} had its resource limits changed while it "
            "waited: discarded, a fresh child serves the request")
        if session.exited is None:
            self.zygote.retired.add(session.pid)  # reaped as ours, not as an orphan
        self._forget(session)
        conn = session.conn
        if conn is None or conn.session is not session:
            protocol.close_all(stdio)  # the client went meanwhile
            return
        conn.session = None
        try:
            self._fresh(conn, session.manifest, launch, stdio)
        except protocol.ProtocolError as e:
            self.stats["refused"] += 1
            self._send(conn, {"event": "error", "code": e.code, "error": str(e), "op": "spawn"})

    def _record(self, pid: int) -> str | None:
        directory = self._sessions_dir()
        if directory is None:
            return None
        try:
            path = os.path.join(directory, f"{pid}.{peers.stat_fields(pid)[19]}")
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
            return path
        except (OSError, IndexError):
            return None

    # ---- ending ---------------------------------------------------------

    def _terminate(self, session: Session, reason: str) -> None:
        """TERM the child's process group, KILL it after the grace period."""
        if session.exited is not None:
            return
        session.kill_reason = session.kill_reason if session.kill_reason == "spawn_failed" else reason
        if session.errpipe >= 0:
            return  # not exec'd yet: _on_errpipe terminates it once it is
        _killpg(session.pid, signal.SIGTERM)  # its leader is not reaped: the group is still its own
        if session.kill_timer is None:
            session.kill_timer = self._at(self.limits.grace, lambda: self._kill_group(session, signal.SIGKILL))

    def _kill_group(self, session: Session, sig: int) -> bool:
        """Signal what is left of session's process group; whether any was.
        Its leader unreaped, the pgid is still its own; once reaped, the
        number may be another process's: the session's members are found
        in /proc, each pinned with a pidfd and checked again (see _leftovers)."""
        if session.exited is None:
            return _killpg(session.pid, sig)
        if not _killpg(session.pid, 0) and not session.leftovers:
            return False  # nobody in the group: the common case costs one system call
        return bool(_signal_leftovers(session.pid, sig, self.pid, self._other_owner(session)))

    def _other_owner(self, session: Session) -> Callable[[int], bool]:
        """Whether a pid now leads something else of ours: another session, a
        pooled child, the zygote (helpers live in its session)."""
        def owned(pid: int) -> bool:
            other = self.sessions.get(pid)
            return (other is not None and other is not session) or self.zygote.owns(pid)
        return owned

    def _reap(self) -> None:
        for pid, status, rusage in reap.reap_all():
            session = self.sessions.get(pid)
            if session is None:
                self._reaped_other(pid, status)
                continue
            session.exited = reap.describe(status, rusage)
            # What is left of its session goes with it: TERM now, KILL after
            # the grace period; meanwhile its gid stays taken.
            if self._kill_group(session, signal.SIGTERM):
                session.leftovers = True
                self._at(self.limits.grace, lambda s=session: self._kill_leftovers(s))
            if session.errpipe >= 0:
                continue  # _on_errpipe reports it, in order
            if session.spawned:
                self._announce_exit(session)
            else:
                self._forget(session)

    def _kill_leftovers(self, session: Session) -> None:
        self._kill_group(session, signal.SIGKILL)
        session.leftovers = False
        if self.sessions.get(session.pid) is not session:  # forgotten meanwhile: the gid was kept for this
            self._release_gid(session.gid)
            session.gid = None

    def _reaped_other(self, pid: int, status: int) -> None:
        if self.zygote.ended(pid):
            if not self.stopping:
                log(f"the zygote (pid {pid}) ended with status {os.waitstatus_to_exitcode(status)}; "
                    "another starts at the next spawn")
        elif not self.zygote.reaped(pid):
            self.stats["reaped_orphans"] += 1

    def _announce_exit(self, session: Session) -> None:
        exited = session.exited
        reason = session.kill_reason or ("exited" if exited["code"] is not None else "signalled")
        self.stats["exited"] += 1
        self._send(session.conn, {"event": "exited", "pid": session.pid, "reason": reason, **exited})
        if session.conn is not None and session.conn.session is session:
            self._deadline(session.conn, self.limits.linger)  # closed then, unless it asks for something
        self._forget(session)

    def _forget(self, session: Session) -> None:
        if session.kill_timer is not None:
            session.kill_timer[0] = True
        if self.sessions.get(session.pid) is session:  # not a newer child with the same pid
            del self.sessions[session.pid]
        if session.retry is not None:
            protocol.close_all(session.retry[1])
            session.retry = None
        if not session.leftovers:  # else at their KILL
            self._release_gid(session.gid)
            session.gid = None
        if session.record:
            try:
                os.unlink(session.record)
            except FileNotFoundError:
                pass


def _dynamic_users(loaded: dict[str, Manifest]) -> dict[int, str]:
    return {m.uid: ids.user_name(m.name) for m in loaded.values() if m.dynamic and m.uid is not None}


def _socket_directory(directory: str, open_to_others: bool) -> None:
    """Made (0700, or 0711 when other uids may connect) if missing; an
    existing one is used as it is, never chmodded (it may be shared: /tmp),
    unless it is unsafe: then the supervisor does not start."""
    parent = os.path.dirname(directory)
    if parent:
        os.makedirs(parent, mode=0o755, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(directory, 0o711 if open_to_others else 0o700)
        return
    st = os.lstat(directory)
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        why = "is not a directory"
    elif st.st_uid not in (0, os.geteuid()):
        why = f"belongs to uid {st.st_uid}"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        why = f"is writable by others without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o})"
    if why:
        raise SystemExit(f"landlock-supervisor: the socket's directory {directory} {why}: not using it "
                         "(clients could be sent to another socket); give --socket a path in a directory "
                         "of root's or the supervisor's own")


def _own_limits() -> tuple[tuple[int, int], ...]:
    return tuple(resource.getrlimit(res) for res in RLIMITS)


def _guarded(callback: Callable[..., None], *args: Any) -> None:
    """A bug in one handler must not take the supervisor, and every child, down."""
    try:
        callback(*args)
    except Exception as e:
        log(f"internal error: {type(e).__name__}: {e}")


def _check_stdio(index: int, fd: int, m: Manifest) -> None:
    names = ("stdin", "stdout", "stderr")
    try:
        st = os.fstat(fd)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError as e:
        raise protocol.ProtocolError(f"{names[index]}: unusable fd: {e.strerror}", "bad_fds") from None
    if flags & os.O_PATH or stat.S_ISDIR(st.st_mode):
        raise protocol.ProtocolError(f"{names[index]}: a directory or O_PATH fd is no stdio", "bad_fds")
    # The child leads a session without a terminal: it could make this one
    # its controlling terminal (TIOCSCTTY) and type into it (TIOCSTI).
    if stat.S_ISCHR(st.st_mode) and not m.terminal and os.isatty(fd):
        raise protocol.ProtocolError(f"{names[index]}: a terminal, and manifest {m.name!r} does not take one "
                                     "(terminal: true); pass pipes (`landlock-supervisor run` relays a "
                                     "terminal through pipes)", "bad_fds")


def _killpg(pgid: int, sig: int) -> bool:
    """Whether the group had a process to signal."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _session_members(sid: int, stats: "Iterable[tuple[int, list[str]]]") -> list[int]:
    """The pids, among (pid, /proc/PID/stat fields) pairs, of session sid."""
    out = []
    for pid, fields in stats:
        try:
            if int(fields[3]) == sid:
                out.append(pid)
        except (ValueError, IndexError):
            pass
    return out


def _proc_stats() -> "Iterator[tuple[int, list[str]]]":
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                yield int(name), peers.stat_fields(int(name))
            except OSError:
                pass


def _leftovers(sid: int, supervisor: int, owned: Callable[[int], bool],
               stats: "Iterable[tuple[int, list[str]]]", pidfd_open: Callable[[int], int] = os.pidfd_open,
               fields_of: Callable[[int], list[str]] = peers.stat_fields,
               descends: Callable[[int, int], bool] = peers.descends_from) -> list[int]:
    """pidfds of the processes still in session sid, a reaped child's. A
    session id (like a pgid) is not reused while a process has it, but the
    number is free again once the last one is gone: a process now leading
    sid is another's session (nothing of ours is left), and a member must
    still be in sid once pinned, and descend from us (as subreaper, the
    leftovers of our children are ours)."""
    if owned(sid):
        return []
    try:
        fields_of(sid)
        return []   # pid sid is alive: the number was reused, so the session it named is empty
    except OSError:
        pass
    fds = []
    for pid in _session_members(sid, stats):
        try:
            fd = pidfd_open(pid)
        except OSError:
            continue
        try:
            if int(fields_of(pid)[3]) == sid and descends(pid, supervisor):
                fds.append(fd)
                continue
        except (OSError, ValueError, IndexError):
            pass
        os.close(fd)
    return fds


def _signal_leftovers(sid: int, sig: int, supervisor: int, owned: Callable[[int], bool]) -> int:
    """Signal, by pidfd, what _leftovers finds; how many were signalled."""
    count = 0
    for fd in _leftovers(sid, supervisor, owned, _proc_stats()):
        try:
            signal.pidfd_send_signal(fd, sig)  # gone meanwhile: ESRCH; its pid never anyone else's
            count += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return count


def _children_of(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if int(peers.stat_fields(int(name))[1]) == pid:
                    out.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _kill_session(sid: int, start: str) -> int:
    """KILL every process of session sid, unless pid sid is a newer process."""
    try:
        if peers.stat_fields(sid)[19] != start:
            return 0
    except (OSError, IndexError):
        pass  # the leader is gone; its session id cannot be reused while members live
    killed = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if int(peers.stat_fields(int(name))[3]) == sid:
                    os.kill(int(name), signal.SIGKILL)
                    killed += 1
            except (OSError, ValueError, IndexError):
                pass
    return killed


def _fd_count() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None  # out of fds: listing them takes one


def _rss_kib() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return 0


def _keep_stdio_open() -> None:
    """Fds 0-2 always open, so a received fd never lands on them."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open("/dev/null", os.O_RDWR)
            if null != fd:
                os.dup2(null, fd, inheritable=False)
                os.close(null)
