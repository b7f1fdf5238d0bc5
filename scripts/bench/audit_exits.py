"""What denial visibility costs a spawn and its exit: supervisors with `serve --audit off|count|detail` side by side, on the same host state.

Three supervisors, one per mode, serve the same manifests; each round spawns
once through each, in turn, through the client library, timing the request
to `spawned` and to `exited` (and, where one follows, to `settled`, the
kernel's count). The figures are ratios to `off` in the same rounds: the
`count` and `detail` supervisors switch the host's audit on (and put it
back), so `off` runs with audit on too. Root only (CAP_AUDIT_READ).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from supervisor.client import Client

from .lab import REPO
from .measure import log, summarize

MODES = ("off", "count", "detail")
MANIFESTS = {
    "true": "command: /bin/true\npool: 0\nsandbox: {profiles: [system]}\n",
    "true_pooled": "command: /bin/true\nsandbox: {profiles: [system]}\n",
    "denied": "command: /bin/sh\nargs: ['-c', 'read x </etc/hostname; exit 0']\npool: 0\n"
              "sandbox: {profiles: [system]}\n",
}
# Spawn -> exited in count and detail within this of off (issue 24).
EXIT_TARGET = 0.10


def write_manifests(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in MANIFESTS.items():
        (directory / f"{name}.yaml").write_text(f"name: '{name}'\nallow_root: true\n{text}")


def start(base: Path, mode: str) -> tuple[subprocess.Popen[bytes], Client]:
    """A supervisor of base/m in `mode`, answering pings."""
    sock = base / f"{mode}.sock"
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "--socket", str(sock), "serve", "--manifests",
                             str(base / "m"), "--state-root", str(base / f"state-{mode}"), "--audit", mode,
                             "--allow-root-servers"], cwd=REPO, stdin=subprocess.DEVNULL,
                            stderr=open(base / f"{mode}.log", "wb"))
    client = Client(str(sock))
    for _ in range(500):
        try:
            client.ping()
            return proc, client
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"the {mode} supervisor did not start: {(base / f'{mode}.log').read_text()}")


def once(client: Client, name: str) -> tuple[int, int, int]:
    """ns from the request to `spawned`, to `exited`, and to the final counts (`settled`, or `exited` where none follows)."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        t0 = time.perf_counter_ns()
        child = client.spawn(name, stdin=null, stdout=null, stderr=null)
        t1 = time.perf_counter_ns()
        child.wait(30)
        t2 = time.perf_counter_ns()
        child.settle()
        t3 = time.perf_counter_ns()
        child.close()
    finally:
        os.close(null)
    return t1 - t0, t2 - t0, t3 - t0


def summary(samples: dict[str, list[tuple[int, int, int]]]) -> dict[str, Any]:
    return {name: {key: summarize([s[i] for s in triples]) for i, key in enumerate(("spawned", "exited", "settled"))}
            for name, triples in samples.items()}


def interleaved(clients: dict[str, Client], rounds: int) -> dict[str, Any]:
    """Each round: every manifest through every mode, in turn."""
    by_mode: dict[str, dict[str, list[tuple[int, int, int]]]] = {m: {n: [] for n in MANIFESTS} for m in clients}
    for _ in range(rounds):
        for name in MANIFESTS:
            for mode, client in clients.items():
                by_mode[mode][name].append(once(client, name))
    return {mode: summary(samples) for mode, samples in by_mode.items()}


def phase(bench: Any) -> dict[str, Any]:
    """The benchmark's `audit` section."""
    if os.geteuid() != 0:
        return {"skipped": "root only (reading audit records needs CAP_AUDIT_READ)"}
    base = bench.tmp / "audit"
    write_manifests(base / "m")
    rounds = 60 if bench.quick else 300
    log(f"audit: off, count and detail supervisors, {rounds} interleaved rounds (switches the host's audit on, "
        "and back)")
    procs, clients = [], {}
    try:
        for mode in MODES:
            proc, clients[mode] = start(base, mode)
            procs.append(proc)
        for client in clients.values():   # each supervisor's rulesets built, its zygote forked
            for name in MANIFESTS:
                once(client, name)
        return {"rounds": rounds, "modes": interleaved(clients, rounds)}
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(30)


def rows(r: dict[str, Any]) -> list[str]:
    """The section as printed: p50 per manifest and mode, each the ratio to off."""
    head = "Denial visibility (serve --audit off|count|detail, interleaved, audit on for all): p50 ms, x off"
    if "skipped" in r:
        return [head, f"  skipped: {r['skipped']}"]
    out = [head, f"  {'manifest':<12} {'mode':<7} {'-> spawned':>11} {'x off':>6} {'-> exited':>10} {'x off':>6}"
                 f" {'-> settled':>11}   ({r['rounds']} rounds)"]
    modes = r["modes"]
    for name in MANIFESTS:
        off = modes["off"][name]
        for mode in MODES:
            f = modes[mode][name]
            s, e, c = (f[k]["p50_ms"] for k in ("spawned", "exited", "settled"))
            out.append(f"  {name:<12} {mode:<7} {s:>11.2f} {s / off['spawned']['p50_ms']:>6.2f} {e:>10.2f} "
                       f"{e / off['exited']['p50_ms']:>6.2f} {c:>11.2f}")
    return out


def exit_ratios(r: dict[str, Any] | None) -> dict[str, float | None]:
    """count and detail: the worst spawn -> exited p50 over off's, minus 1, across the manifests."""
    if not r or "modes" not in r:
        return {"count": None, "detail": None}
    modes = r["modes"]
    return {mode: max(modes[mode][n]["exited"]["p50_ms"] / modes["off"][n]["exited"]["p50_ms"] - 1
                      for n in MANIFESTS) for mode in ("count", "detail")}
