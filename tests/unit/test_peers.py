"""peers: the kernel's word on a client, and the key that names its process for good."""
import fcntl
import os
import socket
import subprocess

from supervisor.daemon import peers


def _peer_of():
    """A connection's peer as the supervisor sees it (here: this process)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        return peers.credentials(a)
    finally:
        a.close()
        b.close()


def test_the_peers_pidfd_is_close_on_exec():
    """credentials() sets nothing itself: the kernel makes every pidfd close-on-exec."""
    peer = _peer_of()
    try:
        assert peer.pid == os.getpid()
        assert peer.pidfd >= 0, "SO_PEERPIDFD (Linux >= 6.5) gives none"
        assert fcntl.fcntl(peer.pidfd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        peer.close()


def test_one_process_one_key_across_connections_and_another_process_another():
    first, second = _peer_of(), _peer_of()
    child = subprocess.Popen(["sleep", "10"])
    other = peers.Peer(child.pid, 0, 0, os.pidfd_open(child.pid))
    try:
        assert peers._pidfs_unique(), "Linux >= 6.9 numbers pidfds uniquely (pidfs)"
        assert peers.process_key(first) == peers.process_key(second)
        assert peers.process_key(first) != peers.process_key(other)
    finally:
        for p in (first, second, other):
            p.close()
        child.kill()
        child.wait()


def test_without_a_pidfd_the_key_is_pid_and_start_time():
    me = peers.Peer(os.getpid(), 0, 0)
    assert peers.process_key(me) == (os.getpid(), int(peers.stat_fields(os.getpid())[19]))
