"""The benchmark's warm section runs (its smoke mode, --quick): every
example server is handed over warm, answers through `run` and on its pipes,
and has its PSS read. Figures are the benchmark's to print, not asserted."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from svhelpers import PYTHON, REPO

pytestmark = pytest.mark.enforcement


@pytest.mark.timeout(900)
def test_the_benchmarks_warm_section_runs_every_example(tmp_path: Path) -> None:
    if not (REPO / ".servers" / "servers.env").exists():
        pytest.fail("the real MCP servers are not installed: run scripts/install-servers", pytrace=False)
    out = tmp_path / "bench.json"
    r = subprocess.run([PYTHON, str(REPO / "scripts" / "bench_spawn.py"), "--quick", "--sections", "warm",
                        "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=840)
    assert r.returncode == 0, r.stderr[-3000:]
    warm = json.loads(out.read_text())["warm"]
    assert "error" not in warm and "skipped" not in warm, warm
    examples = sorted(p.stem for p in (REPO / "examples").glob("*.yaml"))
    assert sorted(warm["pss_kib"]) == sorted([*examples, "trivial", "cat-warm"]), warm["pss_kib"]
    assert all(p["session"] >= p["list"] > 0 for p in warm["pss_kib"].values()), warm["pss_kib"]
    assert sorted(warm["handover"]) == sorted([*examples, "trivial"])
    assert "error" not in warm["sdk"], warm["sdk"]
    assert sorted(warm["sdk"]) == sorted([*examples, "trivial"])
    assert warm["discarded"] == 0 and set(warm["relay"]) >= {"small_added_ms", "big_added"}
    assert "Warm servers (warm: 1 each; issue 28)" in r.stdout
