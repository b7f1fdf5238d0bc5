"""`landlock-supervisor check`: what each manifest really gets on this kernel."""
from __future__ import annotations

import argparse
import json
import os
import sys

import landlock
from landlock import audit as landlock_audit

from .daemon import audit, namespaces
from .manifests import dac, ids, profiles
from .denied import clean
from .manifests.manifest import Broken, Manifest, load_each, writable_grants, writable_holding

from landlock.ruleset import inside_writable

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

# What Landlock cannot deny, whatever a manifest says (docs/security.md).
ALWAYS_OPEN = [
    "chmod, chown, utime and setxattr on files the server's user owns",
    "MPTCP sockets bypass the TCP port rules (Landlock erratum 1)",
    "port rules carry no host: a granted port is granted on every address",
    "stat, readlink and path walking (names and metadata are visible everywhere)",
]


def kernel_summary() -> dict[str, Any]:
    support = landlock.probe()
    warnings = []
    try:
        with open("/proc/sys/dev/tty/legacy_tiocsti") as f:
            if f.read().strip() == "1":
                warnings.append("dev.tty.legacy_tiocsti is 1: a process can push input into a terminal it "
                                "holds (TIOCSTI); set it to 0")
    except OSError:
        pass
    isolation = []
    if os.geteuid() == 0:
        isolation.append("IPC namespace of the supervisor's own: " + (
            "yes" if namespaces.ipc_namespaces_available() else "NO (the kernel has none): servers share the host's SysV IPC"))
        isolation.append("passwd entries for dynamic users (a mount namespace): " + (
            "yes" if namespaces.mount_namespaces_available() else "NO: HOME, USER and LOGNAME only"))
    return {"kernel_abi": support.kernel_abi, "errata": support.errata,
            "features": sorted(support.features), "missing": support.missing,
            "warnings": warnings, "isolation": isolation, "denials": denial_visibility(support)}


