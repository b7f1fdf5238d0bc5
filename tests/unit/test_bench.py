"""The benchmark's pure parts (scripts/bench/): statistics, counts, options, the derived figures, the targets and the table."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scripts.bench import options, phases, report
from scripts.bench.measure import summarize
from scripts.bench.methods import Method

MS = 1_000_000  # ns


def test_summarize_ranks_and_mean() -> None:
    s = summarize([i * MS for i in range(100, 0, -1)])  # 1..100 ms, unsorted
    assert s == {"n": 100, "p50_ms": 50.0, "p90_ms": 90.0, "p99_ms": 99.0, "mean_ms": 50.5,
                 "min_ms": 1.0, "max_ms": 100.0}
    assert summarize([]) == {"n": 0}
    assert summarize([3 * MS])["p99_ms"] == 3.0


@pytest.mark.parametrize("quick, fast, budget, want", [
    (True, True, 0, (300, 20.0)), (False, True, 0, (5000, 120.0)),
    (True, False, 40.0, (100, 3.0)), (False, False, 40.0, (2000, 40.0))])
def test_counts(quick: bool, fast: bool, budget: float, want: tuple[int, float]) -> None:
    assert phases.counts(quick, fast, budget) == want


def test_options_defaults_and_hidden_worker() -> None:
    a = options.parse([])
    assert (a.quick, a.json, a.pool, a.heap_mib, a.threads, a.rt, a.worker) == (False, None, 4, 1024, 4, False, None)
    assert set(a.sections.split(",")) == {"latency", "big", "throughput", "rss", "mcp", "sdk", "warm"}
    a = options.parse(["--quick", "--json", "out.json", "--sections", "rss", "--pool", "0", "--nice", "-5"])
    assert (a.quick, a.json, a.sections, a.pool, a.nice) == (True, "out.json", "rss", 0, -5)
    w = options.parse(["--worker", "forkserver", "--socket", "/s", "--manifest", "true"])
    assert (w.worker, w.socket, w.manifest) == ("forkserver", "/s", "true")


def test_options_help_hides_the_worker(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        options.parse(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "Spawn-latency benchmark" in out and "--worker" not in out


def method(key: str, ms: list[float], to_pid: list[float] | None = None) -> Method:
    m = Method(key, f"label {key}", lambda: (0, None), len(ms), 1.0)
    m.total = [int(x * MS) for x in ms]
    m.to_pid = [int(x * MS) for x in to_pid or []]
    m.cpu = [0.01 * len(ms), 0.0, 0.02 * len(ms), 0.0]
    return m


def test_cpu_per_spawn() -> None:
    assert method("x:true", [1, 1]).cpu_per_spawn() == pytest.approx(
        {"client": 10.0, "client_children": 0.0, "supervisor": 20.0, "supervisor_children": 0.0, "total": 30.0})


def built() -> dict[str, Any]:
    res: dict[str, Any] = {"latency": {}, "skipped": {}, "notes": []}
    report.build(res, {
        "small": [method("floor:true", [1, 1, 2]), method("forkserver:true", [2, 2, 4], [1, 1, 1])],
        "big": [method("floor_big:true", [2, 2, 2]), method("forkserver_big:true", [3, 3, 3])]})
    return res


def test_build_ratios_to_the_floor() -> None:
    lat = built()["latency"]
    fs = lat["forkserver:true"]
    assert fs["phase"] == "small" and fs["n"] == 3
    assert fs["x_floor"] == pytest.approx({"p50": 2.0, "p99": 2.0, "mean": 2.0})
    assert fs["p99_x_floor_p50"] == pytest.approx(4.0)
    assert fs["to_pid"]["x_floor"]["p50"] == pytest.approx(1.0)
    assert "to_pid" not in lat["floor:true"]
    # Each against its own floor: (3 / 2) / (2 / 1) - 1
    assert lat["forkserver_big:true"]["vs_small_each_over_its_floor"] == pytest.approx(-0.25)
    assert "x_floor" in lat["floor_big:true"]  # against floor:true, the small client's


def test_targets_verdicts() -> None:
    res = built()
    res["throughput"] = {"forkserver:4": {"spawns_per_s": 1200.0}}
    res["rss"] = {"after_kib": 20 * 1024, "end_kib": 30 * 1024, "settled_kib": 1100, "before_kib": 1000,
                  "spawns": 2000}
    rows = {t["name"]: t for t in report.targets(res)}
    assert len(rows) == 24
    assert rows["true: fork-server p50 <= 2.5x floor (aim 2.0x)"]["verdict"] == "PASS"
    assert rows["true: fork-server p50 <= 2.5x floor (aim 2.0x)"]["value"] == "2.00x"
    assert rows["true: fork-server p99 <= 4x floor p50"]["verdict"] == "PASS"
    assert rows["true: 1 GiB threaded client no more than 10% slower (p50)"]["value"] == "+50.0%"
    assert rows["true: 1 GiB threaded client no more than 10% slower (p50)"]["verdict"] == "MISS"
    assert rows["true: >= 2.5x faster than bwrap (p50)"] == {
        "name": "true: >= 2.5x faster than bwrap (p50)", "verdict": "n/a", "value": "not measured", "limit": 2.5}
    assert rows["cat: fork-server p50 <= 2.5x floor (aim 2.0x)"]["verdict"] == "n/a"
    assert rows[">= 1000 spawns/s with 4 clients"]["value"] == "1200/s"
    assert rows["supervisor RSS < 25 MiB"]["verdict"] == "MISS"  # the larger of after and end
    assert rows["no RSS growth after 2000 spawns (<= 256 KiB once settled)"]["value"] == "+100 KiB"
    res["latency"]["forkserver_auto:true"] = {"x_floor": {"p50": 2.5}}
    res["sdk"] = {"daemon_added_ms": 20.0, "private_added_ms": 90.0}
    rows = {t["name"]: t for t in report.targets(res)}
    assert rows["true: manifest without pool: p50 <= 2.2x floor (issue 14)"]["value"] == "2.50x"
    assert rows["SDK initialize, daemon: <= +25 ms over direct (issue 14)"]["verdict"] == "PASS"
    assert rows["SDK initialize, private: <= +70 ms over direct (issue 14)"]["value"] == "+90.0 ms"


def _audit_section(exited_ms: dict[str, float]) -> dict[str, Any]:
    from scripts.bench import audit_exits
    return {"rounds": 3, "modes": {mode: {name: {key: {"p50_ms": exited_ms[mode] if key == "exited" else 1.0}
                                                 for key in ("spawned", "exited", "settled")}
                                          for name in audit_exits.MANIFESTS} for mode in audit_exits.MODES}}


def test_the_audit_sections_target_is_the_worst_exit_over_off() -> None:
    res = built()
    res["audit"] = _audit_section({"off": 4.0, "count": 4.2, "detail": 5.0})
    rows = {t["name"]: t for t in report.targets(res)}
    assert rows["--audit count: spawn -> exited p50 within 10% of off (issue 24)"]["value"] == "+5.0%"
    assert rows["--audit count: spawn -> exited p50 within 10% of off (issue 24)"]["verdict"] == "PASS"
    assert rows["--audit detail: spawn -> exited p50 within 10% of off (issue 24)"]["verdict"] == "MISS"
    from scripts.bench import audit_exits
    assert audit_exits.rows({"skipped": "root only"})[1] == "  skipped: root only"
    assert len(audit_exits.rows(res["audit"])) == 2 + 3 * 3


def test_targets_when_nothing_ran() -> None:
    rows = report.targets({"latency": {}})
    assert [r["verdict"] for r in rows] == ["n/a"] * 24
    assert rows[-6]["name"] == "no RSS growth after ? spawns (<= 256 KiB once settled)"


def machine(load_end: str = "0.10") -> dict[str, Any]:
    return {"cpus": 2, "kernel": "6.1.0", "python": "3.11.2", "landlock_abi": 4, "sched": "SCHED_OTHER",
            "nice": 0, "loadavg_start": ["0.00", "0.01", "0.02"], "loadavg_end": [load_end, "0.20", "0.30"]}


def test_table_rows_skips_and_sections() -> None:
    res = built()
    res["machine"] = machine()
    res["skipped"] = {"bwrap": "not installed", "mcp-x": "its manifest does not load: bad"}
    res["notes"] = ["a note"]
    lines = report.table(res, {"true": "/bin/true", "cat": "/bin/cat $TMP/data.txt"}, True, 4).split("\n")
    assert lines[0] == ""
    assert lines[1].startswith("Spawn latency: request -> exit status known, ms  (2 CPUs, Linux 6.1.0, "
                               "Landlock ABI 4, Python 3.11.2, --quick run, SCHED_OTHER, nice 0,")
    assert lines[1].endswith("benchmark manifests with pool: 4)")
    assert not any("busy with other work" in ln for ln in lines)
    assert lines[3] == "  target: /bin/true"
    assert lines[4] == ("    " + "label floor:true".ljust(50) + "     3   1.000   2.000   1.333"
                        "    1.00 /  1.00 /  1.00   30.00 (supervisor 20.00)")
    assert lines[6] == ("      " + "request -> pid (Client.spawn returns)".ljust(48) + "     3   1.000   1.000   1.000"
                        "    1.00 /  0.50 /  0.75")
    assert "    bwrap                                               skipped: not installed" in lines
    assert "  mcp-x: skipped: its manifest does not load: bad" in lines
    assert lines[-1] == "  note: a note"
    assert "Throughput" not in "\n".join(lines) and "Issue 5 targets" not in lines


def test_table_says_when_the_machine_was_busy() -> None:
    res = built()
    res["machine"] = machine(load_end="1.50")
    res["targets"] = report.targets(res)
    text = report.table(res, {"true": "/bin/true"}, False, 0)
    assert "full run" in text and "pool: 0)" in text
    assert "  note: the machine was busy with other work: absolute times are inflated" in text
    assert "\n\nIssue 5 targets\n  [PASS] true: fork-server p50 <= 2.5x floor (aim 2.0x)" in text


def test_the_warm_sections_rows_and_targets() -> None:
    from scripts.bench import warm
    r = {"runs": 10, "discarded": 0, "wake_us": 120.4, "pss_kib": {"time": {"list": 51200, "session": 51200, "processes": 1}},
         "sdk": {"trivial": 30.0, "time": 40.0, "git": 90.0},
         "handover": {"time": {"handover": 0.6, "handover_max": 0.9, "call": 0.7, "first_reply": 8.0},
                      "git": {"handover": 0.8, "handover_max": 1.2, "call": 0.9, "first_reply": 4.0},
                      "trivial": {"handover": 0.5, "handover_max": 0.7, "call": 0.6, "first_reply": 1.0}},
         "relay": {"trips": 200, "small_direct_ms": 0.02, "small_run_ms": 0.05, "small_added_ms": 0.03,
                   "big_direct_ms": 4.0, "big_run_ms": 4.2, "big_added": 0.05,
                   "big_wide_ms": 3.0, "big_own": 0.4},
         "sdk_relay": {"calls": 20, "small_direct_ms": 1.0, "small_run_ms": 1.04, "small_added_ms": 0.04,
                       "big_direct_ms": 90.0, "big_run_ms": 92.7, "big_added": 0.03},
         "sdk_relay_awake": {"calls": 20, "small_direct_ms": 0.5, "small_run_ms": 0.55, "small_added_ms": 0.05,
                             "big_direct_ms": 80.0, "big_run_ms": 81.6, "big_added": 0.02}}
    lines = warm.rows(r)
    assert lines[1] == "  `run` of the trivial warm server (run's own start): 30.0 (20 sessions, one before each server's)"
    assert lines[2].endswith("(connect -> accept): 120 us, twice in each hand-over")
    assert lines[4].split() == ["time", "40.0", "43.0", "0.60", "0.90", "0.70", "8.0", "50.0", "PASS"]
    assert lines[5].split() == ["git", "90.0", "39.0", "0.80", "1.20", "0.90", "4.0", "0.0", "MISS"]
    assert lines[6].endswith("one character: direct pipes 1.000, through run 1.040 (+0.040 ms); "
                             "5 MiB: direct 90.0, through run 92.7 (+3.0%)")
    assert lines[7].endswith("no CPU left idle (a SCHED_IDLE spinner each): one character: direct pipes 0.500, "
                             "through run 0.550 (+0.050 ms); "
                             "5 MiB: direct 80.0, through run 81.6 (+2.0%)")
    assert "(+0.030 ms)" in lines[8] and "(+5.0%)" in lines[8]
    assert lines[9].endswith("widened as run widens its own: 3.0 (through run +40.0%)")
    assert [(name.split(",")[0], value) for name, value, _, _ in warm.targets(r)] == [
        ("warm: `run` -> initialize reply <= run's own start + first reply + 5 ms", 51.0),   # git's: 90 - 39
        ("warm: spawn request (connect) -> pipe ends", 0.8), ("warm: relay (SDK)", 0.04), ("warm: relay (SDK)", 0.03)]
    assert warm.targets(r | {"sdk": r["sdk"] | {"git": 30.0}})[0][1] == -3.0   # time's: 40 - 43
    without_sdk = r | {"sdk_relay": {"skipped": "no clients"}, "sdk_relay_awake": {"skipped": "no clients"}}
    assert warm.rows(without_sdk)[6] == "  relay as the SDK meets it: no clients"
    assert [value for _, value, _, _ in warm.targets(without_sdk)] == [51.0, 0.8, None, None]
    assert warm.targets(r | {"sdk": {"skipped": "no clients"}})[0][1] is None
    assert warm.targets(None) == [] and warm.targets({"skipped": "not root"}) == []
    assert warm.rows({"skipped": "not root"})[1] == "  not root"


def test_the_smoke_check_names_what_broke_and_only_that() -> None:
    """CI's smoke check asserts no figure: only that the warm section served
    every example warm, through `run` and the SDK."""
    from scripts.bench.__main__ import smoke_failures
    names = [p.stem for p in Path(__file__).resolve().parents[2].joinpath("examples").glob("*.yaml")] + ["trivial"]
    pss = {n: {"list": 100, "session": 120} for n in names}
    warm = {"handover": dict.fromkeys(names, {}), "sdk": dict.fromkeys(names, 40.0),
            "discarded": 0, "pss_kib": pss}
    assert smoke_failures({"warm": warm}) == []
    assert smoke_failures({}) == [] and smoke_failures({"warm": {"skipped": "not root"}}) == []
    assert smoke_failures({"warm": warm | {"sdk": {"skipped": "no clients"}}}) == []
    short = warm | {"sdk": {n: 40.0 for n in names if n != "time"}}
    stray = warm | {"sdk": warm["sdk"] | {"sessions": 30}}   # (the section holds servers only: 5983027 broke CI so)
    for broken in short, stray:
        assert [line[:22] for line in smoke_failures({"warm": broken})] == ["warm: the SDK sessions"]
    assert smoke_failures({"warm": warm | {"discarded": 2}}) == ["warm: 2 warm server(s) discarded"]
    assert smoke_failures({"warm": {"error": "no daemon"}}) == ["warm: no daemon"]
