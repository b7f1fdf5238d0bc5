"""Helpers for the adversarial tests: dedicated uids, the attacker
(probe.py) run as a confined child of a real supervisor, and the tables of
docs/security.md the tests hold the documentation to.

The uids below exist nowhere (no passwd entry, no process): a resource
bomb under one of them counts only its own processes, so the machine that
runs the tests is never fork-bombed, and DAC never mistakes them for the
owner of anything the tests did not give them.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pty
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

import landlock

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent / "supervisor"))
from svhelpers import read_all  # noqa: E402


def _supervisor_conftest() -> ModuleType:
    """tests/supervisor/conftest.py, loaded once under a name of its own
    (pytest imports every conftest.py as `conftest`)."""
    name = "llsv_supervisor_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "supervisor" / "conftest.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


svconf = _supervisor_conftest()
Supervisor = svconf.Supervisor

KERNEL_ABI = landlock.abi_version()
ROOT = os.geteuid() == 0
PROBE = HERE / "probe.py"
PYTHON3 = "/usr/bin/python3"

CHILD_UID = 64100     # the catalogue's unprivileged child
BOMB_UID = 64101      # resource bombs: NPROC counts this uid alone
SUPERVISOR_UID = 64102  # an unprivileged supervisor (fork failure under NPROC)
FOREIGN_UID = 64199   # owns files that neither identity owns
DEDICATED_UIDS = (CHILD_UID, BOMB_UID, SUPERVISOR_UID, FOREIGN_UID)


# ---- the attacker -------------------------------------------------------------------

@dataclass
class Identity:
    name: str        # test id
    manifest: str    # the probe manifest running as it
    uid: int


AS_UID, AS_ROOT = Identity("uid", "probe-uid", CHILD_UID), Identity("root", "probe-root", 0)
IDENTITIES = (AS_UID, AS_ROOT)
BOMB = Identity("bomb", "probe-bomb", BOMB_UID)   # resource bombs: their own uid


@dataclass
class Outcome:
    """What the attacker reported, op by op, and how it ended."""
    results: list[dict[str, Any]]
    exited: dict[str, Any]
    err: str
    report: landlock.Report | None = None

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.results[i]

    def errname(self, i: int) -> str | None:
        r = self.results[i]
        return None if r["ok"] else r["errname"]

    def __repr__(self) -> str:
        return f"Outcome(results={json.dumps(self.results)[:3000]}, exited={self.exited}, err={self.err[-2000:]!r})"


def probe_manifest(lab: Any, name: str, probe: Path | str, *, user: int | None, sandbox: dict[str, Any],
                   **fields: Any) -> Path:
    """A manifest that runs `probe` (a world-readable copy of probe.py in a
    granted directory) with the client's JSON as argv[1]."""
    extra = {"user": user, "group": user} if user is not None else {"allow_root": True}
    return lab.manifest(name, command=PYTHON3, args=["-I", "-B", str(probe)], client_args=True,
                        sandbox=sandbox, **extra, **fields)


def attack(client: Any, manifest: str, ops: Sequence[Sequence[Any]], *, stdin: int | None = None,
           narrow: dict[str, Any] | None = None, timeout: float = 20) -> Outcome:
    """Spawn the attacker, let it run `ops`, collect what it printed and its exit."""
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) if stdin is None else None
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        child = client.spawn(manifest, [json.dumps(ops)], stdin=stdin if stdin is not None else null,
                             stdout=out_w, stderr=err_w, narrow=narrow, timeout=timeout)
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        for fd in (out_w, err_w) + ((null,) if null is not None else ()):
            os.close(fd)
    with child:
        out, err = read_all(out_r, err_r, timeout=timeout)
        child.wait(timeout)
    results = []
    for line in out.decode(errors="replace").splitlines():
        try:
            results.append(json.loads(line))
        except ValueError:
            results.append({"op": "?", "ok": False, "errname": "garbage", "error": line})
    outcome = Outcome(results, child.exited, err.decode(errors="replace"), child.report)
    if os.environ.get("LLSV_SHOW"):  # LLSV_SHOW=1 pytest -s: what each attack met
        print(f"\n{manifest}: " + "\n  ".join(
            f"{r['op']}: " + ("ok " + json.dumps(r.get("value"))[:200] if r["ok"] else r["errname"]) for r in results)
            + f"\n  exited: {child.exited.get('code')}/{child.exited.get('signal_name')} {outcome.err[-300:]!r}")
    return outcome


