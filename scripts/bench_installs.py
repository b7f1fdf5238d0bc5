#!/usr/bin/env python3
"""`run`'s start-up in each way a user installs the project (issue 21,
docs/performance.md): the installs of tests/install (a fresh venv each,
offline from one wheelhouse), then, as root from /, in interleaved rounds:
the install's interpreter (`python -c pass`: what an editable install's
import hook costs every start), `run NAME` against a daemon (this venv's,
pool: 0) and `run --manifests DIR NAME` (a private supervisor), each to its
exit. Medians, in ms. Asserts no time.

    .venv/bin/python scripts/bench_installs.py [--rounds N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "install"))
from test_installs import MODES, built_house, install  # noqa: E402

COLUMNS = ("python -c pass", "run (daemon)", "run --manifests (private)")
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/root"}


def _timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd="/", check=True)
    return (time.perf_counter() - start) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_installs: run it as root (its manifest runs as root)")
    with built_house() as house, tempfile.TemporaryDirectory(prefix="llsv-bench-") as tmp:
        installs = {mode: install(house, mode) for mode in MODES}
        state, sock = f"{tmp}/state", f"{tmp}/run/socket"
        serve = subprocess.Popen([str(Path(sys.executable).parent / "landlock-supervisor"), "--socket", sock, "serve",
                                  "--manifests", str(house.manifests), "--allow-root-servers", "--state-root", state],
                                 stderr=subprocess.DEVNULL, cwd="/")
        try:
            while not os.path.exists(sock):
                time.sleep(0.05)
            argvs = {}
            for mode, inst in installs.items():
                exe = str(inst.bin / "landlock-supervisor")
                argvs[mode] = ([str(inst.python), "-c", "pass"], [exe, "run", "--socket", sock, "echo"],
                               [exe, "run", "--allow-root-servers", "--manifests", str(house.manifests),
                                "--state-root", state, "echo"])
            times: dict[tuple[str, int], list[float]] = {}
            for round_ in range(args.rounds + 1):   # the first: a warm-up, not counted
                for mode, commands in argvs.items():
                    for column, argv in enumerate(commands):
                        elapsed = _timed(argv)
                        if round_:
                            times.setdefault((mode, column), []).append(elapsed)
        finally:
            serve.terminate()
            serve.wait()
    print(f"run's start-up by install mode, median of {args.rounds} (ms); load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'install':26s}" + "".join(f"{c:>28s}" for c in COLUMNS))
    for mode in MODES:
        print(f"{mode:26s}" + "".join(f"{statistics.median(times[(mode, c)]):28.1f}" for c in range(3)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
