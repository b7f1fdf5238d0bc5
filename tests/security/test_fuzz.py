"""Fuzzing: a seeded, repeatable stream of hostile inputs to the supervisor's
socket, and hostile YAML to the manifest loader.

The protocol fuzzer sends at least 10,000 inputs per run, batched on a few
connections (one process, no per-input spawn): random bytes, truncated and
oversized messages, wrong types, missing fields, deep and huge JSON, too
many and too few fds, fds of the wrong kind (a directory, an O_PATH fd, a
socket, a pidfd), unknown versions and operations, unknown manifests,
and attempts to widen a manifest through `narrow`. Every input must get an
error reply of a code its generator expects; none may obtain a spawn.
Afterwards the supervisor is alive, answers ping, holds exactly the fds it
held before, and has spawned only the children this test asked for.

LLSV_FUZZ_SEED=N reproduces a run (the seed is printed on failure);
LLSV_FUZZ_COUNT=N changes the number of inputs.
"""
from __future__ import annotations

import array
import json
import os
import random
import socket
import string
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from supervisor.manifests import manifest as manifests
from supervisor.manifests.manifest import ManifestError
from svhelpers import recv, run, zombies_of

SEED = int(os.environ.get("LLSV_FUZZ_SEED", "20240607"))
COUNT = int(os.environ.get("LLSV_FUZZ_COUNT", "12000"))
PER_CONNECTION = 250
MAX = 64 * 1024

ANY_ERROR = frozenset({"bad_request", "bad_version", "bad_op", "bad_fds", "too_large", "no_such_manifest",
                       "args_refused", "env_refused", "bad_spec", "no_child", "bad_signal"})


# ---- the target ------------------------------------------------------------------------------

class Target:
    """The supervisor under fuzz, its grants, and the fds a fuzzer can attach."""

    def __init__(self, lab: Any) -> None:
        data = lab.dir / "data"
        for sub in ("granted/inner", "granted-sibling", "other", "rw"):
            (data / sub).mkdir(parents=True, exist_ok=True)
        (data / "granted" / "inner" / "file").write_text("x")
        (data / "granted" / "escape").symlink_to("/etc")
        (data / "granted" / "up").symlink_to("..")
        self.data = data
        lab.stock()
        lab.manifest("wide", command="/bin/true", env={"PATH": "/usr/bin:/bin"}, client_env=["TOKEN"],
                     sandbox={"profiles": ["system"], "read_only_noexec": [str(data / "granted")],
                              "read_write_noexec": [str(data / "rw")],
                              "network": {"connect_tcp": [443, 8443], "bind_tcp": [8080]},
                              "rlimits": {"NOFILE": 256, "CPU": 10}})
        self.sv = lab.start()
        self.path = str(self.sv.socket_path)
        self.null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self.kinds: dict[str, int] = {
            "null": self.null,
            "dir": os.open(str(data), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC),
            "opath": os.open(str(data / "granted" / "inner" / "file"), os.O_PATH | os.O_CLOEXEC),
            "opath_dir": os.open(str(data), os.O_PATH | os.O_CLOEXEC),
            "pidfd": os.pidfd_open(os.getpid()),
        }
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._keep = [a, b]
        self.kinds["socket"] = a.fileno()
        r, w = os.pipe2(os.O_CLOEXEC)
        self.kinds["pipe_r"], self.kinds["pipe_w"] = r, w

    def close(self) -> None:
        for fd in {*self.kinds.values()} - {k.fileno() for k in self._keep}:
            os.close(fd)
        for s in self._keep:
            s.close()


@pytest.fixture(scope="module")
def target(module_lab) -> Iterator[Target]:
    t = Target(module_lab)
    try:
        yield t
    finally:
        t.close()


# ---- the generators ---------------------------------------------------------------------------
# Each returns (datagram, fds, the error codes it may get). A generator must
# produce an input that is invalid: a "spawned" reply is always a failure.

