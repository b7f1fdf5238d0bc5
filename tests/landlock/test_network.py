"""TCP port rules (ABI 4), UDP port rules (ABI 10) and the IPC scopes (ABI 6):
abstract Unix sockets and signals, towards endpoints made outside the domain."""
from __future__ import annotations

import errno
import os
import signal
import socket
from collections.abc import Iterator

import pytest

from landlock import Spec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connect_tcp(port: int) -> None:
    with socket.socket() as s:
        s.connect(("127.0.0.1", port))


def _bind_tcp(port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


@pytest.mark.enforcement
@pytest.mark.parametrize("listed", [True, False], ids=["listed", "unlisted"])
def test_tcp_connect(confined_errno, identity, tcp_listener, listed, abi):
    other = tcp_listener + 1 if tcp_listener < 65535 else 1024
    spec = Spec(connect_tcp=(tcp_listener if listed else other,), **identity.spec, max_abi=abi)
    got = confined_errno(spec, lambda: _connect_tcp(tcp_listener))
    assert got == (0 if listed or abi < 4 else errno.EACCES)


@pytest.mark.enforcement
@pytest.mark.parametrize("listed", [True, False], ids=["listed", "unlisted"])
def test_tcp_bind(confined_errno, identity, tcp_listener, listed, abi):
    port = _free_port()
    spec = Spec(bind_tcp=(port if listed else tcp_listener,), **identity.spec, max_abi=abi)
    got = confined_errno(spec, lambda: _bind_tcp(port))
    assert got == (0 if listed or abi < 4 else errno.EACCES)


def _send_udp(port: int) -> None:
    """A UDP client as a resolver is one: an unbound socket, sendto (the kernel binds it to an ephemeral port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"ping", ("127.0.0.1", port))


def _connect_udp(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("127.0.0.1", port))
        s.send(b"ping")


def _bind_udp(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", port))


@pytest.fixture
def udp_receiver() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.mark.enforcement
@pytest.mark.parametrize("send", [_send_udp, _connect_udp], ids=["sendto", "connect"])
@pytest.mark.parametrize("listed", [True, False], ids=["listed", "unlisted"])
def test_udp_send(confined_errno, identity, udp_receiver, send, listed, abi):
    """ABI 10: a listed port is reached from an unbound socket (the kernel's implicit bind is allowed with
    it), an unlisted one is EACCES; before 10, UDP is not restricted."""
    other = udp_receiver + 1 if udp_receiver < 65535 else 1024
    spec = Spec(connect_udp=(udp_receiver if listed else other,), **identity.spec, max_abi=abi)
    got = confined_errno(spec, lambda: send(udp_receiver))
    assert got == (0 if listed or abi < 10 else errno.EACCES)


@pytest.mark.enforcement
@pytest.mark.parametrize("listed", [True, False], ids=["listed", "unlisted"])
def test_udp_bind(confined_errno, identity, udp_receiver, listed, abi):
    """ABI 10: bind() to a chosen port needs it listed in bind_udp; connect_udp's implicit port 0 grants
    no chosen port."""
    port = _free_port()
    spec = Spec(bind_udp=(port,) if listed else (), connect_udp=(udp_receiver,), **identity.spec, max_abi=abi)
    got = confined_errno(spec, lambda: _bind_udp(port))
    assert got == (0 if listed or abi < 10 else errno.EACCES)


@pytest.fixture
def abstract_listener() -> Iterator[str]:
    """An abstract Unix socket listening outside the domain."""
    name = f"\0landlock-test-{os.getpid()}-{os.urandom(4).hex()}"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(name)
        s.listen()
        yield name


def _connect_abstract(name: str) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(name)


@pytest.mark.enforcement
@pytest.mark.parametrize("scoped", [True, False], ids=["scoped", "unscoped"])
def test_abstract_unix_socket_scope(confined_errno, identity, abstract_listener, scoped, abi):
    scopes = ("abstract_unix_socket",) if scoped else ()
    spec = Spec(scopes=scopes, **identity.spec, max_abi=abi)
    got = confined_errno(spec, lambda: _connect_abstract(abstract_listener))
    assert got == (errno.EPERM if scoped and abi >= 6 else 0)


@pytest.fixture
def victim(identity) -> Iterator[int]:
    """A process outside the domain, of the uid the confined child will have
    (so that only the scope, not DAC, can refuse a signal)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setresuid(identity.uid, identity.uid, identity.uid)
            os.write(w, b"r")
            while True:
                signal.pause()
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"r"
        yield pid
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@pytest.mark.enforcement
@pytest.mark.parametrize("scoped", [True, False], ids=["scoped", "unscoped"])
def test_signal_scope(confined_errno, identity, victim, scoped, abi):
    scopes = ("signal",) if scoped else ()
    spec = Spec(scopes=scopes, **identity.spec, max_abi=abi)
    assert confined_errno(spec, lambda: os.kill(victim, 0)) == (errno.EPERM if scoped and abi >= 6 else 0)


@pytest.mark.enforcement
def test_signal_inside_the_domain_is_allowed(confined_errno):
    assert confined_errno(Spec(), lambda: os.kill(os.getpid(), 0)) == 0
