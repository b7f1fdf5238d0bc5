"""The report: figures derived from the samples, the printed table and the issue 5 targets (pure: results in, text out)."""
from __future__ import annotations

from typing import Any, Callable

from . import audit_exits, warm
from .measure import summarize
from .methods import Method

# The latency table's rows of one target, in this order (a method not run is left out).
ORDER = ["floor", "forkserver", "forkserver_auto", "forkserver_big", "floor_big", "preexec_big", "landlock_exec",
         "bwrap", "pypi_landlock", "landrun", "nsjail"]
QUANTILES = ("p50", "p99", "mean")


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def build(res: dict[str, Any], methods_by_phase: dict[str, list[Method]]) -> None:
    """Each method's summary into res["latency"], with its ratios to the floor of its target."""
    lat = res["latency"]
    for phase, methods in methods_by_phase.items():
        for m in methods:
            entry = {"label": m.label, "phase": phase, **summarize(m.total), "cpu_ms_per_spawn": m.cpu_per_spawn()}
            if m.to_pid:
                entry["to_pid"] = summarize(m.to_pid)
            lat[m.key] = entry
    for key, entry in lat.items():
        target = key.split(":")[-1]
        floor = lat.get(f"floor:{target}") or lat.get(f"floor_big:{target}")
        if floor and entry.get("n") and floor.get("n"):
            entry["x_floor"] = {q: entry[f"{q}_ms"] / floor[f"{q}_ms"] for q in QUANTILES}
            entry["p99_x_floor_p50"] = entry["p99_ms"] / floor["p50_ms"]
            if "to_pid" in entry:
                entry["to_pid"]["x_floor"] = {q: entry["to_pid"][f"{q}_ms"] / floor[f"{q}_ms"] for q in QUANTILES}
    # The phases run one after the other: the big client against its own floor
    # too (posix_spawn does not care about the client's heap), for the reader.
    for t in ("true", "cat"):
        fs, big = _get(lat, f"forkserver:{t}", "p50_ms"), _get(lat, f"forkserver_big:{t}", "p50_ms")
        fl, fl_big = _get(lat, f"floor:{t}", "p50_ms"), _get(lat, f"floor_big:{t}", "p50_ms")
        if big and fs and fl and fl_big:
            lat[f"forkserver_big:{t}"]["vs_small_each_over_its_floor"] = (big / fl_big) / (fs / fl) - 1


def table(res: dict[str, Any], shown_targets: dict[str, str], quick: bool, pool: int) -> str:
    """The whole printed report."""
    out = _header(res, quick, pool) + _latency(res, shown_targets)
    for key, section in SECTIONS:
        if res.get(key):
            out += ["", *section(res[key])]
    out += [f"  note: {note}" for note in res["notes"]]
    return "\n".join(out)


def _header(res: dict[str, Any], quick: bool, pool: int) -> list[str]:
    mach = res["machine"]
    out = ["", f"Spawn latency: request -> exit status known, ms  ({mach['cpus']} CPUs, "
           f"Linux {mach['kernel']}, Landlock ABI {mach.get('landlock_abi')}, Python {mach['python']}, "
           f"{'--quick' if quick else 'full'} run, {mach.get('sched')}, nice {mach.get('nice')}, load average "
           f"{' '.join(mach.get('loadavg_start', []))} at the start, {' '.join(mach.get('loadavg_end', []))} at the "
           f"end; benchmark manifests with pool: {pool})"]
    if float(mach.get("loadavg_end", ["0"])[0]) > 0.5 * (mach["cpus"] or 1):
        out.append("  note: the machine was busy with other work" + (
            " (this run was SCHED_FIFO, ahead of it, but it still shares caches and memory bandwidth)"
            if mach.get("sched", "").startswith("SCHED_FIFO") else
            ": absolute times are inflated; the ratios, from interleaved rounds, hold better, and CPU per "
            "spawn best (or use --rt)"))
    out.append(f"{'':2}{'method':<52}{'n':>6}{'p50':>8}{'p99':>8}{'mean':>8}   x floor p50/p99/mean   CPU ms/spawn")
    return out


def _latency(res: dict[str, Any], shown_targets: dict[str, str]) -> list[str]:
    lat, out = res["latency"], []
    for target, shown in shown_targets.items():
        out.append(f"  target: {shown}")
        for base in ORDER:
            e = lat.get(f"{base}:{target}")
            if e is not None:
                out += _method_rows(e)
            elif res["skipped"].get(base):
                out.append(f"    {base:<50}  skipped: {res['skipped'][base]}")
    if res.get("big_client"):
        b = res["big_client"]
        out.append(f"  big client: RSS {b['rss_kib'] / 1024:.0f} MiB, {b['threads']} threads "
                   f"({b['sleeping_threads']} sleeping, {b['busy_threads']} busy)")
    for base, reason in res["skipped"].items():
        if not any(k.startswith(base + ":") for k in lat) and base not in ORDER:
            out.append(f"  {base}: skipped: {reason}")
    return out


