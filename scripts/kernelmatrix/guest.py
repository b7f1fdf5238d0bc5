"""One guest run: the script it runs, its kernel booted, its console log read into a result."""
from __future__ import annotations

import re
import shlex
import time
from pathlib import Path
from typing import Any

from . import qemu
from .config import CACHE, GUEST_TIMEOUT, PYTEST_ARGS, REPO
from .kernels import KERNELS, kind
from .proc import say, spawn

# guest-init's last line: the guest's exit status (qemu does not return it).
MARKER = re.compile(r"^MULTIKERNEL-EXIT=(\d+)\s*$", re.M)
WHY = {"5": "pytest collected no test", "125": "guest setup failed"}


def params(run_script: Path) -> list[str]:
    # Values on the kernel command line cannot hold spaces: the guest
    # command travels as a script path. /tmp gets a tmpfs in the guest; the
    # repository and the cache, when under the host's /tmp, are bound back.
    kept = [str(p) for p in (REPO, CACHE.resolve()) if p == Path("/tmp") or Path("/tmp") in p.parents]
    return [f"GUEST_CMD={run_script}", f"MK_KEEP_TMP={','.join(kept)}"]


def write_run_script(name: str, expect: str, paths: list[str]) -> Path:
    script = CACHE / "run" / f"{name}.sh"
    py = REPO / ".venv" / "bin" / "python"
    script.write_text(f"""#!/bin/sh
# Written by scripts/multikernel for {name}; runs inside the guest.
export EXPECT_ABI={shlex.quote(expect)} PYTHONDONTWRITEBYTECODE=1
export TMPDIR=/run/mk/tmp HOME=/run/mk/home
mkdir -p "$TMPDIR" "$HOME"
cd {shlex.quote(str(REPO))} || exit 125
exec {shlex.join([str(py), "-m", "pytest", *PYTEST_ARGS, *paths])}
""")
    script.chmod(0o755)
    return script


def run(name: str, info: dict[str, Any], paths: list[str], timeout: int | None) -> dict[str, Any]:
    """Boot the kernel on the tests; its result (status "ok" or "FAIL", counts, ABI seen)."""
    timeout = timeout or GUEST_TIMEOUT[kind(name)]
    script = write_run_script(name, info["expect"], paths)
    cmd = qemu.command(info, params(script), KERNELS[name].get("append", []))
    log = CACHE / "logs" / f"{name}.log"
    log.write_text("")
    start = time.monotonic()
    timed_out = spawn(cmd, log, timeout) is None  # the status is in the marker
    secs = time.monotonic() - start
    text = log.read_text(errors="replace").replace("\r", "")
    res = {"secs": secs, "log": str(log), "expect": info["expect"], **read_console(text, timed_out, timeout)}
    if res["status"] != "ok":
        tail = "\n".join("    " + ln for ln in text.splitlines()[-40:])
        say(f"{name}: {res['reason']}; last lines of {log}:\n{tail}")
    return res


def read_console(text: str, timed_out: bool, timeout: int) -> dict[str, Any]:
    """A guest's console log -> the ABI it saw, pytest's counts, status and reason."""
    res: dict[str, Any] = {}
    seen = re.search(r"^landlock-abi: (\d+(?: \(\w+\))?)", text, re.M)
    res["seen"] = seen.group(1) if seen else "?"
    summary = re.findall(r"^=+ (.*\d+ \w+.*) in [\d.]+s.* =+$", text, re.M)
    counts = dict((w.rstrip("s") if w == "errors" else w, int(n)) for n, w in
                  re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)",
                             summary[-1] if summary else ""))
    res.update(passed=counts.get("passed", 0), skipped=counts.get("skipped", 0),
               failed=counts.get("failed", 0) + counts.get("error", 0))
    marks = MARKER.findall(text)
    if timed_out:
        res["status"], res["reason"] = "FAIL", f"guest timed out after {timeout}s"
    elif not marks:
        res["status"], res["reason"] = "FAIL", "guest ended without its exit marker"
    elif marks[-1] != "0":
        res["status"], res["reason"] = "FAIL", WHY.get(marks[-1], f"pytest exited {marks[-1]}")
    else:
        res["status"], res["reason"] = "ok", ""
    return res
