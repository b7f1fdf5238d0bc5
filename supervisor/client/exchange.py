"""The client's logic without its waiting: requests, replies -> child state or exception.

Each exchange with the supervisor is a generator that sends, reads what has
come and, when nothing has, yields a `Wait`: the socket to wait on. The
transports only wait: client.py with select() and a deadline, aio.py in the
event loop. Whatever the waiting raises (a timeout, a cancellation, ^C) is
thrown back into the generator, so cleanups (a failed spawn closes its
socket) are written once, here. Imports nothing of the server, nor yaml,
prctl or ctypes: a proxy only needs the wire.
"""
from __future__ import annotations

import _socket
import collections
import functools
import signal as signals
from collections.abc import Generator, Iterator, Mapping, Sequence

from .. import protocol
from ..errors import Code, SupervisorError

# typing is ~3 ms of every `run` and its names here are mypy's alone:
# TYPE_CHECKING is typing's own name without importing it (mypy takes the
# name), and Run's generic base is no base at run time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from io import FileIO
    from typing import Any, Generic, TypeVar

    from landlock.report import Report

    T = TypeVar("T")
    Exchange = Generator["Wait", None, T]
else:
    T = None

    class Generic:
        def __class_getitem__(cls, item: object) -> type:
            return object

CLOSED = "the supervisor closed the connection"
NO_ANSWER = "no answer from the supervisor in time"
REFUSAL_WAIT = 1.0   # seconds to read a refused peer's refusal
DENIED_KEPT = 1000   # `denied` events a child keeps for its owner to take
# How long to wait for `settled` after `exited`: the supervisor's own wait
# for the kernel's count is at most 2.25 s (supervisor/daemon/audit.py, SETTLE_*).
SETTLE_BOUND = 3.0


# The errors a client tells apart, each an errors.SupervisorError with its
# Code (docs/protocol.md); any other code is a plain SupervisorError.
class NoSuchManifest(SupervisorError): pass
class RefusedPeer(SupervisorError): pass
class ConfinementUnavailable(SupervisorError): pass


class SpawnFailed(SupervisorError):
    """The child could not confine itself or exec; errno and stage say where."""

    @property
    def errno(self) -> int:
        return int(self.reply.get("errno", 0))

    @property
    def stage(self) -> str:
        return str(self.reply.get("stage", ""))


_CODES = {code.value: code for code in Code}
_ERRORS: dict[Code, type[SupervisorError]] = {
    Code.NO_SUCH_MANIFEST: NoSuchManifest, Code.REFUSED_PEER: RefusedPeer,
    Code.CONFINEMENT_UNAVAILABLE: ConfinementUnavailable, Code.SPAWN_FAILED: SpawnFailed}


def error_from(reply: Mapping[str, Any]) -> SupervisorError:
    """The exception an `error` event stands for. A code this client does not
    know (or none) is INTERNAL: the supervisor's doing, never the asker's
    usage error; the reply keeps the word."""
    code = _CODES.get(str(reply.get("code")), Code.INTERNAL)
    return _ERRORS.get(code, SupervisorError)(str(reply.get("error", "unknown error")), code, reply)


def shell_status(exited: Mapping[str, Any]) -> int:
    """The status a shell would give: the code, or 128 + the signal."""
    return int(exited["code"]) if exited.get("code") is not None else 128 + int(exited.get("signal") or 0)


def spawn_request(name: str, args: Sequence[str], env: Mapping[str, str] | None,
                  narrow: Mapping[str, Any] | None, cwd: str | None = None,
                  stdio: str | None = None) -> dict[str, Any]:
    """cwd: the client's working directory, against which the supervisor
    makes `.`, `./...` and `../...` among args absolute. stdio "pipes": the
    supervisor sends the child's pipes with `spawned` (a warm server's, or
    a fresh child's) instead of taking the client's fds."""
    if stdio not in (None, "pipes"):
        raise ValueError(f"stdio: expected \"pipes\" or None, got {stdio!r}")
    request: dict[str, Any] = {"op": "spawn", "manifest": name, "args": list(args)}
    if stdio:
        request["stdio"] = stdio
    if env:
        request["env"] = dict(env)
    if narrow:
        request["narrow"] = dict(narrow)
    if cwd is not None:
        request["cwd"] = cwd
    return request


def signal_request(sig: int, group: bool) -> dict[str, Any]:
    return {"op": "signal", "signal": int(sig), "group": group}