# ---- docs/security.md: the tables the tests hold it to ---------------------------------------

def through_a_terminal(attempt: Callable[[int], T]) -> tuple[T, bytes]:
    """attempt(slave) with a fresh pty's slave as the child's stdin, and
    what got pushed into that terminal (TIOCSTI) meanwhile."""
    master, slave = pty.openpty()
    try:
        result = attempt(slave)
        os.set_blocking(master, False)
        try:
            echoed = os.read(master, 100)
        except BlockingIOError:
            echoed = b""
    finally:
        os.close(master)
        os.close(slave)
    return result, echoed


def case(case_id: str):
    """Names a catalogue case: docs/security.md has a row per id (test_docs.py),
    and a case that skips on a kernel with Landlock fails the run (conftest.py)."""
    def deco(fn):
        fn.case_id = case_id
        return fn
    return deco


DOC = REPO / "docs" / "security.md"
_ROW = re.compile(r"^\|\s*`([a-z0-9][a-z0-9-]*)`\s*\|\s*(allowed|denied)\s*\|(.*)$")


def doc_table(section: str) -> dict[str, tuple[str, str]]:
    """id -> (allowed|denied, the rest of the row) for the table under `## section`."""
    rows: dict[str, tuple[str, str]] = {}
    inside = False
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            inside = line[3:].strip().lower().startswith(section.lower())
            continue
        m = _ROW.match(line.strip()) if inside else None
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def documented_limit(limit_id: str) -> tuple[str, int | None]:
    """What docs/security.md says a limit is today, and the ABI that fixes it."""
    rows = doc_table("Limits")
    assert limit_id in rows, f"docs/security.md: the Limits table has no row `{limit_id}`"
    outcome, rest = rows[limit_id]
    m = re.search(r"ABI\s*(\d+)", rest.split("|")[0])
    return outcome, int(m.group(1)) if m else None


def check_limit(limit_id: str, allowed: bool) -> None:
    """Fail unless the observed behaviour is what the docs say it is on
    this kernel (a limit fixed by ABI N is denied from ABI N on)."""
    documented, fixed_by = documented_limit(limit_id)
    expected = "denied" if fixed_by is not None and KERNEL_ABI >= fixed_by else documented
    observed = "allowed" if allowed else "denied"
    assert observed == expected, (f"{limit_id}: docs/security.md says {documented}"
                                  f"{f' (fixed by ABI {fixed_by})' if fixed_by else ''}, "
                                  f"this kernel (ABI {KERNEL_ABI}) says {observed}")


# ---- the arena: what the catalogue attacks ---------------------------------------------------

def _free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listener(family: int = socket.AF_INET, host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, 0))
    s.listen(16)
    s.setblocking(False)
    return s