def denial_visibility(support: landlock.Support) -> str:
    """What `serve` with no --audit would show of the kernel's denials here
    (nothing is changed to find out)."""
    mode = audit.choose(None, False, "logging" in support.features)
    if mode.name == "off":
        return "not visible: " + mode.reason
    try:
        landlock_audit.open_reader().close()
    except landlock_audit.Unavailable as e:
        return f"not visible: {e}{audit.NOT_VISIBLE}"
    return ("count (audit is on here): each session's number of denials; `serve --audit detail` shows each "
            "one to its client, on `run`'s stderr and in `landlock-supervisor denials`")


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
    can swap it for a symlink and so widen the first one's grant. A manifest
    file inside a writable tree (its own server's included): rewritten."""
    out: dict[str, list[str]] = {m.name: [] for m in manifests}
    for m in manifests:
        held = writable_holding(m.source, manifests)
        if held:
            out[m.name].append(f"its file {m.source} lies inside {held[0].name}'s writable {held[1]}: that "
                               "server can rewrite it (`serve` refuses it)")
        for other in manifests:
            if other is m:
                continue
            writable = writable_grants(other)
            for cls, path in m.spec.path_rules:
                real = os.path.realpath(path)
                for w in writable:
                    if real != w and real.startswith(w.rstrip("/") + "/"):
                        out[m.name].append(f"{cls} {path} lies inside {other.name}'s writable {w}")
    return out


def describe(m: Manifest, warnings: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": m.name, "source": m.source, "command": [m.command, *m.args],
                             "pool": m.pool, "warnings": list(m.warnings) + warnings,
                             # Read from the supervisor's environment when it loads the manifest: a
                             # daemon's own (its unit's), a private one's that of `run` (the MCP
                             # client's). Here: whether check's own environment has each.
                             "inherit_env": {k: k in os.environ for k in m.inherit_env}}
    nproc = [r for r in m.spec.rlimits if r.name == "NPROC"]
    if isinstance(m.pool, int) and m.pool and nproc:
        entry["warnings"].append(f"rlimits.NPROC ({nproc[0].soft}) counts the pool's {m.pool} waiting "
                                 "children too: they run as the same user")
    if m.runs_as_root:
        entry["warnings"].append("runs as root: capabilities dropped, but root owns most files: it can chmod "
                                 "them (a set-uid copy of /bin/sh) and DAC no longer protects other users' "
                                 "files and sockets; loads only with serve --allow-root-servers. "
                                 "Give it `user: dynamic`")
    if m.uid is None or m.uid == os.geteuid():
        entry["warnings"].append("runs as the supervisor's own uid: it can prlimit, renice and pin the "
                                 "supervisor's user's processes (the supervisor's included)"
                                 + ("" if os.geteuid() == 0 else ", and every other process of that user"))
    for cls, path, grant in inside_writable(m.spec):
        entry["warnings"].append(f"{cls} {path} lies inside its own writable {grant}: the server can swap it "
                                 "for a symlink")
    if m.dynamic and m.uid is not None and m.area:
        _, recorded = ids.Table(os.path.dirname(os.path.dirname(m.area))).peek(m.name)
        entry["dynamic_uid"] = m.uid if recorded else None
    entry["dac"] = [str(f) for f in dac.findings(m)]
    try:
        ruleset = landlock.build(m.spec)
    except (landlock.LandlockUnavailable, landlock.SpecError) as e:
        entry["refused"] = str(e)
        return entry
    ruleset.close()
    report = ruleset.report
    # The supervisor creates the state directory and its area when it loads the manifest.
    skipped = [p for p in report.skipped_paths
               if not any(d and (p == d or p.startswith(d + "/")) for d in (m.state_dir, m.area))]
    entry.update(abi=report.abi, handled_fs=report.handled_fs, handled_net=report.handled_net,
                 scoped=report.scoped, downgraded=report.downgraded, skipped_paths=skipped,
                 holes=holes(report), note=report.note)
    return entry


def _print(kernel: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    print(f"kernel: Landlock ABI {kernel['kernel_abi']}, errata {kernel['errata']:#x}")
    print(f"  enforced here: {', '.join(kernel['features']) or 'nothing'}")
    for name, why in kernel["missing"].items():
        print(f"  missing {name}: {why}")
    for line in kernel["isolation"]:
        print(f"  {line}")
    print(f"  denials: {kernel['denials']}")
    for w in kernel["warnings"]:
        print(f"  WARNING: {w}")
    for e in entries:
        print(f"\n{e['name']} ({e['source']})")
        print(f"  command: {' '.join(e['command'])}")
        if "dynamic_uid" in e:
            print(f"  runs as dynamic uid {e['dynamic_uid']} (each session with a gid of its own)"
                  if e["dynamic_uid"] is not None
                  else "  runs as a dynamic uid, given at the supervisor's first start")
        if e["inherit_env"]:
            have = [k for k, present in e["inherit_env"].items() if present]
            print("  inherit_env, read from the supervisor's environment (a daemon's own; run --manifests: "
                  "the MCP client's):")
            print(f"    set in check's environment: {', '.join(have) or 'none'}"
                  + "; unset: " + (", ".join(k for k in e["inherit_env"] if k not in have) or "none"))
        if e["pool"] == "auto":
            print("  pool: auto (children forked and confined ahead while it is spawned often; "
                  "never under an NPROC limit)")
        elif e["pool"]:
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
        for finding in e["dac"]:
            print(f"  FILE PERMISSIONS (not Landlock): {clean(finding)}")
        for w in e["warnings"]:
            print(f"  WARNING: {w}")


def main(args: argparse.Namespace) -> int:
    if args.profiles:
        for name, fn in profiles.PROFILES.items():
            print(f"{name}: {fn.__doc__}")
        return 0
    from .client.paths import default_state_root
    state_root = args.state_root or default_state_root()
    loaded, broken = load_each([*args.manifests, *args.manifest], state_root=state_root)
    found = list(loaded.values())
    kernel = kernel_summary()
    cross = cross_warnings(found)
    entries = [describe(m, cross[m.name]) for m in found]
    if args.json:
        print(json.dumps({"kernel": kernel, "manifests": entries, "broken": [vars(b) for b in broken]},
                         indent=2, sort_keys=True))
    else:
        _print(kernel, entries)
        _print_broken(broken)
    if broken:
        print(f"landlock-supervisor: {len(broken)} manifest(s) do not load, and a supervisor would not serve "
              f"them: {', '.join(b.source for b in broken)}", file=sys.stderr)
        return 2
    return 0


def _print_broken(broken: list[Broken]) -> None:
    for b in broken:
        print(f"\n{b.name} ({b.source})\n  BROKEN, not served: {b.error}")