class Wait:
    """Wake the exchange when `sock` is readable; `within` seconds, if given,
    replaces the transport's deadline."""
    __slots__ = ("sock", "within")

    def __init__(self, sock: _socket.socket, within: float | None = None) -> None:
        self.sock, self.within = sock, within


class Run(Generic[T]):
    """An exchange as a transport drives it:

        run = Run(exchange)
        for wait in run:           # until the exchange returns or raises
            try:
                ...wait for wait.sock...
            except BaseException as e:
                run.thrown = e     # the exchange sees it where it waits
        return run.result
    """

    def __init__(self, exchange: Exchange[T]) -> None:
        self._exchange = exchange
        self.thrown: BaseException | None = None

    def __iter__(self) -> Iterator[Wait]:
        try:
            wait = next(self._exchange)
            while True:
                yield wait
                thrown, self.thrown = self.thrown, None
                wait = self._exchange.throw(thrown) if thrown is not None else next(self._exchange)
        except StopIteration as done:
            self.result: T = done.value


def receive(sock: _socket.socket, within: float | None = None) -> Exchange[dict[str, Any]]:
    """The next message (any fds that came with it closed)."""
    message, fds = yield from receive_fds(sock, within)
    protocol.close_all(fds)
    return message


def receive_fds(sock: _socket.socket, within: float | None = None) -> Exchange[tuple[dict[str, Any], list[int]]]:
    """The next message and the fds that came with it (the caller's to close)."""
    reset = False
    while True:
        yield Wait(sock, within)
        try:
            message, fds = protocol.recv(sock)
        except BlockingIOError:
            continue
        except protocol.ProtocolError as e:
            # A reply that breaks the protocol is the supervisor's doing (or
            # not a supervisor's): never the asker's usage error.
            raise protocol.ProtocolError(f"a malformed reply: {e}", Code.INTERNAL) from None
        except ConnectionResetError:
            # Closed with our request unread: the error comes once, then
            # what the supervisor sent before closing (a refusal) is read.
            if reset:
                raise
            reset = True
            continue
        if message is None:
            raise ConnectionError(CLOSED)
        return message, fds


def send_first(sock: _socket.socket, request: dict[str, Any], fds: Sequence[int] = ()) -> Exchange[None]:
    """A connection's first request. A refused peer finds the connection
    closed under it (EPIPE) with the refusal waiting to be read: raise that."""
    try:
        protocol.send(sock, request, fds)
        return
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        reply = yield from receive(sock, REFUSAL_WAIT)
    except (OSError, TimeoutError, protocol.ProtocolError):
        raise ConnectionError(CLOSED) from None
    raise error_from(reply) from None


def spawn(sock: _socket.socket, request: dict[str, Any], stdio: Sequence[int]
          ) -> Exchange[tuple[dict[str, Any], list[int]]]:
    """The `spawned` reply, and the child's pipes when the request asked for
    them (stdin's write end, stdout's and stderr's read ends); on any
    failure the socket is closed."""
    fds: list[int] = []
    try:
        yield from send_first(sock, request, stdio)
        reply, fds = yield from receive_fds(sock)
        if reply.get("event") != "spawned":
            raise error_from(reply)
        if len(fds) != (3 if request.get("stdio") == "pipes" else 0):
            raise protocol.ProtocolError(f"a malformed reply: `spawned` came with {len(fds)} fds", Code.INTERNAL)
        # What ChildState reads without a default: checked here, where the pipes are still closed on failure.
        for key, kind in (("pid", int), ("pgid", int), ("report", dict)):
            if not isinstance(reply.get(key), kind):
                raise protocol.ProtocolError(f"a malformed reply: `spawned` without a {key}", Code.INTERNAL)
    except BaseException:
        protocol.close_all(fds)
        sock.close()
        raise
    return reply, fds


def short(sock: _socket.socket, op: str, **fields: Any) -> Exchange[dict[str, Any]]:
    """A one-request connection (ping, list, stats, describe): its reply."""
    try:
        yield from send_first(sock, {"op": op, **fields})
        reply = yield from receive(sock)
    finally:
        sock.close()
    if reply.get("event") == "error":
        raise error_from(reply)
    return reply