def _method_rows(e: dict[str, Any]) -> list[str]:
    xs, c = e.get("x_floor", {}), e["cpu_ms_per_spawn"]
    out = [f"    {e['label']:<50}{e['n']:>6}{e['p50_ms']:>8.3f}{e['p99_ms']:>8.3f}{e['mean_ms']:>8.3f}   "
           f"{fmt(xs.get('p50')):>5} / {fmt(xs.get('p99')):>5} / {fmt(xs.get('mean')):>5}   "
           f"{c['total']:.2f} (supervisor {c['supervisor']:.2f})"]
    if "to_pid" in e:
        p, px = e["to_pid"], e["to_pid"].get("x_floor", {})
        out.append(f"      {'request -> pid (Client.spawn returns)':<48}{p['n']:>6}{p['p50_ms']:>8.3f}"
                   f"{p['p99_ms']:>8.3f}{p['mean_ms']:>8.3f}   {fmt(px.get('p50')):>5} / {fmt(px.get('p99')):>5} / "
                   f"{fmt(px.get('mean')):>5}")
    return out


def _heap_sweep(sweep: list[dict[str, Any]]) -> list[str]:
    out = ["Cost against the client's heap (/bin/true, p50 ms; the client has its threads throughout)",
           f"  {'client RSS':<12}{'floor':>10}{'fork-server':>14}{'preexec_fn':>14}"]
    for pnt in sweep:
        out.append(f"  {pnt['rss_kib'] // 1024:>6} MiB  {pnt['floor']['p50_ms']:>10.3f}"
                   f"{pnt['forkserver']['p50_ms']:>14.3f}{pnt['preexec']['p50_ms']:>14.3f}")
    return out


def _throughput(tp: dict[str, Any]) -> list[str]:
    out = ["Throughput: spawns/s of /bin/true, N client processes each spawning and waiting in a loop",
           f"  {'clients':<10}{'floor (posix_spawn)':>22}{'fork-server':>14}{'fork-server p50 ms':>22}"
           f"{'supervisor CPU ms/spawn':>26}"]
    for n in sorted({t["clients"] for t in tp.values()}):
        f, s = tp.get(f"floor:{n}", {}), tp.get(f"forkserver:{n}", {})
        out.append(f"  {n:<10}{fmt(f.get('spawns_per_s'), 0):>22}{fmt(s.get('spawns_per_s'), 0):>14}"
                   f"{fmt(s.get('per_client_p50_ms_median'), 3):>22}"
                   f"{fmt(s.get('supervisor_cpu_ms_per_spawn'), 3):>26}")
    return out


def _rss(r: dict[str, Any]) -> list[str]:
    return [f"Supervisor RSS: fresh {r['fresh_kib'] / 1024:.1f} MiB, after warm-up {r['before_kib'] / 1024:.1f} "
            f"MiB, after {r['spawns']} more spawns {r['after_kib'] / 1024:.1f} MiB "
            f"(growth {r['growth_kib']:+d} KiB), {r['settle_s']:.0f} s later {r['settled_kib'] / 1024:.1f} MiB; "
            f"at the end of the run {r.get('end_kib', 0) / 1024:.1f} MiB; "
            f"samples every {r['every']}: {', '.join(str(x) for x in r['samples_kib'])} KiB"]


def _mcp(servers: dict[str, Any]) -> list[str]:
    out = ["MCP server start-up: spawn -> initialize reply, ms (median of runs; min)"]
    for e in servers.values():
        if "error" in e:
            out.append(f"  {e['label']:<44} failed: {e['error']}")
            continue
        out.append(f"  {e['label']:<44} unconfined {e['unconfined_p50_ms']:.1f} ({e['unconfined_min_ms']:.1f})"
                   f"   via supervisor {e['confined_p50_ms']:.1f} ({e['confined_min_ms']:.1f})"
                   f"   added {e['added_p50_ms']:+.1f} ms ({e['added_pct']:+.1f}%), {e['runs']} runs each")
    return out


def _ready_child(r: dict[str, Any]) -> list[str]:
    if not r.get("children"):
        return ["Idle ready child of a pool: none found"]
    return [f"Idle ready child of a pool (median of {r['children']}; /proc/PID/smaps_rollup, KiB): child RSS "
            f"{r.get('child_Rss', 0):.0f}, PSS {r.get('child_Pss', 0):.0f}, private "
            f"{r.get('child_Private_Dirty', 0) + r.get('child_Private_Clean', 0):.0f}; its exec helper shares that "
            f"address space (read there too: PSS {r.get('helper_Pss', 0):.0f}, not to be added); "
            f"the zygote PSS {r.get('zygote_Pss', 0):.0f}"]


def _sdk(r: dict[str, Any]) -> list[str]:
    head = "MCP initialize round trip through the official Python SDK (stdio_client + initialize, ms)"
    if "skipped" in r or "error" in r:
        return [head, f"  {r.get('label', '')} {r.get('skipped') or 'failed: ' + r['error']}"]
    med = r["median_ms"]
    return [head, f"  {r['label']}: median of {r['runs']} interleaved: direct {med['direct']:.1f}, "
                  f"daemon (run) {med['daemon']:.1f} ({r['daemon_added_ms']:+.1f}), "
                  f"private (run --manifests) {med['private']:.1f} ({r['private_added_ms']:+.1f})"]


