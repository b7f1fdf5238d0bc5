"""multikernel's run: the command line, the host made ready, every kernel prepared at once, the guests run, the matrix printed."""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import signal
import subprocess
import sys
from typing import Any, NoReturn

from . import debian, guest, host, matrix, patched, qemu
from .config import CACHE, GUEST_TIMEOUT, REPO, TEST_PATHS
from .kernels import GROUPS, KERNELS, expected_abi, kind, select
from .proc import Fail, Skip, die, kill_children, say

Results = dict[str, dict[str, Any]]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="Landlock enforcement tests on many kernels (qemu guests).",
        epilog=f"kernels: {', '.join(KERNELS)}; groups: {', '.join(GROUPS)}. "
               f"Cache: {CACHE} (MULTIKERNEL_CACHE).")
    ap.add_argument("--only", help="comma-separated kernel names or groups")
    ap.add_argument("--prepare-only", action="store_true",
                    help="download and build the kernels, run nothing")
    ap.add_argument("-j", type=int, default=2, metavar="N",
                    help="guests run at a time (default 2)")
    ap.add_argument("--timeout", type=int, metavar="SECONDS",
                    help="per guest run (default: %s)" % ", ".join(
                        f"{k} {v}s" for k, v in GUEST_TIMEOUT.items()))
    ap.add_argument("paths", nargs="*", help=f"test paths (default: {' '.join(TEST_PATHS)})")
    return ap


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str], list[str]]:
    """(options, kernel names, test paths); a usage error exits 2."""
    ap = parser()
    args = ap.parse_args(argv)
    try:
        names = select(args.only)
    except ValueError as e:
        ap.error(str(e))
    if args.j < 1:
        ap.error("-j must be at least 1")
    paths = args.paths or [p for p in TEST_PATHS if (REPO / p).exists()]
    missing = [p for p in paths if not (REPO / p).exists()]
    if missing or not paths:
        ap.error(f"no such test path in {REPO}: {missing or TEST_PATHS}")
    for p in (REPO, CACHE):
        if re.search(r"\s", str(p)):  # it goes on a kernel command line
            die(f"path with whitespace not supported: {p}")
    return args, names, paths


def prepare_host(kinds: set[str], prepare_only: bool) -> None:
    """The host packages these kernels need, and the venv the guests run."""
    groups = ["any", "qemu"]
    if "patched" in kinds and not patched.binary().exists():
        groups.append("kernel-build")
    host.ensure_host_packages(groups)
    if not prepare_only and not (REPO / ".venv/bin/python").exists():
        say("no .venv: running scripts/setup")
        if subprocess.run([REPO / "scripts" / "setup"]).returncode:
            die("scripts/setup failed")


def prepare_all(names: list[str], results: Results) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every kernel at once (the kernel build keeps the cores busy while the
    Debian kernels download): (info by kernel, version shown by kernel); a
    kernel that cannot be had gets its result now."""
    mirrors = host.debian_mirrors()
    # (No `with`: on ^C it would wait for the build before we can kill it.)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)
    jobs = {"patched": pool.submit(patched.prepare, mirrors)} if any(kind(n) == "patched" for n in names) else {}
    for n in names:
        if kind(n) == "qemu":
            jobs[n] = pool.submit(debian.prepare, n, mirrors)
    done: dict[str, Any] = {}
    for key, fut in jobs.items():
        try:
            done[key] = fut.result()
        except (Skip, Fail) as e:
            done[key] = e
        except Exception as e:  # a bug or an unexpected host state
            done[key] = Fail(f"{type(e).__name__}: {e}")
    pool.shutdown()
    prepared, versions = {}, {}
    for n in names:
        got = done["patched" if kind(n) == "patched" else n]
        if isinstance(got, Exception):
            status = "skip" if isinstance(got, Skip) else "FAIL"
            results[n] = {"status": status, "reason": str(got), "expect": KERNELS[n].get("expect", "-")}
            say(f"{n}: {status}: {got}")
            continue
        info = dict(got)
        if kind(n) == "patched":
            info["expect"] = KERNELS[n]["expect"]
            versions[n] = f"{got['version']} patched " + " ".join(KERNELS[n]["append"])
        else:
            info["expect"] = expected_abi(got["kver"])
            versions[n] = f"{got['kver']} ({n})"
        prepared[n] = info
    return prepared, versions


def run_all(prepared: dict[str, dict[str, Any]], paths: list[str], args: argparse.Namespace,
            results: Results) -> None:
    """The guests, args.j at a time, slowest (qemu) first so that the slots stay evenly busy."""
    # The guests cannot write bytecode to the read-only root: without this,
    # every Python process in every guest recompiles whatever was edited
    # since the host last imported it, at TCG speed. (__pycache__ is ignored
    # by git.)
    subprocess.run([REPO / ".venv/bin/python", "-m", "compileall", "-q", "-x", r"/\.",
                    REPO], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    accel, why = qemu.choose_accel(next(iter(prepared.values())), CACHE / "logs" / "kvm-probe.log")
    for info in prepared.values():
        info["accel"] = accel
    say(f"running {' '.join(paths)} in {len(prepared)} guests, {args.j} at a time, under {why}")
    order = sorted(prepared, key=lambda n: kind(n) != "qemu")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.j)
    futs = {pool.submit(guest.run, n, prepared[n], paths, args.timeout): n for n in order}
    try:
        for fut in concurrent.futures.as_completed(futs):
            n = futs[fut]
            try:
                results[n] = fut.result()
            except Exception as e:
                results[n] = {"status": "FAIL", "reason": f"{type(e).__name__}: {e}",
                              "expect": prepared[n]["expect"]}
            say(f"{n}: {results[n]['status']} {results[n]['reason']}".rstrip())
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def main(argv: list[str] | None = None) -> int:
    """0: every kernel green or skipped; 1: a kernel failed (2, usage or host setup, exits from within)."""
    args, names, paths = parse(argv)
    prepare_host({kind(n) for n in names}, args.prepare_only)
    with host.lock_cache():
        results: Results = {}
        prepared, versions = prepare_all(names, results)
        say(f"prepared: {', '.join(prepared) or 'nothing'}")
        if args.prepare_only:
            return 1 if any(r["status"] == "FAIL" for r in results.values()) else 0
        run_all(prepared, paths, args, results)
    print("\n".join(matrix.render(names, results, versions)))
    bad = [n for n in names if results[n]["status"] == "FAIL"]
    say(f"done: {len(names) - len(bad)} of {len(names)} kernels ok or skipped"
        + (f"; FAILED: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def _interrupted(signum: int, frame: Any) -> NoReturn:
    raise KeyboardInterrupt


def cli() -> NoReturn:
    """The command: main() with SIGTERM and SIGHUP as ^C, which kills every build and guest."""
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGHUP, _interrupted)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        # Our children run in their own process groups (see proc.spawn): the
        # signal did not reach them. Worker threads may still be blocked
        # on them, hence _exit rather than a normal exit.
        kill_children()
        say("interrupted: builds and guests killed")
        os._exit(130)
