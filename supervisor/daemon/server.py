"""The fork-server: wires loop, connections, policy, confinements, zygote, children and their endings, warm servers and the other operations; spawn; reload and shutdown.

One thread, one selectors loop, for its whole life. A spawn goes one way:
connections -> handler -> policy.admit/check_stdio/charge/plan -> confinements -> zygote
(zygote.process.ZygoteProcess) -> children -> events back through connections.
"""
from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass, field

from . import audit, leases, listener, namespaces, peers, policy, served, survivors, warm
from ..manifests import ids
from .children import Children
from .confinements import Confinements
from .connections import Connections
from .early import keep_stdio_open, prepare
from .endings import Endings
from ..errors import Code, Refused
from .limits import Limits, OwnLimits
from .log import log
from .loop import Loop, Periodic, Timer
from ..manifests.manifest import Manifest, ManifestError
from .operations import Operations
from ..client.paths import default_socket_path
from .session import Connection
from .survivors import Records
from ..zygote.boot import Booting
from ..zygote.pools import Gids
from ..zygote.process import Launch, ZygoteProcess

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

    from .connections import Handler

__all__ = ["Config", "Limits", "Supervisor"]

CAUGHT_SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
POOL_IDLE = 300.0


@dataclass
class Config:
    """A supervisor's start-up options (serve's command line, or a private supervisor's)."""
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
    session_gids: tuple[int, int] | None = None   # a root supervisor's per-session gids (leased: serve.main)
    only: str | None = None         # private mode for one server: load that manifest alone
    dynamic_uids_of: str | None = None   # the state root whose dynamic uids its manifests take (None: its own)
    pool_idle: float | None = None  # seconds without a spawn before a `pool: auto` pool is drained;
                                    # None: $LANDLOCK_SUPERVISOR_POOL_IDLE, else POOL_IDLE
    audit: str | None = None        # serve --audit off|count|detail; None: count where audit is on
    audit_nested: bool = False      # the servers' own Landlock domains log their denials too


def socket_writers(directory: str, loaded: dict[str, Manifest]) -> list[str]:
    """A warning for each manifest whose write grants hold the socket's
    directory: under a user's supervisor its server (the same uid) could
    replace the socket and be sent later clients' requests, their
    client_env and fds (a learned manifest's /tmp grant holds the fallback)."""
    real = os.path.realpath(directory)
    out = []
    for name, manifest in sorted(loaded.items()):
        for path in (*manifest.spec.read_write, *manifest.spec.read_write_noexec):
            if real == os.path.realpath(path) or real.startswith(os.path.realpath(path).rstrip("/") + "/"):
                out.append(f"warning: {name}: its grant of {path} holds the socket's directory {directory}: its "
                           "server can replace the socket and be sent later clients' requests; give serve "
                           "--socket a path outside its grants")
                break
    return out


