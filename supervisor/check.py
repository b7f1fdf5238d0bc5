"""`landlock-supervisor check`: what each manifest really gets on this kernel."""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

import landlock

from . import profiles
from .manifest import Manifest, ManifestError, load, load_all

# What Landlock cannot deny, whatever a manifest says (docs/security.md).
ALWAYS_OPEN = [
    "chmod, chown, utime and setxattr on files the server's user owns",
    "MPTCP sockets bypass the TCP port rules (Landlock erratum 1)",
    "port rules carry no host: a granted port is granted on every address",
    "stat, readlink and path walking (names and metadata are visible everywhere)",
]


def kernel_summary() -> dict[str, Any]:
    support = landlock.probe()
    return {"kernel_abi": support.kernel_abi, "errata": support.errata,
            "features": sorted(support.features), "missing": support.missing}


def holes(report: landlock.Report) -> list[str]:
    out = []
    if report.unix_connect_unrestricted:
        out.append("connect() to any pathname Unix socket it can name (the supervisor's socket, "
                   "the session bus, systemd --user, docker.sock): not restricted before ABI 9")
    if report.udp_unrestricted:
        out.append("UDP (DNS queries and any datagram): not restricted before ABI 10")
    return out + ALWAYS_OPEN


def cross_warnings(manifests: list[Manifest]) -> dict[str, list[str]]:
    """A path granted to one server inside another's writable tree: the other
    can swap it for a symlink and so widen the first one's grant."""
    out: dict[str, list[str]] = {m.name: [] for m in manifests}
    for m in manifests:
        for other in manifests:
            if other is m:
                continue
            writable = [os.path.realpath(p) for p in (*other.spec.read_write, *other.spec.read_write_noexec)
                        if p not in ("/dev/null", "/dev/zero", "/dev/full")]
            for cls, path in m.spec.path_rules:
                real = os.path.realpath(path)
                for w in writable:
                    if real != w and real.startswith(w.rstrip("/") + "/"):
                        out[m.name].append(f"{cls} {path} lies inside {other.name}'s writable {w}")
    return out


def describe(m: Manifest, warnings: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": m.name, "source": m.source, "command": [m.command, *m.args],
                             "pool": m.pool, "warnings": list(m.warnings) + warnings}
    nproc = [r for r in m.spec.rlimits if r.name == "NPROC"]
    if m.pool and nproc:
        entry["warnings"].append(f"rlimits.NPROC ({nproc[0].soft}) counts the pool's {m.pool} waiting "
                                 "children too: they run as the same user")
    if os.geteuid() == 0 and m.allow_root:
        entry["warnings"].append("runs as root (allow_root): capabilities dropped, but DAC no longer "
                                 "protects other users' files and sockets; give it a dedicated user")
    try:
        ruleset = landlock.build(m.spec)
    except (landlock.LandlockUnavailable, landlock.SpecError) as e:
        entry["refused"] = str(e)
        return entry
    ruleset.close()
    report = ruleset.report
    # The supervisor creates the state directory when it loads the manifest.
    skipped = [p for p in report.skipped_paths
               if not (m.state_dir and (p == m.state_dir or p.startswith(m.state_dir + "/")))]
    entry.update(abi=report.abi, handled_fs=report.handled_fs, handled_net=report.handled_net,
                 scoped=report.scoped, downgraded=report.downgraded, skipped_paths=skipped,
                 holes=holes(report), note=report.note)
    return entry


def _print(kernel: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    print(f"kernel: Landlock ABI {kernel['kernel_abi']}, errata {kernel['errata']:#x}")
    print(f"  enforced here: {', '.join(kernel['features']) or 'nothing'}")
    for name, why in kernel["missing"].items():
        print(f"  missing {name}: {why}")
    for e in entries:
        print(f"\n{e['name']} ({e['source']})")
        print(f"  command: {' '.join(e['command'])}")
        if e["pool"]:
            print(f"  pool: {e['pool']} children forked and confined ahead of requests")
        if "refused" in e:
            print(f"  REFUSED on this kernel: {e['refused']}")
        else:
            print(f"  Landlock ABI {e['abi']}: fs {len(e['handled_fs'])} rights, "
                  f"net {', '.join(e['handled_net']) or 'unrestricted'}, scopes {', '.join(e['scoped']) or 'none'}")
            for name, why in e["downgraded"].items():
                print(f"  downgraded {name}: {why}")
            for path in e["skipped_paths"]:
                print(f"  missing path skipped: {path}")
            for hole in e["holes"]:
                print(f"  open: {hole}")
        for w in e["warnings"]:
            print(f"  WARNING: {w}")


def main(args: argparse.Namespace) -> int:
    if args.profiles:
        for name, fn in profiles.PROFILES.items():
            print(f"{name}: {fn.__doc__}")
        return 0
    from .paths import default_state_root
    state_root = args.state_root or default_state_root()
    try:
        found = list(load_all(args.manifests, state_root=state_root).values()) if args.manifests else []
        found += [load(p, state_root=state_root) for p in args.manifest]
    except ManifestError as e:
        print(f"landlock-supervisor: {e}")
        return 2
    kernel = kernel_summary()
    cross = cross_warnings(found)
    entries = [describe(m, cross[m.name]) for m in found]
    if args.json:
        print(json.dumps({"kernel": kernel, "manifests": entries}, indent=2, sort_keys=True))
    else:
        _print(kernel, entries)
    return 0
