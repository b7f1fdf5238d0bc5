"""The initialize round trip through the official MCP Python SDK, run with
its own venv's interpreter (.clients/py, scripts/install-clients), never
imported by the benchmark:

    .clients/py/bin/python sdk_client.py SPEC.json

SPEC: {"runs": N, "timeout": S, "variants": {KEY: {"command", "args", "env"}},
"pause_s": P}. Each run starts every variant once, in turn (interleaved), as
an MCP client does (stdio_client), and times from the start to
initialize()'s return; the session is closed before the next, P seconds
(default 0, not timed) after it (a warm server replaced meanwhile).
Prints {KEY: [ms, ...]} (or {"error"}). With "baseline": KEY in SPEC, that
variant is started before each of the others in every run instead of once a
run: its median is of that many more sessions. With "ready": {"argv",
"names"} in SPEC, each pause starts once `argv` (the supervisor's `stats`)
shows a warm server of every name ready: every session then comes after
the same P seconds of an idle machine, whatever the one before it left
starting (a trivial server's replacement takes ~50 ms, an npx one's ~1 s of
CPU; on the development machine, sessions that followed the longer idle
were the slower ones).

With "calls": {"tool", "argument", "small", "big_bytes"} in SPEC, each
session instead, once initialized, calls the tool once (not timed), then P
seconds on, `small` times with a one-character argument and once with
`big_bytes` of them (each echoed back whole), timed from the call to its
result, and prints {KEY: {"small": [ms, ...], "big": [ms, ...]}}.
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


async def once(variant: dict[str, Any], timeout: float) -> float:
    params = StdioServerParameters(command=variant["command"], args=variant.get("args", []), env=variant.get("env"))
    with anyio.fail_after(timeout):
        t0 = time.perf_counter()
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return (time.perf_counter() - t0) * 1000
    raise AssertionError("unreachable")


async def calls(variant: dict[str, Any], spec: dict[str, Any], out: dict[str, list[float]]) -> None:
    """One session's tool calls, small then big, timed (ms) into out."""
    how = spec["calls"]
    params = StdioServerParameters(command=variant["command"], args=variant.get("args", []), env=variant.get("env"))
    with anyio.fail_after(spec["timeout"]):
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.call_tool(how["tool"], {how["argument"]: "x"})   # (the server's first call: not timed)
                await anyio.sleep(spec.get("pause_s", 0))   # (a warm server's replacement started meanwhile)
                for kind, text in [*[("small", "x")] * how["small"], ("big", "x" * how["big_bytes"])]:
                    t0 = time.perf_counter()
                    result = await session.call_tool(how["tool"], {how["argument"]: text})
                    took = (time.perf_counter() - t0) * 1000
                    echoed = "".join(getattr(c, "text", "") for c in result.content)
                    if not echoed.endswith(text):   # (a tool's error comes as a result too)
                        raise AssertionError(f"{how['tool']} did not echo {len(text)} characters: {echoed[:200]!r}")
                    out[kind].append(took)


async def pause(spec: dict[str, Any]) -> None:
    """Between sessions (not timed): every warm server ready if SPEC asks, then P seconds."""
    ready = spec.get("ready")
    deadline = time.monotonic() + spec["timeout"]
    while ready and time.monotonic() < deadline:
        done = await anyio.run_process(ready["argv"], check=False)
        try:
            warm = json.loads(done.stdout)["warm"]
        except (ValueError, KeyError, TypeError):
            warm = {}
        if all(warm.get(name) for name in ready["names"]):
            break
        await anyio.sleep(0.05)
    await anyio.sleep(spec.get("pause_s", 0))


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    if "calls" in spec:
        timed: dict[str, Any] = {key: {"small": [], "big": []} for key in spec["variants"]}
        for _ in range(spec["runs"]):
            for key, variant in spec["variants"].items():
                await calls(variant, spec, timed[key])
        return timed
    out: dict[str, Any] = {key: [] for key in spec["variants"]}
    for key, variant in spec["variants"].items():   # a warm-up each: page cache, rulesets
        await once(variant, spec["timeout"])
        await pause(spec)
    baseline = spec.get("baseline")
    for _ in range(spec["runs"]):
        for key, variant in spec["variants"].items():
            if key == baseline:
                continue
            for k in (baseline, key) if baseline else (key,):
                out[k].append(await once(spec["variants"][k], spec["timeout"]))
                await pause(spec)
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    try:
        result = anyio.run(main, spec)
    except BaseException as e:  # noqa: BLE001 - reported to the benchmark
        inner: Sequence[BaseException] = getattr(e, "exceptions", ())
        while len(inner) == 1:   # (anyio's task groups wrap what failed in an exception group)
            e, inner = inner[0], getattr(inner[0], "exceptions", ())
        result = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(result))
