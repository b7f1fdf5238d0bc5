"""The printed matrix: one row a kernel, the columns aligned, the result last."""
from __future__ import annotations

from typing import Any

HEADER = ("kernel", "version", "ABI expected", "ABI seen", "passed", "failed", "skipped", "time", "result")


def rows(names: list[str], results: dict[str, dict[str, Any]], versions: dict[str, str]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = [HEADER]
    for n in names:
        r = results[n]
        if r["status"] == "skip" or "passed" not in r:
            out.append((n, versions.get(n, "-"), r.get("expect", "-"), "-", "-", "-",
                        "-", "-", f"{r['status']}: {r['reason']}"))
        else:
            out.append((n, versions[n], r["expect"], r["seen"], str(r["passed"]),
                        str(r["failed"]), str(r["skipped"]), f"{r['secs']:.0f}s",
                        r["status"] + (f": {r['reason']}" if r["reason"] else "")))
    return out


def render(names: list[str], results: dict[str, dict[str, Any]], versions: dict[str, str]) -> list[str]:
    """The matrix's lines: every column but the last padded to its widest cell."""
    table = rows(names, results, versions)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in table]