def _targets(targets: list[dict[str, Any]]) -> list[str]:
    return ["Issue 5 targets"] + [f"  [{t['verdict']:>4}] {t['name']:<58} {t['value']}" for t in targets]


# The sections after the latency table: each printed when its figures exist, after a blank line.
SECTIONS: tuple[tuple[str, Callable[[Any], list[str]]], ...] = (
    ("heap_sweep", _heap_sweep), ("throughput", _throughput), ("rss", _rss), ("mcp", _mcp),
    ("ready_child", _ready_child), ("sdk", _sdk), ("warm", warm.rows), ("audit", audit_exits.rows),
    ("targets", _targets))


def _get(lat: dict[str, Any], key: str, *path: str) -> Any:
    """lat[key][path...], or None where any step is missing."""
    e: Any = lat.get(key)
    for p in path:
        if not isinstance(e, dict) or p not in e:
            return None
        e = e[p]
    return e


def _verdict(name: str, value: float | None, limit: float, fmt_: str, better: str = "le") -> dict[str, Any]:
    if value is None:
        return {"name": name, "verdict": "n/a", "value": "not measured", "limit": limit}
    ok = value <= limit if better == "le" else value >= limit
    return {"name": name, "verdict": "PASS" if ok else "MISS", "value": fmt_.format(value),
            "measured": value, "limit": limit}


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 5's targets, then issue 14's, each PASS, MISS or n/a (not measured) with its figure."""
    out = [row for t in ("true", "cat") for row in _latency_targets(res["latency"], t)]
    tp = res.get("throughput", {}).get("forkserver:4", {}).get("spawns_per_s")
    out.append(_verdict(">= 1000 spawns/s with 4 clients", tp, 1000, "{:.0f}/s", "ge"))
    rss = res.get("rss")
    out.append(_verdict("supervisor RSS < 25 MiB", rss and max(rss["after_kib"], rss.get("end_kib", 0)) / 1024,
                        25, "{:.1f} MiB"))
    out.append(_verdict(f"no RSS growth after {rss['spawns'] if rss else '?'} spawns (<= 256 KiB once settled)",
                        rss and rss["settled_kib"] - rss["before_kib"], 256, "{:+d} KiB"))
    out.append(_verdict("true: manifest without pool: p50 <= 2.2x floor (issue 14)",
                        _get(res["latency"], "forkserver_auto:true", "x_floor", "p50"), 2.2, "{:.2f}x"))
    sdk = res.get("sdk") or {}
    out.append(_verdict("SDK initialize, daemon: <= +25 ms over direct (issue 14)", sdk.get("daemon_added_ms"),
                        25, "{:+.1f} ms"))
    out.append(_verdict("SDK initialize, private: <= +70 ms over direct (issue 14)", sdk.get("private_added_ms"),
                        70, "{:+.1f} ms"))
    for name, value, limit, fmt_ in warm.targets(res.get("warm")):
        out.append(_verdict(name, value, limit, fmt_))
    for mode, ratio in audit_exits.exit_ratios(res.get("audit")).items():
        out.append(_verdict(f"--audit {mode}: spawn -> exited p50 within 10% of off (issue 24)", ratio,
                            audit_exits.EXIT_TARGET, "{:+.1%}"))
    return out


def _latency_targets(lat: dict[str, Any], t: str) -> list[dict[str, Any]]:
    fs = f"forkserver:{t}"
    out = [_verdict(f"{t}: fork-server p50 <= 2.5x floor (aim 2.0x)", _get(lat, fs, "x_floor", "p50"), 2.5, "{:.2f}x"),
           _verdict(f"{t}: fork-server p99 <= 4x floor p99", _get(lat, fs, "x_floor", "p99"), 4, "{:.2f}x"),
           _verdict(f"{t}: fork-server p99 <= 4x floor p50", _get(lat, fs, "p99_x_floor_p50"), 4, "{:.2f}x"),
           _verdict(f"{t}: request -> pid p50 <= 1.5x floor", _get(lat, fs, "to_pid", "x_floor", "p50"), 1.5,
                    "{:.2f}x")]
    fs_p50 = _get(lat, fs, "p50_ms")
    for peer, limit in (("bwrap", 2.5), ("landlock_exec", 6)):
        other = _get(lat, f"{peer}:{t}", "p50_ms")
        out.append(_verdict(f"{t}: >= {limit}x faster than {peer} (p50)", other / fs_p50 if other and fs_p50 else None,
                            limit, "{:.1f}x", "ge"))
    big = _get(lat, f"forkserver_big:{t}", "p50_ms")
    out.append(_verdict(f"{t}: 1 GiB threaded client no more than 10% slower (p50)",
                        big / fs_p50 - 1 if big and fs_p50 else None, 0.10, "{:+.1%}"))
    pre = _get(lat, f"preexec_big:{t}", "p50_ms")
    out.append(_verdict(f"{t}: >= 15x faster than preexec_fn from the 1 GiB client",
                        pre / big if pre and big else None, 15, "{:.1f}x", "ge"))
    return out