class ChildState:
    """What the supervisor told about a child, and the exchanges on its
    connection: shared by the sync and asyncio clients."""

    def __init__(self, sock: _socket.socket, spawned: Mapping[str, Any], pipes: Sequence[int] = ()) -> None:
        self._sock = sock
        # With stdio="pipes": the child's stdin, stdout and stderr, as
        # subprocess.Popen has them (unbuffered binary files); else None.
        self.stdin: FileIO | None = open(pipes[0], "wb", buffering=0) if pipes else None
        self.stdout: FileIO | None = open(pipes[1], "rb", buffering=0) if pipes else None
        self.stderr: FileIO | None = open(pipes[2], "rb", buffering=0) if pipes else None
        # Whether a warm server (started ahead) serves it, and if not why.
        self.warm: bool = bool(spawned.get("warm"))
        self.not_warm: str | None = spawned.get("why")
        self.pid: int = spawned["pid"]
        self.pgid: int = spawned["pgid"]
        self.manifest: str = spawned.get("manifest", "")
        self._report: Mapping[str, Any] = spawned["report"]
        self.exited: dict[str, Any] | None = None   # the `exited` event, once known
        self.settled: dict[str, Any] | None = None  # the `settled` event that may follow it
        # What the supervisor says of it: the `denied` events not taken yet
        # (the oldest dropped past DENIED_KEPT), and whether they are seen.
        self.denied: collections.deque[dict[str, Any]] = collections.deque(maxlen=DENIED_KEPT)
        self.denials: Mapping[str, Any] = spawned.get("denials") or {"mode": "off"}

    @functools.cached_property
    def report(self) -> Report:
        """What the kernel enforces on the child (built when first asked for:
        a proxy spawning in a loop may never look)."""
        from landlock.report import Report
        return Report.from_dict(dict(self._report))

    @property
    def returncode(self) -> int | None:
        """As subprocess has it: the exit code, or -N for signal N."""
        if self.exited is None:
            return None
        return self.exited["code"] if self.exited["code"] is not None else -self.exited["signal"]

    @property
    def settling(self) -> bool:
        """Exited, with the kernel's count of its denials still to come in
        a `settled` event (a supervisor older than that event never says so)."""
        return (self.exited is not None and self.settled is None
                and (self.exited.get("denials") or {}).get("final") is False)

    @property
    def denial_counts(self) -> dict[str, Any] | None:
        """What was denied in all (received, shown, suppressed, hidden,
        kernel): from `settled` once it came, else from `exited`; None
        while running or where denials are not seen."""
        for event in (self.settled, self.exited):
            if event is not None and event.get("denials") is not None:
                return dict(event["denials"])
        return None

    def fileno(self) -> int:
        """Readable when the supervisor has news (e.g. the exit): for selectors."""
        return self._sock.fileno()

    def close(self) -> None:
        """The connection and any pipes the child came with."""
        for pipe in (self.stdin, self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()
        self._sock.close()

    def _next(self) -> Exchange[dict[str, Any]]:
        message = yield from receive(self._sock)
        if message.get("event") == "exited":
            self.exited = message
        elif message.get("event") == "settled":
            self.settled = message
        elif message.get("event") == "denied":
            self.denied.append(message)
        return message

    def _request(self, request: dict[str, Any], expect: str) -> Exchange[dict[str, Any]]:
        protocol.send(self._sock, request)
        while True:
            reply = yield from self._next()
            if reply.get("event") == expect:
                return reply
            if reply.get("event") == "error":
                raise error_from(reply)

    def _exit(self) -> Exchange[int]:
        """The child's returncode, once it has exited."""
        while self.exited is None:
            yield from self._next()
        code = self.returncode
        assert code is not None
        return code

    def _settle(self) -> Exchange[dict[str, Any] | None]:
        """The final counts, once `settled` came (at once when none is to
        come); `denied` events that come meanwhile are kept as ever."""
        yield from self._exit()
        while self.settling:
            yield from self._next()
        return self.denial_counts

    def _signal(self, sig: int, group: bool) -> Exchange[None]:
        if self.exited is not None:
            return
        try:
            yield from self._request(signal_request(sig, group), "signalled")
        except SupervisorError as e:
            if e.code != Code.EXITED:
                raise

    def _leave(self) -> Exchange[None]:
        """Leaving a `with` block: a child still running is killed, its exit
        awaited (any failure of that ignored), the connection closed."""
        try:
            if self.exited is None:
                yield from self._signal(signals.SIGKILL, True)
                yield from self._exit()
        except (OSError, SupervisorError, TimeoutError):
            pass
        finally:
            self.close()
