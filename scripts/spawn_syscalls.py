#!/usr/bin/env python3
"""System calls one spawn of /bin/true makes, per process: the supervisor, its zygote, the child up to its execve; and os.posix_spawn's, measured the same way.

    .venv/bin/python scripts/spawn_syscalls.py                 # --audit off, 50 spawns
    .venv/bin/python scripts/spawn_syscalls.py --audit count --spawns 100 --show child

A supervisor (`serve --audit MODE`, one manifest: /bin/true, pool 0, the
system profile) is started and warmed up; then `strace -ff` is attached to
it and to its zygote (the children, forked by the zygote, are followed),
the client spawns and waits SPAWNS times, and strace is detached. Each
count is the system calls in a process's trace over SPAWNS (timers that
fire meanwhile included, in the supervisor); a child's stop at its execve
(not counted). The floor: a Python process that runs os.posix_spawn +
waitpid SPAWNS times, traced from outside the same way. `--show` prints
one trace of that process (supervisor, zygote, child, floor or floor_child).
Root for `--audit count|detail` (it switches the host's audit on, and back).
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.bench.measure import answering  # noqa: E402
from supervisor.client import Client  # noqa: E402

MANIFEST = "name: 'true'\nallow_root: true\ncommand: /bin/true\npool: 0\nsandbox: {profiles: [system]}\n"
CALL = re.compile(r"^(\w+)\(")
FLOOR = ("import os, sys\nos.write(1, b'ready\\n')\nsys.stdin.readline()\nfor _ in range(int(sys.argv[1])):\n"
         "    os.waitpid(os.posix_spawn('/bin/true', ['true'], {}), 0)\nos.write(1, b'done\\n')\nsys.stdin.readline()\n")


def calls(path: Path) -> list[str]:
    """The system calls of one trace, in order: up to an execve (not counted), none of the reads and writes that pace the floor."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = CALL.match(line)
        if not m:
            continue
        if m.group(1) == "execve":
            break
        if not line.startswith(("read(0,", "write(1,")):
            out.append(line)
    return out


def traced(pids: list[int], directory: Path, act: "callable[[], None]") -> None:
    """strace -ff on pids (and what they fork) while act() runs."""
    args = ["strace", "-ff", "-qq", "-o", str(directory / "t")]
    for pid in pids:
        args += ["-p", str(pid)]
    strace = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    time.sleep(1.0)   # attached
    try:
        act()
        time.sleep(0.3)
    finally:
        strace.send_signal(signal.SIGINT)
        strace.wait(30)


def by_pid(directory: Path) -> dict[int, list[str]]:
    return {int(p.name.split(".")[1]): calls(p) for p in directory.glob("t.*")}


def supervisor_counts(audit: str, spawns: int, base: Path) -> dict[str, object]:
    (base / "m").mkdir()
    (base / "m" / "true.yaml").write_text(MANIFEST)
    sock = base / "s.sock"
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "--socket", str(sock), "serve", "--manifests",
                             str(base / "m"), "--state-root", str(base / "state"), "--audit", audit,
                             "--allow-root-servers"], cwd=REPO, stdin=subprocess.DEVNULL,
                            stderr=open(base / "log", "wb"))
    try:
        client = Client(str(sock))
        answering(client, base / "log")
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)

        def spawn_all(n: int) -> None:
            for _ in range(n):
                child = client.spawn("true", stdin=null, stdout=null, stderr=null)
                child.wait(30)
                child.settle()
                child.close()
        spawn_all(20)
        zygote = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        traces = base / "traces"
        traces.mkdir()
        traced([proc.pid, zygote], traces, lambda: spawn_all(spawns))
        got = by_pid(traces)
        children = [c for pid, c in got.items() if pid not in (proc.pid, zygote)]
        return {"supervisor": got.get(proc.pid, []), "zygote": got.get(zygote, []), "children": children}
    finally:
        proc.terminate()
        proc.wait(30)


def floor_counts(spawns: int, base: Path) -> dict[str, object]:
    proc = subprocess.Popen([sys.executable, "-c", FLOOR, str(spawns)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdout.readline()   # started: its imports not traced
    try:
        traces = base / "floor"
        traces.mkdir()

        def go() -> None:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            assert proc.stdout is not None
            proc.stdout.readline()   # all spawned
        traced([proc.pid], traces, go)
        got = by_pid(traces)
        return {"floor": got.get(proc.pid, []), "children": [c for pid, c in got.items() if pid != proc.pid]}
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--audit", default="off", choices=("off", "count", "detail"))
    ap.add_argument("--spawns", type=int, default=50)
    ap.add_argument("--show", choices=("supervisor", "zygote", "child", "floor", "floor_child"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="spawn-syscalls-") as tmp:
        sup = supervisor_counts(a.audit, a.spawns, Path(tmp))
        floor = floor_counts(a.spawns, Path(tmp))
    children, floor_children = sup["children"], floor["children"]
    assert isinstance(children, list) and isinstance(floor_children, list)
    print(f"system calls per spawn of /bin/true, {a.spawns} spawns, serve --audit {a.audit}")
    for name, lines in (("supervisor", sup["supervisor"]), ("zygote", sup["zygote"])):
        assert isinstance(lines, list)
        print(f"  {name:<22} {len(lines) / a.spawns:7.1f}")
    print(f"  {'child, to execve':<22} {sum(map(len, children)) / max(1, len(children)):7.1f}"
          f"   ({len(children)} children)")
    floor_lines = floor["floor"]
    assert isinstance(floor_lines, list)
    print(f"  {'posix_spawn: parent':<22} {len(floor_lines) / a.spawns:7.1f}")
    print(f"  {'posix_spawn: child':<22} {sum(map(len, floor_children)) / max(1, len(floor_children)):7.1f}")
    show = {"supervisor": sup["supervisor"], "zygote": sup["zygote"], "floor": floor_lines,
            "child": children[0] if children else [], "floor_child": floor_children[0] if floor_children else []}
    if a.show:
        lines = show[a.show]
        assert isinstance(lines, list)
        print("\n".join(lines if a.show in ("child", "floor_child") else lines[: len(lines) // a.spawns + 20]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