def accepted(listener: socket.socket, timeout: float = 0.3) -> bytes | None:
    """What the first connection waiting on listener sent; None if none came."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn, _ = listener.accept()
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
    with conn:
        conn.settimeout(2)
        try:
            return conn.recv(100)
        except OSError:
            return b""


@dataclass
class Arena:
    """The tree, sockets and supervisor the catalogue attacks.

    a/allowed    read_only_noexec   probe.py, public (0666), true, hardlink (to secret/secret)
    a/exec       read_only          suid-cat (root, 04755)
    a/rw, a/rw2  read_write_noexec  0777, one subdirectory per identity
    a/secret     no rule            0777: secret (0666), own-<uid> files, sock (pathname listener)
    a/foreign    no rule            root-owned and foreign-owned files (0644)
    /proc        read_only_noexec   as many servers need
    """
    sv: Any
    root: Path
    canary: str
    ports: dict[str, int]
    listeners: dict[str, socket.socket]
    abstract: str
    unix_path: Path
    targets: dict[str, subprocess.Popen] = field(default_factory=dict)

    def p(self, rel: str) -> str:
        return str(self.root / rel)

    def rw(self, ident: Identity, name: str = "") -> str:
        return str(self.root / "rw" / ident.name / name)

    def attack(self, ident: Identity, ops: list[list[Any]], **kw: Any) -> Outcome:
        return attack(self.sv.client, ident.manifest, ops, **kw)


def make_arena(lab: Any) -> Iterator[Arena]:
    """Build the arena in lab, start its supervisor; a generator (for a fixture)."""
    root = lab.dir / "a"
    for sub in ("allowed", "exec", "rw", "rw2", "secret", "foreign"):
        (root / sub).mkdir(parents=True)
    os.chmod(root, 0o755)
    for sub in ("allowed", "rw", "rw2", "secret"):
        os.chmod(root / sub, 0o777)
    os.chmod(root / "exec", 0o755)
    os.chmod(root / "foreign", 0o755)
    for ident in IDENTITIES:
        for d in ("rw", "rw2"):
            (root / d / ident.name).mkdir()
            os.chmod(root / d / ident.name, 0o777)
            os.chown(root / d / ident.name, ident.uid, ident.uid)
    shutil.copy(PROBE, root / "allowed" / "probe.py")
    os.chmod(root / "allowed" / "probe.py", 0o644)
    (root / "allowed" / "public").write_text("public\n")
    os.chmod(root / "allowed" / "public", 0o666)
    for d in ("allowed", "exec"):
        shutil.copy("/bin/true", root / d / "true")
        os.chmod(root / d / "true", 0o755)
    secret = root / "secret" / "secret"
    secret.write_text(f"TOP SECRET {lab.tag}\n")
    os.chmod(secret, 0o666)
    os.link(secret, root / "allowed" / "hardlink")   # planted beforehand, by someone outside
    for ident in IDENTITIES:
        own = root / "secret" / f"own-{ident.name}"
        own.write_text("mine\n")
        os.chown(own, ident.uid, ident.uid)
        os.chmod(own, 0o644)
    (root / "foreign" / "root-owned").write_text("root\n")
    (root / "foreign" / "other-owned").write_text("other\n")
    os.chown(root / "foreign" / "other-owned", FOREIGN_UID, FOREIGN_UID)
    for f in ("root-owned", "other-owned"):
        os.chmod(root / "foreign" / f, 0o644)
    shutil.copy("/bin/cat", root / "exec" / "suid-cat")
    os.chown(root / "exec" / "suid-cat", 0, 0)
    os.chmod(root / "exec" / "suid-cat", 0o4755)

    listeners = {"tcp_ok": _listener(), "tcp_denied": _listener(), "mptcp_target": _listener()}
    try:
        listeners["tcp6_denied"] = _listener(socket.AF_INET6, "::1")
    except OSError:
        pass
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    listeners["udp"] = udp
    abstract = f"llsv-{lab.tag}"
    ab = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ab.bind("\0" + abstract)
    ab.listen(4)
    ab.setblocking(False)
    listeners["abstract"] = ab
    unix_path = root / "secret" / "sock"
    us = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    us.bind(str(unix_path))
    os.chmod(unix_path, 0o666)
    us.listen(4)
    us.setblocking(False)
    listeners["unix"] = us
    ports = {name: s.getsockname()[1] for name, s in listeners.items() if s.family != socket.AF_UNIX}
    ports["bind_ok"], ports["bind_denied"] = _free_port(), _free_port()

    sandbox = {"profiles": ["system"],
               "read_only_noexec": [str(root / "allowed"), "/proc"],
               "read_only": [str(root / "exec")],
               "read_write_noexec": [str(root / "rw"), str(root / "rw2")],
               "network": {"connect_tcp": [ports["tcp_ok"]], "bind_tcp": [ports["bind_ok"]]}}
    for ident in IDENTITIES:
        probe_manifest(lab, ident.manifest, root / "allowed" / "probe.py", user=ident.uid or None,
                       sandbox=sandbox)
    # Resource bombs: a uid of their own; limits come by narrowing.
    probe_manifest(lab, BOMB.manifest, root / "allowed" / "probe.py", user=BOMB_UID, sandbox=sandbox)
    canary = f"LLSV_CANARY_{uuid.uuid4().hex}"
    sv = lab.supervisor(env={"LLSV_SUPERVISOR_SECRET": canary},
                        extra=["--allow-uid", str(CHILD_UID)]).start()
    a = Arena(sv, root, canary, ports, listeners, abstract, unix_path)
    # A process outside every domain, with each identity's uid: only the
    # signal scope can stop a signal to it (DAC would let that uid).
    for ident in IDENTITIES:
        a.targets[ident.name] = subprocess.Popen(
            ["sleep", "600"], user=ident.uid, group=ident.uid, extra_groups=[],
            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield a
    finally:
        for proc in a.targets.values():
            proc.kill()
            proc.wait()
        for s in listeners.values():
            s.close()


def reset_writable(arena: Arena, ident: Identity) -> None:
    """Empty the identity's writable directories."""
    for d in ("rw", "rw2"):
        base = Path(arena.rw(ident)).parent.parent / d / ident.name
        for entry in base.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
