"""Spawn-latency benchmark: the fork-server against the floor and the alternatives.

    .venv/bin/python scripts/bench_spawn.py [--quick] [--json FILE]

Measures, in one run and from one client process, the time from "request a
spawn" to "exit status known" for /bin/true and for /bin/cat of a small
allowed file (to /dev/null), and reports p50, p99, mean and the ratio of
each to the floor of the same target:

  1. floor: os.posix_spawn + waitpid, unconfined;
  2. the fork-server (a daemon started here on a temporary socket, with a
     realistic manifest) through supervisor.client.Client; request -> pid
     (Client.spawn returning) is reported separately;
  3. the same from this process holding a 1 GiB heap and extra threads;
  4. a naive proxy: subprocess.Popen(preexec_fn=landlock.apply) from that
     same 1 GiB client;
  5. the re-exec wrapper, landlock-exec, with the same rules;
  6. peers when installed: bubblewrap, landrun, nsjail, and the PyPI
     `landlock` package in a wrapper (skipped with the reason otherwise).

Also: throughput with 1, 4 and 16 concurrent client processes; the
supervisor's RSS before and after N spawns; the start-up time of a real MCP
server (initialize reply) through the supervisor against unconfined; the
same /bin/true from a manifest without a pool setting (pool: auto) and what
an idle ready child costs in memory; the initialize round trip through the
official MCP Python SDK (.clients/py), direct against `run` in daemon and
private mode (issue 14); as root, every example server with `warm: 1`:
`run NAME` to the initialize reply beside run's own start and the server's
first reply on its pipes, the hand-over (spawn request -> pipe ends), the
relay's cost per round trip against direct pipes, and each warm server's
PSS (issue 28). With `--sections audit` (root, never by default:
it switches the host's audit on): spawn -> `exited` through supervisors with
`serve --audit off`, `count` and `detail` side by side (issue 24).

The benchmark is not a test: nothing here asserts a time. The targets of
issue 5 are checked and printed as PASS/MISS for the reader.
"""
# The docstring above is the command's --help. The package, in the order of a run:
#   __main__.py  the run: options, the phases, the report
#   options.py   the command line
#   lab.py       the run's world: temporary tree, manifests, the supervisor daemon
#   methods.py   the ways to start a program that are compared, one Method row each
#   phases.py    latency (small and big client), RSS, throughput, in interleaved rounds
#   worker.py    the throughput client processes (the hidden --worker mode)
#   mcp.py       a real MCP server's start-up, confined and not
#   sdk.py       the SDK's initialize round trip, direct and through `run`; a ready child's memory
#   warm.py      warm servers: `run` to the first reply, the hand-over, the relay, their memory
#   audit_exits.py  spawn -> exited per audit mode, side by side (also scripts/bench_audit.py's)
#   bigheap.py   the 1 GiB threaded client
#   measure.py   percentiles, RSS and CPU readings
#   report.py    the figures derived, the table and the issue 5 targets
# pypi_wrapper.py, echo_server.py and sdk_client.py are programs the benchmark runs, not modules it imports.