class Fuzzer:
    def __init__(self, rng: random.Random, t: Target) -> None:
        self.rng, self.t = rng, t
        d = str(t.data)
        self.grants = [f"{d}/granted", f"{d}/granted/inner", f"{d}/granted/inner/file", f"{d}/granted/up/granted"]
        self.outside = ["/", "/etc", "/etc/shadow", "/root", "/proc/self/cwd", f"{d}/other", f"{d}",
                        f"{d}/granted/../other", f"{d}/granted/escape", f"{d}/granted/escape/shadow",
                        f"{d}/granted-sibling", f"{d}/granted/up", f"{d}/granted/up/other",
                        f"{d}/granted/inner/../../other", "/proc/1/root/etc", f"{d}/rw/../other"]

    # -- values
    def junk_value(self, depth: int = 0) -> Any:
        r = self.rng
        kind = r.randrange(10 if depth < 3 else 6)
        if kind == 0:
            return None
        if kind == 1:
            return r.choice([True, False])
        if kind == 2:
            return r.choice([0, -1, 1, 2, 15, 2**31, -2**63, 2**64, 10**30])
        if kind == 3:
            return r.choice([0.5, -1e308, 1e308, 3.0])
        if kind == 4:
            return self.text(r.randrange(0, 40))
        if kind == 5:
            return r.choice(["", "\u0000", "../" * 5, "/etc/passwd", "spawn", "\udcff", "é" * 20])
        if kind in (6, 7):
            return [self.junk_value(depth + 1) for _ in range(r.randrange(0, 4))]
        return {self.text(r.randrange(1, 8)): self.junk_value(depth + 1) for _ in range(r.randrange(0, 4))}

    def text(self, n: int) -> str:
        alphabet = string.printable + "é\u2028\u0000\u00ff\U0001f600"
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    def nulls(self, n: int = 3) -> list[int]:
        return [self.t.null] * n

    @staticmethod
    def dump(obj: Any) -> bytes:
        return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")

    # -- the generators
    def random_bytes(self):
        n = self.rng.choice([1, 2, 7, 64, 500, 4000, 60000])
        data = bytes(self.rng.getrandbits(8) for _ in range(min(n, 64))) * (n // 64 + 1)
        return data[:n], self.fds_any(), ANY_ERROR

    def random_json_text(self):
        """Plausible JSON-ish text with random damage (that changes what it says)."""
        valid = self.valid_spawn()
        base = self.dump(valid)
        while True:
            data = bytearray(base)
            for _ in range(self.rng.randrange(1, 6)):
                i = self.rng.randrange(len(data))
                data[i] = self.rng.choice(b'{}[]",:\\0123456789 tfn\x00\xff')
            try:
                if json.loads(bytes(data)) == valid:
                    continue
            except ValueError:
                pass
            return bytes(data), self.nulls(3), ANY_ERROR

    def truncated(self):
        base = self.dump(self.valid_spawn())
        cut = self.rng.randrange(1, len(base))
        return base[:cut], self.nulls(3), {"bad_request"}

    def oversized(self):
        size = self.rng.choice([MAX + 1, MAX + 2, MAX + 4096, 100_000, 150_000])
        msg = self.valid_spawn()
        msg["pad"] = "x" * size
        return self.dump(msg), self.nulls(3), {"too_large"}

    def exactly_max(self):
        """64 KiB exactly: read whole, then refused for what it says."""
        msg = {"v": 1, "op": "ping", "pad": ""}
        msg["pad"] = "y" * (MAX - len(self.dump(msg)))
        data = self.dump(msg)
        assert len(data) == MAX
        return data, [], {"pong"}

    def wrong_type(self):
        msg = self.valid_spawn()
        key = self.rng.choice(["v", "op", "manifest", "args", "env", "narrow"])
        valid = {"v": [1], "op": ["spawn"], "manifest": ["wide"], "args": [[]], "env": [None, {}],
                 "narrow": [None, {}]}[key]
        value = self.junk_value()
        while value in valid and not isinstance(value, bool):
            value = self.junk_value()
        msg[key] = value
        return self.dump(msg), self.nulls(3), ANY_ERROR

    def missing_field(self):
        msg = self.valid_spawn(args=["x"])   # args on a manifest that takes none: never valid
        for key in self.rng.sample(["v", "op", "manifest"], self.rng.randrange(1, 4)):
            msg.pop(key, None)
        return self.dump(msg), self.nulls(3), ANY_ERROR

    def deep(self):
        depth = self.rng.choice([50, 500, 900, 990, 1000, 1100, 5000, 30000])
        opener, closer = self.rng.choice([("[", "]"), ('{"a":', "}")])
        nested = opener * depth + "1" + closer * depth
        where = self.rng.choice(["top", "op", "manifest", "narrow", "args", "env", "signal"])
        if where == "top":
            return nested.encode(), [], ANY_ERROR
        msg = {"v": 1, "op": "spawn" if where not in ("op", "signal") else "signal", "manifest": "wide"}
        text = json.dumps(msg)[:-1] + f', "{where}": {nested}}}'
        data = text.encode()
        fds = self.nulls(3) if msg["op"] == "spawn" else []
        return data, fds, ANY_ERROR | ({"too_large"} if len(data) > MAX else set())

    def huge(self):
        kind = self.rng.randrange(6)
        if kind == 0:
            msg = {"v": 1, "op": "spawn", "manifest": "é" * self.rng.choice([1000, 20000, 32000])}
            fds = self.nulls(3)
        elif kind == 1:
            msg = {"v": 1, "op": "\u2028" * self.rng.choice([100, 10000, 21000])}
            fds = []
        elif kind == 2:
            msg = self.valid_spawn(args=["a" * 100] * self.rng.choice([300, 600]))
            fds = self.nulls(3)
        elif kind == 3:
            msg = {"v": 1, "op": "ping", **{f"k{i}": i for i in range(self.rng.choice([100, 5000]))}}
            return self.dump(msg), [], {"pong", "too_large"}
        elif kind == 4:
            return b'{"v": 1, "op": "ping", "n": ' + b"9" * self.rng.choice([4000, 5000, 60000]) + b"}", [], \
                {"pong", "bad_request"}
        else:
            msg = {"v": 1, "op": "spawn", "manifest": "wide",
                   "narrow": {"read_only_noexec": ["/" + "a" * 4000] * self.rng.choice([1, 10])}}
            fds = self.nulls(3)
        data = self.dump(msg)
        return data, fds, ANY_ERROR | ({"too_large"} if len(data) > MAX else set())

    def fd_count(self):
        op = self.rng.choice(["spawn", "ping", "list", "stats", "status", "signal", "connect"])
        n = self.rng.choice([0, 1, 2, 4, 5, 8, 16, 64, 200] if op == "spawn" else [1, 2, 3, 4, 16])
        msg = self.valid_spawn() if op == "spawn" else {"v": 1, "op": op}
        return self.dump(msg), self.nulls(n), {"bad_fds"} | ({"bad_op"} if op == "connect" else set())

    def fd_kind(self):
        """A directory or an O_PATH fd is no stdio; any fd is wrong for a
        request that takes none."""
        if self.rng.random() < 0.6:
            bad = self.rng.choice(["dir", "opath", "opath_dir"])
            fds = self.nulls(3)
            fds[self.rng.randrange(3)] = self.t.kinds[bad]
            return self.dump(self.valid_spawn()), fds, {"bad_fds"}
        kind = self.rng.choice(sorted(self.t.kinds))
        op = self.rng.choice(["ping", "list", "stats"])
        return self.dump({"v": 1, "op": op}), [self.t.kinds[kind]], {"bad_fds"}

    def version(self):
        v = self.rng.choice([0, 2, -1, 99, 1.5, "1", "v1", None, True, False, [], {}, [1], 2**70])
        msg = {"op": "ping"} if v is None and self.rng.random() < 0.5 else {"v": v, "op": "ping"}
        return self.dump(msg), [], {"bad_version"}

    def unknown_op(self):
        op = self.rng.choice(["", "SPAWN", "Spawn", "spawn ", "exec", "kill", "shutdown", "reload", "connect",
                              "__init__", "ping\u0000", None, 1, [], {}, self.text(12)])
        return self.dump({"v": 1, "op": op}), [], {"bad_op"}

    def unknown_manifest(self):
        name = self.rng.choice(["", " ", "../wide", "wide/", "/bin/sh", "WIDE", "wide\u0000", "sh.yaml",
                                "manifests/sh", "*", "é", None, 1, ["sh"], {"name": "sh"}, self.text(30)])
        return self.dump(self.valid_spawn(manifest=name)), self.nulls(3), {"no_such_manifest"}

    def refused_args_env(self):
        if self.rng.random() < 0.5:
            args = [self.text(self.rng.randrange(0, 10)) for _ in range(self.rng.randrange(1, 5))]
            return self.dump(self.valid_spawn(args=args)), self.nulls(3), {"args_refused", "bad_request"}
        env = {self.rng.choice(["PATH", "LD_PRELOAD", "HOME", "X", "TOKEN2", "token"]): "v"}
        if self.rng.random() < 0.5:
            env["TOKEN"] = "ok"
        return self.dump(self.valid_spawn(env=env)), self.nulls(3), {"env_refused"}

    def widen(self):
        """A narrowing that tries, somewhere, to widen: always bad_spec."""
        r = self.rng
        narrow: dict[str, Any] = {}
        # Some innocent narrowing around the attack...
        if r.random() < 0.5:
            narrow["read_only_noexec"] = r.sample(self.grants, r.randrange(1, 3))
        if r.random() < 0.3:
            narrow["connect_tcp"] = [443]
        # ...and at least one widening.
        for _ in range(r.randrange(1, 3)):
            kind = r.randrange(6)
            if kind == 0:
                cls = r.choice(["read_only_noexec", "read_write_noexec", "read_only", "read_write"])
                narrow[cls] = [r.choice(self.outside)] + r.sample(self.grants, r.randrange(0, 2))
            elif kind == 1:   # a stronger class on a granted path
                cls = r.choice(["read_write_noexec", "read_only", "read_write"])
                narrow[cls] = [r.choice(self.grants)]
                if cls != "read_write_noexec" and r.random() < 0.5:
                    narrow[cls] = [str(self.t.data / "rw")]
            elif kind == 2:
                key = r.choice(["connect_tcp", "bind_tcp", "connect_udp", "bind_udp"])
                narrow[key] = [443, r.choice([22, 80, 8444, 65535, 0])] if key == "connect_tcp" else [r.randrange(1, 65536)]
            elif kind == 3:
                narrow["rlimits"] = {r.choice(["NOFILE", "CPU"]): r.choice([257, 100000, -1, "unlimited", "1T", 2**64])}
            elif kind == 4:
                narrow[r.choice(["unrestricted_network", "unrestricted_filesystem", "user", "group", "scopes",
                                 "require", "best_effort", "keep_capabilities", "max_abi", "strict_paths",
                                 "log", "profiles", "network", "sandbox", "READ_ONLY", ""])] = r.choice(
                    [True, 0, [], "root", ["signal"], None])
            else:
                cls = r.choice(["read_only_noexec", "connect_tcp", "rlimits", "connect_unix"])
                narrow[cls] = self.junk_value() if r.random() < 0.5 else r.choice(
                    ["/etc", ["relative/path"], ["/a\u0000b"], [["/etc"]], {"/etc": 1}, [1], "ALL"])
                if narrow[cls] == [] or narrow[cls] == {}:
                    narrow[cls] = ["/etc"]
        return self.dump(self.valid_spawn(narrow=narrow)), self.nulls(3), {"bad_spec"}

    def no_child(self):
        msg = self.rng.choice([{"op": "signal", "signal": 9}, {"op": "status"}, {"op": "signal"}])
        return self.dump({"v": 1, **msg}), [], {"no_child"}

    def valid_other(self):
        op = self.rng.choice(["ping", "list", "stats"])
        return self.dump({"v": 1, "op": op}), [], {{"ping": "pong"}.get(op, op)}

    # -- helpers
    def valid_spawn(self, **fields: Any) -> dict[str, Any]:
        msg = {"v": 1, "op": "spawn", "manifest": "wide", "args": []}
        msg.update(fields)
        return msg

    def fds_any(self) -> list[int]:
        return self.nulls(self.rng.choice([0, 0, 0, 1, 3, 5]))

    GENERATORS: list[tuple[str, float]] = [
        ("random_bytes", 1), ("random_json_text", 2), ("truncated", 1), ("oversized", 0.3),
        ("exactly_max", 0.05), ("wrong_type", 2), ("missing_field", 1), ("deep", 0.5), ("huge", 0.4),
        ("fd_count", 1), ("fd_kind", 1), ("version", 0.7), ("unknown_op", 0.7), ("unknown_manifest", 1),
        ("refused_args_env", 1), ("widen", 3), ("no_child", 0.3), ("valid_other", 0.3),
    ]

    def stream(self, count: int) -> Iterator[tuple[int, str, bytes, list[int], set[str]]]:
        names = [n for n, _ in self.GENERATORS]
        weights = [w for _, w in self.GENERATORS]
        for i in range(count):
            name = self.rng.choices(names, weights)[0]
            data, fds, expected = getattr(self, name)()
            yield i, name, data, fds, set(expected)


# ---- the wire ---------------------------------------------------------------------------------

class Wire:
    def __init__(self, path: str) -> None:
        self.path = path
        self.sock: socket.socket | None = None
        self.used = 0
        self.connections = 0

    def exchange(self, data: bytes, fds: list[int]) -> dict[str, Any] | None:
        for attempt in range(2):
            if self.sock is None or self.used >= PER_CONNECTION:
                self.close()
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
                self.sock.connect(self.path)
                self.sock.settimeout(10)
                self.used = 0
                self.connections += 1
            self.used += 1
            try:
                anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
                self.sock.sendmsg([data], anc)
                return recv(self.sock)
            except (BrokenPipeError, ConnectionResetError):
                self.close()   # the supervisor closed this connection: a fresh one, once
                if attempt:
                    raise
        return None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


# ---- the test ---------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_protocol_fuzz(target):
    sv = target.sv
    # The valid spawns this test makes on purpose (their rulesets are then
    # cached, and part of the baseline).
    assert run(sv.client, "wide").code == 0
    assert run(sv.client, "wide", narrow={"read_only_noexec": [str(target.data / "granted" / "inner")],
                                          "connect_tcp": [443], "rlimits": {"NOFILE": 64}}).code == 0
    intended = 2
    before = sv.client.stats()
    fds_before = sv.idle_fds()
    log_before = len(sv.log())

    fuzzer = Fuzzer(random.Random(SEED), target)
    wire = Wire(target.path)
    codes: Counter[str] = Counter()
    failures: list[str] = []
    started = time.monotonic()
    for i, name, data, fds, expected in fuzzer.stream(COUNT):
        if len(data) > 200_000:
            continue
        try:
            reply = wire.exchange(data, fds)
        except OSError as e:
            if sv.proc.poll() is not None:
                failures.append(f"#{i} {name}: the supervisor died ({sv.proc.returncode}): {data[:200]!r}")
                break
            failures.append(f"#{i} {name}: {e!r} for {data[:200]!r}")
            continue
        got = "closed" if reply is None else (reply.get("code") if reply.get("event") == "error" else reply.get("event"))
        codes[f"{name}:{got}"] += 1
        if got == "spawned" or got not in expected:
            failures.append(f"#{i} {name}: got {got} (expected {sorted(expected)}) for "
                            f"{data[:300]!r} with {len(fds)} fd(s): {json.dumps(reply)[:300]}")
            if reply and reply.get("event") == "spawned":
                wire.close()
        if len(failures) > 20:
            break
    wire.close()
    elapsed = time.monotonic() - started
    summary = (f"seed {SEED}: {COUNT} inputs on {wire.connections} connections in {elapsed:.1f} s; "
               + ", ".join(f"{k}={v}" for k, v in sorted(codes.items())))
    assert sv.proc.poll() is None, (f"the supervisor died: {sv.log()[log_before:][-3000:]}\n"
                                    + "\n".join(failures[:5]) + f"\n{summary}")
    assert not failures, "\n".join(failures[:20]) + "\n" + summary
    assert sum(codes.values()) >= 10_000 or COUNT < 10_000, summary

    # Alive, serving, the same fds, nothing spawned it should not have.
    assert sv.client.ping()["pid"] == sv.pid
    assert sv.idle_fds() == fds_before
    after = sv.client.stats()
    assert after["spawned"] == before["spawned"] and after["children"] == 0, (before, after)
    assert run(sv.client, "wide").code == 0
    intended += 1
    assert sv.client.stats()["spawned"] == intended
    assert not zombies_of(sv.pid)
    assert "Traceback" not in sv.log()[log_before:], sv.log()[log_before:][-3000:]
    print("\n" + summary)


@pytest.mark.timeout(60)
def test_fuzz_is_repeatable(target):
    """The same seed gives the same inputs: a failure can be replayed."""
    one = [(n, d, len(f)) for _, n, d, f, _ in Fuzzer(random.Random(SEED), target).stream(300)]
    two = [(n, d, len(f)) for _, n, d, f, _ in Fuzzer(random.Random(SEED), target).stream(300)]
    assert one == two


# ---- hostile manifests --------------------------------------------------------------------------

def _billion_laughs() -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\ncommand: /bin/true\n"


SYSTEM_WRITABLE = {"/dev/null", "/dev/zero", "/dev/full"}   # the system profile's
GOOD = "command: /bin/true\nallow_root: true\nsandbox:\n  profiles: [system]\n  read_only_noexec: [/usr/share]\n"

# (file text, a key the error must name; None: only the file). Each must be
# refused with a ManifestError: never another exception, never a manifest.
HOSTILE: list[tuple[str, str | bytes, str | None]] = [
    ("alias-bomb", _billion_laughs(), None),
    ("alias-simple", "x: &x /bin/true\ncommand: *x\nallow_root: true\n", None),
    ("alias-in-sandbox", "command: /bin/true\nallow_root: true\nsandbox: &s {}\nextra: *s\n", None),
    ("merge-key", "base: &b {profiles: [system]}\ncommand: /bin/true\nallow_root: true\nsandbox:\n  <<: *b\n", None),
    ("binary", b"\x00\x01\x02\xff\xfe garbage \x1b[31m\x80\x81", None),
    ("binary-utf8-start", b"command: /bin/true\nallow_root: true\nname: \xc3\x28\n", None),
    ("nul-in-value", "command: /bin/true\x00/bin/sh\nallow_root: true\n", None),
    ("binary-tag", "command: !!binary aGVsbG8=\nallow_root: true\n", "command"),
    ("python-tag", "command: !!python/object/apply:os.system ['id']\n", None),
    ("set-tag", "command: /bin/true\nallow_root: true\nsandbox:\n  read_only: !!set {/etc: null}\n", "read_only"),
    ("timestamp", "command: /bin/true\nallow_root: true\numask: 2001-12-14\n", "umask"),
    ("bad-timestamp", "command: /bin/true\nallow_root: true\nname: 2001-13-45\n", None),
    ("huge-int", "command: /bin/true\nallow_root: true\nsandbox:\n  network:\n    connect_tcp: [" + "9" * 5000 + "]\n", None),
    ("deep-list", "command: /bin/true\nallow_root: true\nargs: " + "[" * 5000 + "]" * 5000 + "\n", None),
    ("deep-map", "command: /bin/true\nallow_root: true\nenv: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", None),
    ("deep-block", "command: /bin/true\nallow_root: true\nsandbox:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(600)), None),
    ("top-list", "- command: /bin/true\n", None),
    ("top-scalar", "just a string\n", None),
    ("empty", "", "command"),
    ("null", "~\n", "command"),
    ("unknown-key", "command: /bin/true\nallow_root: true\nsandbox:\n  read_onyl: [/etc]\n", "read_onyl"),
    ("unknown-top", "command: /bin/true\nallow_root: true\nunrestricted: true\n", "unrestricted"),
    ("string-not-list", "command: /bin/true\nallow_root: true\nsandbox:\n  read_only: /etc\n", "read_only"),
    ("list-of-lists", "command: /bin/true\nallow_root: true\nsandbox:\n  read_only: [[/etc]]\n", "read_only"),
    ("relative-path", "command: /bin/true\nallow_root: true\nsandbox:\n  read_write: [etc]\n", "read_write"),
    ("port-string", "command: /bin/true\nallow_root: true\nsandbox:\n  network: {connect_tcp: ['443']}\n", "connect_tcp"),
    ("port-range", "command: /bin/true\nallow_root: true\nsandbox:\n  network: {bind_tcp: [70000]}\n", "bind_tcp"),
    ("port-bool", "command: /bin/true\nallow_root: true\nsandbox:\n  network: {connect_tcp: [true]}\n", "connect_tcp"),
    ("unrestricted-string", "command: /bin/true\nallow_root: true\nsandbox:\n  network: {unrestricted: 'false'}\n", "unrestricted"),
    ("best-effort-string", "command: /bin/true\nallow_root: true\nsandbox:\n  best_effort: 'no'\n", "best_effort"),
    ("best-effort-int", "command: /bin/true\nallow_root: true\nsandbox:\n  best_effort: 1\n", "best_effort"),
    ("allow-root-string", "command: /bin/true\nallow_root: 'false'\n", "allow_root"),
    ("scopes-string", "command: /bin/true\nallow_root: true\nsandbox:\n  scopes: signal\n", "scopes"),
    ("scopes-unknown", "command: /bin/true\nallow_root: true\nsandbox:\n  scopes: [everything]\n", "scopes"),
    ("require-unknown", "command: /bin/true\nallow_root: true\nsandbox:\n  require: [magic]\n", "require"),
    ("rlimit-junk", "command: /bin/true\nallow_root: true\nsandbox:\n  rlimits: {NOFILE: 1024x}\n", "NOFILE"),
    ("rlimit-negative", "command: /bin/true\nallow_root: true\nsandbox:\n  rlimits: {NOFILE: -5}\n", "NOFILE"),
    ("rlimit-unknown", "command: /bin/true\nallow_root: true\nsandbox:\n  rlimits: {FORKS: 1}\n", "FORKS"),
    ("rlimit-map", "command: /bin/true\nallow_root: true\nsandbox:\n  rlimits: {NOFILE: {soft: 1}}\n", "NOFILE"),
    ("rlimits-list", "command: /bin/true\nallow_root: true\nsandbox:\n  rlimits: [NOFILE]\n", "rlimits"),
    ("umask-octal-int", "command: /bin/true\nallow_root: true\numask: 077\n", "umask"),
    ("umask-big", "command: /bin/true\nallow_root: true\numask: '7777'\n", "umask"),
    ("umask-junk", "command: /bin/true\nallow_root: true\numask: rwx\n", "umask"),
    ("env-nonstring-key", "command: /bin/true\nallow_root: true\nenv: {1: x}\n", "env"),
    ("env-bad-name", "command: /bin/true\nallow_root: true\nenv: {'A=B': x}\n", "env"),
    ("env-list-value", "command: /bin/true\nallow_root: true\nenv: {A: [x]}\n", "env.A"),
    ("client-env-bad", "command: /bin/true\nallow_root: true\nclient_env: ['LD_PRELOAD=x']\n", "client_env"),
    ("command-list", "command: [/bin/true]\nallow_root: true\n", "command"),
    ("command-missing", "allow_root: true\n", "command"),
    ("command-not-exec", "command: /etc/passwd\nallow_root: true\n", "command"),
    ("command-var-unset", "command: ${LLSV_SURELY_UNSET}/true\nallow_root: true\n", "command"),
    ("name-path", "name: ../evil\ncommand: /bin/true\nallow_root: true\n", "name"),
    ("name-long", "name: " + "n" * 100 + "\ncommand: /bin/true\nallow_root: true\n", "name"),
    ("user-list", "command: /bin/true\nuser: [root]\n", "user"),
    ("user-unknown", "command: /bin/true\nuser: llsv-no-such-user\n", "user"),
    ("no-user-as-root", "command: /bin/true\n", "user"),
    ("on-disconnect", "command: /bin/true\nallow_root: true\non_disconnect: maybe\n", "on_disconnect"),
    ("log-unknown", "command: /bin/true\nallow_root: true\nsandbox:\n  log: [everything]\n", "log"),
    ("max-abi-string", "command: /bin/true\nallow_root: true\nsandbox:\n  max_abi: latest\n", "max_abi"),
    ("sandbox-list", "command: /bin/true\nallow_root: true\nsandbox: [read_only]\n", "sandbox"),
    ("network-list", "command: /bin/true\nallow_root: true\nsandbox:\n  network: [443]\n", "network"),
    ("profile-unknown", "command: /bin/true\nallow_root: true\nsandbox:\n  profiles: [everything]\n", "profiles"),
    ("duplicate-key", "command: /bin/true\nallow_root: true\ncommand: /bin/sh\n", None),
    ("duplicate-sandbox", GOOD + "sandbox:\n  network: {unrestricted: true}\n", None),
    ("tabs", "command:\t/bin/true\n\tallow_root: true\n", None),
    ("bom-junk", "\ufeff\ufeffcommand: /bin/true\n", None),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,text,key", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_manifest(tmp_path, name, text, key):
    path = tmp_path / f"{name}.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    started = time.monotonic()
    try:
        m = manifests.load(path, state_root=str(tmp_path / "state"), as_root=True)
    except ManifestError as e:
        message = str(e)
        assert message.startswith(str(path)), message
        if key is not None:
            assert key in message, message
        return
    finally:
        assert time.monotonic() - started < 5, "a manifest took seconds to load"
    pytest.fail(f"{name}: loaded instead of refused: {m}")


@pytest.mark.timeout(60)
def test_huge_manifest_file(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text(GOOD + "# " + "x" * (300 * 1024) + "\n")
    with pytest.raises(ManifestError) as e:
        manifests.load(path, as_root=True)
    assert str(path) in str(e.value) and "exceeds" in str(e.value)
    # Growing while read: only the first 256 KiB + 1 are read.
    assert manifests.MAX_MANIFEST_BYTES == 256 * 1024


@pytest.mark.timeout(60)
def test_manifest_fuzz(tmp_path):
    """Random mutations of a good manifest: every one loads or is refused
    with a ManifestError naming the file; whatever loads is no wider than
    what its text says (the sandbox paths are the ones written)."""
    rng = random.Random(SEED)
    base = GOOD + "args: [a, b]\nenv: {A: b}\numask: '022'\n"
    tokens = [":", "-", "[", "]", "{", "}", "&a", "*a", "!!", "!!str", "!!int", "|", ">", "'", '"', "\n", "  ",
              "\t", "#", "%YAML 1.1\n", "---\n", "...\n", "?", ",", "~", "null", "true", "0x1F", "1e9", "\x00",
              "\xff", "read_write: [/]\n", "sandbox:\n", "network: {unrestricted: true}\n", "best_effort: true\n"]
    loaded = refused = 0
    for i in range(1500):
        text = list(base)
        for _ in range(rng.randrange(1, 5)):
            pos = rng.randrange(len(text) + 1)
            if rng.random() < 0.5 and text:
                del text[pos:pos + rng.randrange(1, 4)]
            else:
                text[pos:pos] = list(rng.choice(tokens))
        path = tmp_path / f"m{i}.yaml"
        path.write_text("".join(text), errors="surrogateescape")
        try:
            m = manifests.load(path, state_root=str(tmp_path / "state"), as_root=True)
        except ManifestError as e:
            assert str(e).startswith(str(path)), str(e)
            refused += 1
            continue
        loaded += 1
        spec = m.spec
        written = yaml.safe_load(path.read_text())
        sandbox = written.get("sandbox") or {}
        # Nothing the text does not say: no unrestricted network or best
        # effort out of nowhere, no path beyond the profile's and the text's.
        assert spec.unrestricted_network == bool((sandbox.get("network") or {}).get("unrestricted", False))
        assert spec.best_effort == bool(sandbox.get("best_effort", False))
        for cls in ("read_write", "read_write_noexec"):
            extra = set(getattr(spec, cls)) - set(sandbox.get(cls) or [])
            assert extra <= SYSTEM_WRITABLE, (cls, extra)
    assert loaded + refused == 1500 and refused > 100