class Supervisor:
    def __init__(self, config: Config, early: tuple[namespaces.Isolation | None, Booting] | None = None) -> None:
        """early: prepare()'s isolation and a zygote spawned after it, not
        waited for (a private supervisor's, see cli._serve)."""
        keep_stdio_open()
        self.config = config
        self.limits = config.limits
        self.pid = os.getpid()
        self.loop = Loop()
        self.own = OwnLimits(log)
        self.stats = {"spawned": 0, "refused": 0, "failed": 0, "exited": 0, "reaped_orphans": 0}
        self.stopping = False
        self.owned_socket_path: str | None = None   # bound here: removed at the end
        self.socket_lock: int | None = None          # its lock file's fd, closed once it is removed
        self.isolation: namespaces.Isolation | None = early[0] if early else None
        self.booting: Booting | None = early[1] if early else None
        # (Private: no inotify instance of its user's; see Confinements.)
        self.confinements = Confinements(None if config.control_fd is not None
                                         else lambda arm: self.loop.at(0.0, arm))
        self.gids = Gids(*config.session_gids, leases.held) if config.session_gids else None
        # Warm servers where each has a session gid of its own (a root
        # supervisor) and one serves more than one `run`'s client (not a
        # private supervisor: its one spawn comes before any could start).
        self.keeps_warm = self.gids is not None and config.control_fd is None
        pool_idle = config.pool_idle
        if pool_idle is None:
            pool_idle = float(os.environ.get("LANDLOCK_SUPERVISOR_POOL_IDLE", POOL_IDLE))
        self.zygote = ZygoteProcess(self.loop.selector, log, self.gids, self.own.nofile_start, pool_idle)
        self.pool_timer: Timer | None = None   # while a `pool: auto` pool is kept: its idle check
        # Every second while a connection has a deadline or a child runs.
        tick = Periodic(self.loop, 1.0, self._tick)
        self.connections = Connections(self.loop, self.limits, self.own, config.allow_uids, config.allow_gids,
                                       self.stats, tick, self._dispatch, self._closed)
        self.visibility = audit.Visibility(self.loop, config.audit, config.audit_nested,
                                           config.control_fd is not None, self.connections.offer)
        self.confinements.canary = self.visibility.canary
        private = config.control_fd is not None or not config.state_root
        records = Records(None if private else os.path.join(config.state_root or "", "sessions"))
        self.endings = Endings(self.loop, self.zygote, self.gids, self.connections, self.limits, self.stats,
                               records, self.visibility.denials)
        self.children = Children(self.loop, self.zygote, self.gids, self.connections, self.limits, self.stats,
                                 tick, self.endings, self.visibility.report)
        # Drained as `pool: auto` pools are, after the same idle time.
        self.warm = warm.WarmServers(self.loop, self.children, self.endings, self.limits, self._warm_launch,
                                     self._current, lambda: self.zygote.pid, pool_idle)
        operations = Operations(self.connections, self.children, self.zygote, self.warm, self.visibility, self.stats,
                                lambda: (self.manifests, self.withdrawn))
        self.handlers: dict[str, Handler] = {"spawn": self._spawn, **operations.handlers()}
        try:
            self.manifests, self.withdrawn = self._load_manifests()
            served.starting(self.manifests, self.withdrawn)
        except BaseException:
            self.visibility.close()
            raise
        self._protect()

    # ---- start-up, reload, shutdown ------------------------------------

    def _load_manifests(self) -> tuple[dict[str, Manifest], dict[str, str]]:
        """The manifests served, and why each other one is not (served.load)."""
        loaded, withdrawn = served.load(self.config, self.visibility.logged)
        if self.isolation is not None:
            self.isolation.users(served.dynamic_users(loaded))
        return loaded, withdrawn

    def _protect(self) -> None:
        """What the denial lines never propose (served.protected)."""
        if self.visibility.denials is not None:
            self.visibility.denials.known = served.protected(self.manifests.values(), self.config.state_root,
                                                             self.config.socket_path)

    def serve(self) -> int:
        if self.booting is None:
            self.isolation = prepare(self.config.state_root)
            if self.isolation is not None:
                self.isolation.users(served.dynamic_users(self.manifests))
        booting, self.booting = self.booting, None
        try:
            self.zygote.start(booting)  # after prepare(): it inherits what that did
        except OSError as e:
            raise SystemExit(f"landlock-supervisor: cannot start the zygote: {e}") from None
        try:
            self._open()
        except OSError as e:   # the state root, the socket's directory: one line, what and where
            self.zygote.close()
            self.visibility.close()
            where = f"{e.filename}: " if e.filename else ""
            raise SystemExit(f"landlock-supervisor: not starting: {where}{e.strerror or e}") from None
        self._keep_warm()
        self.loop.run(lambda: self.stopping and not self.children.sessions)
        self._finish()
        return 0

    def _open(self) -> None:
        """The sessions a previous supervisor left, then the way in."""
        self.children.records.end_survivors(log)
        self.loop.catch(CAUGHT_SIGNALS, self._on_signals)
        if self.config.control_fd is not None:
            control = socket.socket(fileno=self.config.control_fd)
            control.set_inheritable(False)
            control.setblocking(False)
            self.connections.add(control, peers.credentials(control), control=True)
        else:
            self._listen()
            where = self.config.socket_path or "the socket systemd passed"
            log(f"serving {len(self.manifests)} manifest(s) on {where}")

    def _listen(self) -> None:
        if self.config.listen_fd is not None:
            sock = listener.inherited(self.config.listen_fd)
        else:
            path = self.config.socket_path or default_socket_path()
            sock, self.socket_lock = listener.bound(path, bool(self.config.allow_uids or self.config.allow_gids))
            self.config.socket_path = self.owned_socket_path = path
            if os.geteuid() != 0:   # (a root supervisor's servers have uids of their own, or no capability)
                for line in socket_writers(os.path.dirname(path), self.manifests):
                    log(line)
        self.connections.listen(sock)

    def _on_signals(self, received: set[int]) -> None:
        if signal.SIGCHLD in received:
            self.endings.reap(self.stopping)
        if signal.SIGHUP in received:
            self._reload()
        if received & {signal.SIGTERM, signal.SIGINT}:
            self.shutdown("shutdown")

    def _reload(self) -> None:
        """The manifests as their files are now: one that became broken is
        withdrawn (never kept in its old version: a typo while narrowing a
        grant must not keep the wider one live); running sessions go on."""
        try:
            new, withdrawn = self._load_manifests()
        except (ManifestError, OSError) as e:   # no file could be looked at (a private one's, the uid table)
            new, withdrawn = {}, {name: f"reload failed: {e}" for name in self.manifests}
        for name, why in withdrawn.items():
            log(f"{why}: " + ("withdrawn" if name in self.manifests else "not served"))
        self.manifests, self.withdrawn = new, withdrawn
        self._protect()
        self.zygote.drain()
        self.confinements.clear()
        self._keep_warm()
        log(f"reloaded {len(new)} manifest(s)" + (f", {len(withdrawn)} not served" if withdrawn else ""))

    def shutdown(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.warm.stop()
        self.zygote.close()  # the pooled children exit with it
        self.connections.stop_listening()
        self._remove_socket_path()
        self.endings.terminate_all(reason)

    def _remove_socket_path(self) -> None:
        if self.owned_socket_path:
            listener.remove(self.owned_socket_path)
            self.owned_socket_path = None
        if self.socket_lock is not None:
            os.close(self.socket_lock)
            self.socket_lock = None

    def _finish(self) -> None:
        survivors.end_descendants(self.pid)
        self.connections.close_all()
        self._remove_socket_path()
        self.visibility.close()

    def _tick(self) -> bool:
        waiting = self.connections.expire_due()
        self.own.check()
        return waiting or bool(self.children.sessions)

    def _closed(self, conn: Connection) -> None:
        self.visibility.unfollow(conn)
        self.endings.client_gone(conn)
        if conn.control:
            self.shutdown("shutdown")

    # ---- the operations --------------------------------------------------

    def _dispatch(self, conn: Connection, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        if conn.control:
            if op != "connect":
                raise Refused(Code.BAD_REQUEST, f"the control channel takes only 'connect', not {op!r}")
            self.connections.adopt(conn, fds)
            return
        if op == "connect":
            raise Refused(Code.BAD_OP, "'connect' is for a private supervisor's control channel only")
        if fds and op != "spawn":
            raise Refused(Code.BAD_FDS, f"{op!r} takes no file descriptors")
        handler = self.handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            raise Refused(Code.BAD_OP, f"unknown operation {op!r}")
        handler(conn, message, fds)

    def _keep_warm(self) -> None:
        if self.keeps_warm:
            self.warm.serve(self.manifests)
            return
        why = "this supervisor gives no session gids" if self.gids is None else "a private supervisor keeps none"
        for m in self.manifests.values():
            if m.warm:
                log(f"{m.source}: warning: warm: {m.warm} not kept: {why}: every spawn is fresh")

    def _warm_launch(self, m: Manifest) -> Launch:
        """A warm server's launch: the manifest's own process, nobody's request."""
        plan = policy.plan(m, {}, self.limits, os.environ)
        return Launch(plan, self.confinements.get(plan.spec, keep=True))

    def _current(self, launch: Launch) -> bool:
        """Whether a fresh spawn of launch's spec now gets launch's confinement
        (its paths the same inodes); raises Refused as a fresh spawn would."""
        return self.confinements.get(launch.plan.spec) is launch.confinement   # (kept: _warm_launch)

    def _spawn(self, conn: Connection, request: dict[str, Any], fds: list[int]) -> None:
        """docs/design.md's spawn, a line a step: policy, then the confinement, then the child."""
        if conn.session is not None:
            raise Refused(Code.ALREADY_SPAWNED, "this connection has spawned already: one connection per child")
        m = policy.admit(request, self.manifests, self.stopping, self.withdrawn)
        pipes = policy.stdio_pipes(request)
        if not pipes:
            policy.check_stdio(fds, m)
        elif fds:
            raise Refused(Code.BAD_FDS, f"'spawn' with stdio \"pipes\" takes no fds, got {len(fds)}")
        self.warm.asked_for(m)
        why = warm.unfit(m, request, pipes)
        # A warm server handed over adds no child: at the limit, one ready may still serve.
        spare = why is None and self.warm.ready(m.name)
        counts = policy.Counts(len(self.children) - spare, self.children.count_of(conn.peer.uid))
        policy.charge(counts, conn.peer, self.limits)
        if why is None:
            # Nothing of the client's in the request: its plan is the warm servers' own, made already.
            server, why = self.warm.take(m)
            if server is not None:
                try:
                    self.children.hand_over(conn, server.session, server.pipes)
                finally:
                    self.warm.handed(server)
                return
            policy.room(len(self.children), self.limits)   # a fresh child instead: it must fit
        plan = policy.plan(m, request, self.limits, os.environ)
        launch = Launch(plan, self.confinements.get(plan.spec))
        self.own.check()   # (a fresh spawn takes fds of ours, a hand-over none)
        client = None
        if pipes:
            fds, client = warm.pipes()
        try:
            self.children.start(conn, m, launch, fds, client, {"warm": False, "why": why})
        finally:
            self._watch_pools()

    def _watch_pools(self) -> None:
        """Once a spawn put an adaptive pool in demand: its idle check, if none is set."""
        if self.pool_timer is None and self.zygote.demand.last:
            self.pool_timer = self.loop.at(self.zygote.demand.idle, self._pools_idle)

    def _pools_idle(self) -> None:
        """Drain the adaptive pools no longer in demand; again when the next may be."""
        due = self.zygote.drain_idle()
        self.pool_timer = None if due is None else self.loop.at(max(due, 0.5), self._pools_idle)
