"""The ways to start one program that the benchmark compares: each a function
building one timed spawn, and the Method row that runs it in rounds."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .lab import AS_ROOT, ENV, REPO, TRUE, Bench, user_ids
from .measure import now_ns

# One spawn: (request -> exit status known, request -> pid or None), in ns.
Run = Callable[[], tuple[int, int | None]]


@dataclass
class Method:
    """One method on one target: how to run a spawn, how many and for how
    long at most, and what the rounds measured."""

    key: str
    label: str
    run: Run
    n: int
    budget_s: float
    total: list[int] = field(default_factory=list)
    to_pid: list[int] = field(default_factory=list)
    spent: float = 0.0
    # seconds: this client, its reaped children, supervisor, its children
    cpu: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])

    def cpu_per_spawn(self) -> dict[str, float]:
        n = max(1, len(self.total))
        names = ("client", "client_children", "supervisor", "supervisor_children")
        out = {k: 1000 * v / n for k, v in zip(names, self.cpu)}
        out["total"] = sum(out.values())
        return out


def spawn_wait(bench: Bench, label: str, program: str, argv: list[str], env: dict[str, str]) -> Run:
    """posix_spawn + waitpid of argv, its stdio on /dev/null."""
    fa = bench.fa_null

    def run() -> tuple[int, int | None]:
        t0 = now_ns()
        pid = os.posix_spawn(program, argv, env, file_actions=fa)
        _, status = os.waitpid(pid, 0)
        t1 = now_ns()
        if status != 0:
            raise RuntimeError(f"{label}: {argv[:3]}...: exit status {os.waitstatus_to_exitcode(status)}")
        return t1 - t0, None
    return run


def floor(bench: Bench, target: str) -> Run:
    argv = bench.targets[target]
    return spawn_wait(bench, f"floor {target}", argv[0], argv, ENV)


def forkserver(bench: Bench, target: str) -> Run:
    client, dn = bench.client, bench.devnull

    def run() -> tuple[int, int | None]:
        t0 = now_ns()
        child = client.spawn(target, stdin=dn, stdout=dn, stderr=dn)
        t1 = now_ns()
        rc = child.wait(30)
        t2 = now_ns()
        child.close()
        if rc != 0:
            raise RuntimeError(f"fork-server {target}: exit {child.exited}")
        return t2 - t0, t1 - t0
    return run


def landlock_exec(bench: Bench, target: str) -> Run:
    """The seed's model: a re-exec wrapper given the spec in its environment."""
    from landlock.gocompat import ENV_NATIVE_SPEC
    spec = bench.load_spec(target).spec
    wrapper = Path(sys.executable).parent / "landlock-exec"
    if wrapper.exists():
        program, prefix = str(wrapper), [str(wrapper)]
    else:
        program, prefix = sys.executable, [sys.executable, "-m", "landlock"]
    env = dict(ENV, PYTHONPATH=str(REPO), **{ENV_NATIVE_SPEC: spec.to_json()})
    return spawn_wait(bench, "landlock-exec", program, [*prefix, "--", *bench.targets[target]], env)


def preexec(bench: Bench, target: str) -> Run:
    """The naive proxy: Popen(preexec_fn=landlock.apply)."""
    import landlock
    spec = bench.load_spec(target).spec
    argv, dn = bench.targets[target], bench.devnull

    def confine() -> None:
        landlock.apply(spec)

    def run() -> tuple[int, int | None]:
        t0 = now_ns()
        p = subprocess.Popen(argv, env=ENV, stdin=dn, stdout=dn, stderr=dn, cwd=str(bench.rw),
                             preexec_fn=confine, start_new_session=True)
        rc = p.wait()
        t1 = now_ns()
        if rc != 0:
            raise RuntimeError(f"preexec_fn {target}: exit {rc}")
        return t1 - t0, None
    return run


def bwrap_argv(bench: Bench) -> list[str] | str:
    """bubblewrap's command prefix, or why it cannot run here."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return "not installed (apt-get install bubblewrap)"
    as_nobody = []
    if AS_ROOT:
        uid, gid = user_ids()
        as_nobody = ["--uid", str(uid), "--gid", str(gid), "--cap-drop", "ALL"]
    argv = [bwrap, "--ro-bind", "/", "/", "--bind", str(bench.rw), str(bench.rw), "--dev", "/dev",
            "--unshare-all", "--die-with-parent", "--new-session", *as_nobody, "--"]
    r = subprocess.run([*argv, TRUE], env=ENV, capture_output=True, timeout=30)
    if r.returncode != 0:
        return f"fails here: {argv} exit {r.returncode}: {r.stderr.decode(errors='replace').strip()}"
    return argv


def bwrap(bench: Bench, target: str, prefix: list[str]) -> Run:
    return spawn_wait(bench, "bwrap", prefix[0], [*prefix, *bench.targets[target]], ENV)


def pypi_wrapper(bench: Bench) -> tuple[str, Path] | str:
    """(python, wrapper script) of the PyPI landlock package's venv, or why there is none."""
    venv = bench.args.pypi_venv
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        return f"no venv at {venv} (python3 -m venv {venv} && {venv}/bin/pip install landlock)"
    r = subprocess.run([str(python), "-c", "import landlock, sys; landlock.Ruleset; "
                        "print(getattr(landlock, '__version__', '?'))"],
                       cwd="/", capture_output=True, env=ENV, timeout=30)
    if r.returncode != 0:
        return f"the PyPI landlock package is not importable in {python}: {r.stderr.decode()[-300:]}"
    bench.results["pypi_landlock_version"] = r.stdout.decode().strip()
    script = bench.tmp / "pypi_landlock_wrap.py"
    shutil.copyfile(Path(__file__).with_name("pypi_wrapper.py"), script)
    return str(python), script


def pypi(bench: Bench, target: str, wrapper: tuple[str, Path]) -> Run:
    spec = bench.load_spec(target).spec
    python, script = wrapper
    uid, gid = user_ids()
    rules = {"rx": [*spec.read_only], "r": [*spec.read_only_noexec],
             "rwx": [*spec.read_write], "rw": [*spec.read_write_noexec],
             "rlimits": [[r.resource, r.soft, r.hard] for r in spec.rlimits],
             "uid": uid, "gid": gid}
    env = dict(ENV, BENCH_LANDLOCK_RULES=json.dumps(rules))
    return spawn_wait(bench, "pypi landlock", python, [python, str(script), *bench.targets[target]], env)
