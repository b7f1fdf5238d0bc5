#!/usr/bin/env python3
"""Soak the supervisor: N spawns from concurrent client processes that
disconnect at random moments and signal their children at random, while the
supervisor itself gets SIGHUP (reload) and stray SIGCHLDs.

    scripts/soak.py                       # 10,000 spawns, 8 clients
    scripts/soak.py --spawns 500 --clients 4 --json

Starts its own supervisor (`python -m supervisor serve`) in a temporary
directory, or uses --socket PATH (then the fd and zombie checks need its
pid: --pid). Prints, and checks:

  zombies            children of the supervisor left as zombies: 0
  fd growth          the supervisor's idle fds after, minus before: 0
  RSS                before and after (KiB)
  accounting         requests = spawned + refused + failed (the server's
                     counters), and spawned = exited once it is idle
  orphans            processes the soak's children started that outlived
                     them: 0

Exit status 0 when every check holds, 1 otherwise. Bounded in time by
--max-seconds: clients stop asking when it is up.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from supervisor.daemon import procfs
from supervisor import protocol  # noqa: E402
from supervisor.client import Client  # noqa: E402

SCRIPTS = [
    "exit 0", "exit 1", "exit 3", "sleep 0.01", "sleep 0.05", "kill -9 $$", "kill -TERM $$",
    "sleep 0.2 & sleep 0.05 & wait", "sleep 0.3 & exit 0",            # grandchildren, one outliving its parent
    "trap '' TERM; sleep 0.3",                                         # ignores TERM: KILL after the grace
    "(trap '' TERM; exec sleep 0.4) & sleep 0.02",                     # a stubborn grandchild
    "echo out; echo err >&2; cat",                                     # reads stdin (/dev/null) to EOF
]
ACTIONS = [("wait", 50), ("disconnect_early", 10), ("disconnect_after_spawn", 15), ("signal_op", 10),
           ("kill_direct", 5), ("hostile", 5), ("stats", 5)]
SIGNALS = [signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCONT]


def manifests(directory: Path, tag: str, pool: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    who = ("allow_root: true\n" if os.geteuid() == 0 else "") + f"pool: {pool}\n"
    env = f"env: {{LLSV_SOAK_TAG: '{tag}', PATH: /usr/bin:/bin}}\n"
    sandbox = "sandbox:\n  profiles: [system]\n  read_only: [/usr/bin]\n"
    (directory / "sh.yaml").write_text(f"command: /bin/sh\nargs: [-c]\nclient_args: true\n{who}{env}{sandbox}")
    (directory / "true.yaml").write_text(f"command: /bin/true\n{who}{env}{sandbox}")
    (directory / "false.yaml").write_text(f"command: /bin/false\n{who}{env}{sandbox}")


# ---- a client process ---------------------------------------------------------------------------

def _recv(sock: socket.socket, timeout: float) -> dict[str, Any] | None:
    sock.settimeout(timeout)
    message, fds = protocol.recv(sock)
    protocol.close_all(fds)
    return message


def _until_exited(sock: socket.socket, counts: dict[str, int]) -> None:
    while True:
        message = _recv(sock, 30)
        if message is None:
            counts["closed_early"] += 1
            return
        if message.get("event") == "exited":
            counts["exited_seen"] += 1
            return


def worker(index: int, path: str, quota: int, seed: int, deadline: float, out: int) -> None:
    rng = random.Random(seed * 1000 + index)
    counts: dict[str, int] = {k: 0 for k in (
        "requests", "spawned_seen", "error_seen", "exited_seen", "closed_early", "hostile", "unanswered",
        "stats")}
    codes: dict[str, int] = {}
    null = os.open(os.devnull, os.O_RDWR)
    names, weights = zip(*ACTIONS)
    done = 0
    while done < quota and time.monotonic() < deadline:
        action = rng.choices(names, weights)[0]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(path)
            if action == "stats":
                protocol.send(sock, {"op": "stats"})
                _recv(sock, 10)
                counts["stats"] += 1
                continue
            if action == "hostile":
                request, fds = rng.choice([
                    ({"op": "spawn", "manifest": "nope"}, [null] * 3),
                    ({"op": "spawn", "manifest": "sh", "args": ["true"], "narrow": {"read_write": ["/"]}}, [null] * 3),
                    ({"op": "spawn", "manifest": "sh", "args": ["true"]}, [null] * 2),
                    ({"op": "spawn", "manifest": "true", "args": ["x"]}, [null] * 3),
                ])
                counts["hostile"] += 1
            else:
                name = rng.choice(["sh", "sh", "sh", "true", "false"])
                args = [rng.choice(SCRIPTS)] if name == "sh" else []
                request, fds = {"op": "spawn", "manifest": name, "args": args}, [null] * 3
            protocol.send(sock, request, fds)
            counts["requests"] += 1
            done += 1
            if action == "disconnect_early":
                continue
            reply = _recv(sock, 30)
            if reply is None:
                counts["unanswered"] += 1
                continue
            if reply.get("event") != "spawned":
                counts["error_seen"] += 1
                codes[reply.get("code", "?")] = codes.get(reply.get("code", "?"), 0) + 1
                continue
            counts["spawned_seen"] += 1
            if action == "disconnect_after_spawn":
                if rng.random() < 0.5:
                    time.sleep(rng.random() * 0.02)
                continue
            if action == "signal_op":
                time.sleep(rng.random() * 0.01)
                try:
                    protocol.send(sock, {"op": "signal", "signal": int(rng.choice(SIGNALS)),
                                         "group": rng.random() < 0.7})
                except OSError:
                    pass
            elif action == "kill_direct":
                try:
                    os.kill(reply["pid"], rng.choice(SIGNALS))
                except (ProcessLookupError, PermissionError):
                    pass
            _until_exited(sock, counts)
        except (OSError, TimeoutError, ValueError) as e:
            key = f"client_error:{type(e).__name__}"
            counts[key] = counts.get(key, 0) + 1
        finally:
            sock.close()
    os.write(out, json.dumps({"counts": counts, "codes": codes}).encode())
    os.close(out)


# ---- the supervisor side --------------------------------------------------------------------------

def tagged(tag: str) -> list[int]:
    return procfs.with_environment(f"LLSV_SOAK_TAG={tag}")


def idle_fds(pid: int, client: Any, timeout: float = 10) -> tuple[int, list[str]]:
    """The supervisor's fd count once no client connection is open: its
    listener and its zygote's two channels; and what they are (a growth
    is then named). Ruleset fds and the pools' hand-over sockets are
    bounded caches that SIGHUP empties: not counted."""
    deadline = time.monotonic() + timeout
    while True:
        pooled = sum(client.stats()["pooled"].values())
        # That request's connection (a socket and the peer's pidfd) closed on the
        # supervisor's side too before its fds are read: read at once, they were
        # often there, and a count that timed out on them kept them (+-2).
        time.sleep(0.05)
        targets = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target != "anon_inode:[landlock-ruleset]":
                    targets.append(target)
            except OSError:
                pass
        settled = pooled == sum(client.stats()["pooled"].values())
        if settled and sum(t.startswith("socket:") for t in targets) <= 3 + pooled \
                and not any("pidfd" in t for t in targets):
            return len(targets) - pooled, targets
        if time.monotonic() > deadline:
            return len(targets) - pooled, targets


def wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spawns", type=int, default=10_000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-seconds", type=float, default=900)
    p.add_argument("--grace", type=float, default=0.5, help="the supervisor's TERM-to-KILL grace")
    p.add_argument("--pool", type=int, default=0, help="the manifests' pool (children forked ahead)")
    p.add_argument("--sighup-every", type=float, default=2.0, help="reload the supervisor this often (0: never)")
    p.add_argument("--socket", help="use this running supervisor (its manifests must be the soak's)")
    p.add_argument("--pid", type=int, help="its pid, with --socket")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)

    tag = uuid.uuid4().hex
    base = Path(tempfile.mkdtemp(prefix="llsv-soak-", dir="/tmp"))
    sv_proc = None
    try:
        if args.socket:
            path, pid = args.socket, args.pid
        else:
            manifests(base / "manifests", tag, args.pool)
            path = str(base / "run" / "socket")
            log = open(base / "supervisor.log", "wb")
            env = {k: v for k, v in os.environ.items() if k != "LANDLOCK_SUPERVISOR_SOCKET"}
            sv_proc = subprocess.Popen([sys.executable, "-m", "supervisor", "--socket", path, "serve",
                                        "--manifests", str(base / "manifests"), "--state-root", str(base / "state"),
                                        "--grace", str(args.grace), "--allow-root-servers"], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=log, start_new_session=True)
            pid = sv_proc.pid
        client = Client(path)
        if not wait_for(lambda: _pings(client), 10):
            print("soak: the supervisor does not answer", file=sys.stderr)
            return 1
        for name, arg in (("sh", ["true"]), ("true", []), ("false", [])):   # build the rulesets first
            null = os.open(os.devnull, os.O_RDWR)
            try:
                client.spawn(name, arg, stdin=null, stdout=null, stderr=null).wait(10)
            finally:
                os.close(null)
        wait_for(lambda: client.stats()["children"] == 0, 10)
        before = client.stats()
        fds_before, targets_before = idle_fds(pid, client) if pid else (None, [])

        started = time.monotonic()
        deadline = started + args.max_seconds
        workers = []
        per = [args.spawns // args.clients + (i < args.spawns % args.clients) for i in range(args.clients)]
        for i in range(args.clients):
            r, w = os.pipe()
            wpid = os.fork()
            if wpid == 0:
                os.close(r)
                code = 0
                try:
                    worker(i, path, per[i], args.seed, deadline, w)
                except BaseException:  # noqa: BLE001
                    import traceback
                    traceback.print_exc()
                    code = 1
                finally:
                    os._exit(code)
            os.close(w)
            workers.append((wpid, r))
        hups = 0
        next_hup = time.monotonic() + args.sighup_every if args.sighup_every else None
        results = []
        pending = list(workers)
        while pending:
            if next_hup and time.monotonic() >= next_hup and pid:
                os.kill(pid, signal.SIGHUP)
                os.kill(pid, signal.SIGCHLD)  # a stray one: nothing to reap
                hups += 1
                next_hup += args.sighup_every
            for wpid, r in list(pending):
                done, status = os.waitpid(wpid, os.WNOHANG)
                if done:
                    data = b""
                    while chunk := os.read(r, 65536):
                        data += chunk
                    os.close(r)
                    results.append(json.loads(data) if data else {"counts": {"worker_died": 1}, "codes": {}})
                    pending.remove((wpid, r))
            time.sleep(0.05)
        elapsed = time.monotonic() - started

        counts: dict[str, int] = {}
        codes: dict[str, int] = {}
        for res in results:
            for k, v in res["counts"].items():
                counts[k] = counts.get(k, 0) + v
            for k, v in res["codes"].items():
                codes[k] = codes.get(k, 0) + v
        drained = wait_for(lambda: client.stats()["children"] == 0, args.grace + 10)
        after = client.stats()
        fds_after, targets_after = idle_fds(pid, client) if pid else (None, [])
        zombies = [c for c in procfs.children_of(pid) if procfs.state(c) == "Z"] if pid else []
        # A session's stubborn grandchildren get their KILL a grace after it ended.
        if not args.socket:
            wait_for(lambda: not tagged(tag), args.grace + 3)
        orphans = tagged(tag) if not args.socket else []
        d = {k: after[k] - before[k] for k in ("spawned", "exited", "refused", "failed", "reaped_orphans")}
        figures = {
            "spawns_requested": counts.get("requests", 0),
            "clients": args.clients,
            "seconds": round(elapsed, 1),
            "spawns_per_second": round(d["spawned"] / elapsed, 1) if elapsed else None,
            "spawned": d["spawned"], "exited": d["exited"], "refused": d["refused"], "failed": d["failed"],
            "reaped_orphans": d["reaped_orphans"],
            "client_view": counts, "error_codes": codes, "sighups": hups,
            "zombies": len(zombies), "orphans": len(orphans),
            "fds_before": fds_before, "fds_after": fds_after,
            "fd_growth": None if fds_before is None else fds_after - fds_before,
            # (what the supervisor held at the end and not at the start, and back: by inode)
            "fds_new": sorted(set(targets_after) - set(targets_before)),
            "fds_gone": sorted(set(targets_before) - set(targets_after)),
            "rss_kib_before": before["rss_kib"], "rss_kib_after": after["rss_kib"],
            "children_left": after["children"], "drained": drained,
        }
        checks = {
            "zombies == 0": figures["zombies"] == 0,
            "orphans == 0": figures["orphans"] == 0,
            "fd growth == 0": figures["fd_growth"] in (0, None),
            "requests == spawned + refused + failed":
                figures["spawns_requested"] == d["spawned"] + d["refused"] + d["failed"],
            "spawned == exited": d["spawned"] == d["exited"],
            "no child left": after["children"] == 0,
            "every client finished": "worker_died" not in counts,
            "supervisor alive": sv_proc is None or sv_proc.poll() is None,
            "reached the requested spawns": figures["spawns_requested"] >= args.spawns or elapsed >= args.max_seconds,
            "RSS growth < 32 MiB": after["rss_kib"] - before["rss_kib"] < 32 * 1024,
        }
        figures["checks"] = checks
        figures["ok"] = all(checks.values())
        if args.json:
            print(json.dumps(figures, sort_keys=True))
        else:
            print(f"spawn requests      {figures['spawns_requested']} from {args.clients} clients in "
                  f"{figures['seconds']} s ({figures['spawns_per_second']} spawns/s), {hups} SIGHUPs")
            print(f"supervisor counted  spawned {d['spawned']}, refused {d['refused']}, failed {d['failed']}, "
                  f"exited {d['exited']}, orphans reaped {d['reaped_orphans']}")
            print(f"accounting          requests {figures['spawns_requested']} = spawned {d['spawned']} + refused "
                  f"{d['refused']} + failed {d['failed']}; spawned {d['spawned']} = exited {d['exited']}")
            print(f"zombies             {figures['zombies']}")
            print(f"orphans             {figures['orphans']}")
            print(f"supervisor fds      before {fds_before}, after {fds_after}, growth {figures['fd_growth']}")
            print(f"supervisor RSS      before {before['rss_kib']} KiB, after {after['rss_kib']} KiB")
            print(f"client view         {json.dumps(counts, sort_keys=True)}")
            print(f"error codes         {json.dumps(codes, sort_keys=True)}")
            for name, ok in checks.items():
                print(f"{'ok  ' if ok else 'FAIL'}  {name}")
        return 0 if figures["ok"] else 1
    finally:
        if sv_proc is not None:
            if sv_proc.poll() is None:
                sv_proc.send_signal(signal.SIGTERM)
                try:
                    sv_proc.wait(args.grace + 10)
                except subprocess.TimeoutExpired:
                    sv_proc.kill()
                    sv_proc.wait()
            if sv_proc.returncode not in (0, None):
                sys.stderr.write((base / "supervisor.log").read_text(errors="replace")[-3000:])
        for p in tagged(tag):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(base, ignore_errors=True)


def _pings(client: Client) -> bool:
    try:
        client.ping()
        return True
    except (OSError, TimeoutError):
        return False


if __name__ == "__main__":
    sys.exit(main())
