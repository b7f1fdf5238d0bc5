"""The benchmark's command line."""
from __future__ import annotations

import argparse

import scripts.bench

from .lab import PYPI_VENV, REPO


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=scripts.bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="about one minute: a few hundred spawns each")
    p.add_argument("--json", metavar="FILE", help="write every figure here")
    p.add_argument("--spawns", type=int, help="spawns per fast method (default 5000, --quick 300)")
    p.add_argument("--rss-spawns", type=int, help="spawns between the RSS readings (default 10000, --quick 2000)")
    p.add_argument("--heap-mib", type=int, default=1024)
    p.add_argument("--threads", type=int, default=4, help="sleeping threads in the big client")
    p.add_argument("--busy-threads", type=int, default=0, help="busy-looping threads in the big client")
    p.add_argument("--sections", default="latency,big,throughput,rss,mcp,sdk,warm",
                   help="comma-separated subset of latency,big,throughput,rss,mcp,sdk,warm (root: every "
                   "example server with warm: 1, `run` and its relay), and audit (root; not "
                   "by default: it switches the host's audit on, and the kernel keeps it 'ever enabled' until reboot)")
    p.add_argument("--pypi-venv", default=PYPI_VENV, help="a venv with the PyPI landlock package")
    p.add_argument("--servers-dir", default=str(REPO / ".servers"), help="scripts/install-servers' directory")
    p.add_argument("--pool", type=int, default=4, help="the benchmark manifests' pool: children the zygote "
                   "keeps forked and confined (0: each spawn forks)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--no-peers", action="store_true", help="skip landlock-exec, bubblewrap and the PyPI wrapper")
    p.add_argument("--rt", action="store_true", help="run everything (supervisor, children, peers) as SCHED_FIFO "
                   "priority 1 (root): on a machine shared with other work, as if it were idle; recorded")
    p.add_argument("--nice", type=int, help="run at this nice value (as root, -20 shields the run a little "
                   "from other work on a shared machine; recorded in the output)")
    # The throughput phase's client processes: this command again, as a worker (worker.py).
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    p.add_argument("--manifest", help=argparse.SUPPRESS)
    return p.parse_args(argv)
