"""The zygote and the pools: children forked ahead for a manifest with
`pool: N`, each confined before its request and used once. They must be
what a fresh child is (same confinement, same argv/env/stdio, no signal
left ignored), be replaced when the rules or the manifests change, die
with the supervisor, and never be mistaken for orphans or lost."""
from __future__ import annotations

import ctypes
import os
import signal
import time

import pytest

import supervisor
from supervisor.client import SpawnFailed, SupervisorError
from svhelpers import alive, children_of, proc_status, run, sh, wait_until, zombies_of

pytestmark = pytest.mark.enforcement

POOL = 3


def _pooled(sv, name: str) -> int:
    return sv.client.stats()["pooled"].get(name, 0)


def _others(sv) -> list[int]:
    """The supervisor's children that are neither its zygote nor a session."""
    stats = sv.client.stats()
    sessions = {c["pid"] for c in sv.client.list()["children"]}
    return [p for p in children_of(sv.pid) if p != stats["zygote"] and p not in sessions and alive(p)]


def _waiting_children(sv) -> list[int]:
    """Pooled children lead their own sessions; their helpers do not."""
    return [p for p in _others(sv) if os.getsid(p) == p]


def _shares_memory(a: int, b: int) -> bool:
    """kcmp(KCMP_VM): the same address space."""
    kcmp = ctypes.CDLL(None, use_errno=True).syscall
    return kcmp(ctypes.c_long(312), ctypes.c_int(a), ctypes.c_int(b), ctypes.c_int(1), 0, 0) == 0


def _helpers(sv) -> dict[int, int]:
    """pooled child -> its helper (a process sharing its memory)."""
    waiting = _waiting_children(sv)
    return {child: helper for helper in _others(sv) if helper not in waiting
            for child in waiting if _shares_memory(child, helper)}


@pytest.fixture
def pooled(lab, tmp_path):
    data = lab.dir / "data"
    data.mkdir()
    os.chmod(data, 0o755)
    (data / "f").write_text("granted\n")
    os.chmod(data / "f", 0o644)
    (lab.dir / "secret").write_text("secret\n")
    lab.manifest("psh", command="/bin/sh", args=["-c"], client_args=True, client_env=["GREETING"], pool=POOL,
                 user=65534, sandbox={"profiles": ["system"], "read_only": ["/usr/bin"],
                                      "read_only_noexec": [str(data), "/proc"], "rlimits": {"NOFILE": 77}})
    lab.stock()
    sv = lab.start()
    assert sh(sv.client, "true").code == 0
    return sv, data


@pytest.mark.timeout(30)
def test_pooled_children_are_fresh_children(lab, pooled):
    sv, data = pooled
    first = run(sv.client, "psh", ["echo $0 $1 $GREETING; cat; ulimit -n"], stdin=b"in\n",
                env={"GREETING": "hi"})
    assert first.code == 0 and first.text == "/bin/sh hi\nin\n77\n", first
    assert wait_until(lambda: _pooled(sv, "psh") == POOL, 5), sv.client.stats()
    for _ in range(2 * POOL):  # every one of them, and their replacements
        r = run(sv.client, "psh", [f"cat {data}/f; cat {lab.dir}/secret; grep -E '^(Uid|SigIgn|SigBlk|NoNewPrivs)' "
                                   "/proc/self/status"])
        assert r.text.startswith("granted\n"), r
        assert b"Permission denied" in r.err, r  # Landlock: as uid 65534 DAC would allow it
        status = proc_status(r.text.split("\n", 1)[1])
        assert status["Uid"].split() == ["65534"] * 4
        assert status["NoNewPrivs"] == "1"
        # Nothing ignored, nothing blocked: not SIGPIPE, not glibc's 32 and 33.
        assert int(status["SigIgn"], 16) == 0 and int(status["SigBlk"], 16) == 0, status
        assert r.child.report.enforced and r.child.report.tid == r.child.pid
    assert wait_until(lambda: _pooled(sv, "psh") == POOL, 5)
    stats = sv.client.stats()
    assert stats["reaped_orphans"] == 0 and stats["failed"] == 0, stats


@pytest.mark.timeout(30)
def test_a_narrowing_equal_to_the_manifest_keeps_the_pool(pooled):
    """A narrowing that changes nothing is the manifest's own spec: served
    by a waiting child, not by a fresh fork (Specs compare by value)."""
    sv, _ = pooled
    run(sv.client, "psh", ["true"])
    assert wait_until(lambda: _pooled(sv, "psh") == POOL, 5)
    waiting = set(_waiting_children(sv))
    r = run(sv.client, "psh", ["ulimit -n"], narrow={"rlimits": {"NOFILE": 77}})
    assert r.code == 0 and r.text == "77\n", r
    assert r.child.pid in waiting, (r.child.pid, waiting)
    r = run(sv.client, "psh", ["ulimit -n"], narrow={"rlimits": {"NOFILE": 50}})
    assert r.text == "50\n" and r.child.pid not in set(_waiting_children(sv)) | waiting, r


@pytest.mark.timeout(30)
def test_pool_waits_confined_and_bounded(pooled):
    """POOL children wait, each in its own session, confined already: a
    signal sent to them is not the supervisor's, and none is counted as a
    child or an orphan."""
    sv, _ = pooled
    run(sv.client, "psh", ["true"])
    assert wait_until(lambda: len(_waiting_children(sv)) == POOL, 5), _waiting_children(sv)
    for pid in _waiting_children(sv):
        with open(f"/proc/{pid}/status") as f:
            status = proc_status(f.read())
        assert status["NoNewPrivs"] == "1" and status["Uid"].split() == ["65534"] * 4
    # One helper each, sharing its memory, cloned before the child left the
    # zygote's session and user and entered its domain: out of reach of the
    # program the child will become.
    helpers = _helpers(sv)
    assert sorted(helpers) == sorted(_waiting_children(sv)), (helpers, _waiting_children(sv))
    zygote = sv.client.stats()["zygote"]
    for pid, helper in helpers.items():
        with open(f"/proc/{helper}/status") as f:
            status = proc_status(f.read())
        assert status["NoNewPrivs"] == "0" and status["Uid"].split() == ["0"] * 4
        assert status["Tgid"] == str(helper)  # a process of its own, not a thread
        assert os.getsid(helper) == os.getpgid(helper) == zygote
    victim = _waiting_children(sv)[0]
    os.kill(victim, signal.SIGKILL)
    # Its helper goes with it (woken by the kernel at the child's exit).
    assert wait_until(lambda: not {victim, helpers[victim]} & set(children_of(sv.pid)), 5)
    # The killed one is skipped; spawns go on.
    for _ in range(POOL + 1):
        assert run(sv.client, "psh", ["echo ok"]).text == "ok\n"
    stats = sv.client.stats()
    assert stats["children"] == 0 and stats["reaped_orphans"] == 0, stats
    assert sv.client.ping()["pid"] == sv.pid


@pytest.mark.timeout(30)
def test_pool_replaced_when_a_path_is(lab, pooled):
    """The pooled children entered the old ruleset: when a granted path is
    replaced, they go, and the next child sees the new directory."""
    sv, data = pooled
    run(sv.client, "psh", ["true"])
    assert wait_until(lambda: len(_waiting_children(sv)) == POOL, 5)
    old = set(_waiting_children(sv))
    data.rename(lab.dir / "old")
    data.mkdir()
    os.chmod(data, 0o755)
    (data / "f").write_text("new\n")
    os.chmod(data / "f", 0o644)
    assert run(sv.client, "psh", [f"cat {data}/f"]).text == "new\n"
    assert wait_until(lambda: not old & set(children_of(sv.pid)), 5)
    denied = run(sv.client, "psh", [f"cat {lab.dir}/old/f"])
    assert denied.code != 0 and b"Permission denied" in denied.err
    assert sv.client.stats()["reaped_orphans"] == 0


@pytest.mark.timeout(30)
def test_reload_and_zygote_death(lab, pooled):
    """SIGHUP drains every pool; a killed zygote takes its place at the next
    spawn, and the pooled children of the old one go."""
    sv, _ = pooled
    run(sv.client, "psh", ["true"])
    assert wait_until(lambda: len(_waiting_children(sv)) == POOL, 5)
    before = set(_waiting_children(sv))
    sv.signal(signal.SIGHUP)
    assert wait_until(lambda: "reloaded" in sv.log(), 5)
    assert wait_until(lambda: not before & set(children_of(sv.pid)), 5)
    assert run(sv.client, "psh", ["echo again"]).text == "again\n"
    # Killed while idle: one killed between a fork and its announcement
    # leaves a child nobody knew of (it exits at once, reaped as an orphan).
    assert wait_until(lambda: _pooled(sv, "psh") == POOL, 5)
    zygote = sv.client.stats()["zygote"]
    os.kill(zygote, signal.SIGKILL)
    assert wait_until(lambda: "the zygote" in sv.log(), 5), sv.log()
    assert run(sv.client, "psh", ["echo after"]).text == "after\n"
    assert run(sv.client, "true").code == 0
    assert sv.client.stats()["zygote"] not in (None, zygote)
    assert wait_until(lambda: not zombies_of(sv.pid), 5)
    assert sv.client.stats()["reaped_orphans"] == 0


@pytest.mark.timeout(40)
def test_stopped_zygote(lab, pooled):
    """A zygote stopped (by a child not scoped from signalling it) stalls one
    spawn until the reply deadline, then is killed, never to fork for the
    request given up on; another takes its place."""
    sv, _ = pooled
    zygote = sv.client.stats()["zygote"]
    os.kill(zygote, signal.SIGSTOP)
    assert run(sv.client, "true").code == 0
    assert sv.client.stats()["zygote"] not in (None, zygote)
    assert wait_until(lambda: not alive(zygote), 5)
    assert wait_until(lambda: not zombies_of(sv.pid), 5)
    assert run(sv.client, "psh", ["echo after"]).text == "after\n"
    stats = sv.client.stats()
    assert stats["reaped_orphans"] == 0 and stats["spawned"] == stats["exited"] + len(sv.client.list()["children"])


@pytest.mark.timeout(30)
def test_pool_whose_children_cannot_start(lab):
    """A pool whose children die before use (their cwd is not theirs to
    enter) must not fork on and on: each spawn reports why, from a fresh
    child, and the supervisor's children stay few."""
    private = lab.dir / "private"
    private.mkdir(mode=0o700)
    lab.manifest("bad", command="/bin/true", cwd=str(private), user=65534, pool=4)
    sv = lab.start()
    for _ in range(6):
        with pytest.raises(SpawnFailed) as e:
            run(sv.client, "bad")
        assert e.value.stage == "chdir", e.value.reply
    assert wait_until(lambda: len(children_of(sv.pid)) <= 1 + 4, 5), children_of(sv.pid)
    assert sv.client.ping()["pid"] == sv.pid


@pytest.mark.timeout(30)
def test_private_supervisor_children_keep_default_signals(lab):
    """A private supervisor is started by posix_spawn, which leaves glibc's
    internal signals ignored; none of that reaches its children."""
    lab.manifest("status", command="/bin/cat", args=["/proc/self/status"],
                 sandbox={"profiles": ["system"], "read_only_noexec": ["/proc"]})
    with supervisor.start(str(lab.manifest_dir), state_root=str(lab.state_root),
                          extra_args=["--allow-root-servers"]) as client:
        r = run(client, "status")
    status = proc_status(r.text)
    assert int(status["SigIgn"], 16) == 0 and int(status["SigBlk"], 16) == 0, status


def test_pool_is_bounded_in_the_manifest(lab):
    from supervisor.manifests import manifest as manifests
    path = lab.manifest("big", command="/bin/true", pool=9)
    with pytest.raises(manifests.ManifestError, match="pool"):
        manifests.load(path, state_root=str(lab.state_root))


@pytest.mark.timeout(30)
def test_oversized_environment_is_refused_clearly(lab):
    """argv and environment past what the zygote takes (256 KiB, here from
    the supervisor's own environment): an error naming it, pooled or not;
    the supervisor serves on."""
    big = {f"BIG{i}": "x" * (100 * 1024) for i in range(3)}
    for pool in (0, 2):
        lab.manifest(f"big{pool}", command="/bin/true", pool=pool, inherit_env=sorted(big))
    # 100 KiB: more than a waiting child takes (64 KiB), so a fresh child runs it.
    lab.manifest("large", command="/bin/sh", args=["-c", 'test ${#BIG0} = 102400'], pool=2, inherit_env=["BIG0"],
                 sandbox={"profiles": ["system"]})
    sv = lab.start(env=big)
    for _ in range(3):
        assert run(sv.client, "large").code == 0
    for pool in (0, 2):
        for _ in range(2):
            with pytest.raises(SupervisorError) as e:
                run(sv.client, f"big{pool}")
            assert e.value.code == "fork_failed" and "256 KiB" in str(e.value), e.value
    assert sv.client.ping()["pid"] == sv.pid


@pytest.mark.timeout(30)
def test_helper_goes_at_the_exec(lab, pooled):
    """A helper holds its child's old address space, nothing else: once the
    child has exec'd it exits and is reaped as the supervisor's own. A child
    with an NPROC limit has none (it would count against that limit)."""
    sv, _ = pooled
    run(sv.client, "psh", ["true"])
    assert wait_until(lambda: _pooled(sv, "psh") == POOL, 5)
    helpers = _helpers(sv)
    in_r, in_w = os.pipe()
    with sv.client.spawn("psh", ["exec cat"], stdin=in_r, stdout=os.open(os.devnull, os.O_WRONLY)) as child:
        os.close(in_r)
        assert child.pid in helpers
        assert wait_until(lambda: not alive(helpers[child.pid]), 5)
        assert alive(child.pid)
        os.close(in_w)
        assert child.wait(5) == 0
    lab.manifest("limited", command="/bin/true", pool=2, user=65534,
                 sandbox={"profiles": ["system"], "rlimits": {"NPROC": 50}})
    sv.signal(signal.SIGHUP)
    assert wait_until(lambda: "reloaded" in sv.log(), 5)
    assert run(sv.client, "limited").code == 0
    assert wait_until(lambda: _pooled(sv, "limited") == 2, 5)
    assert _helpers(sv) == {}
    assert sv.client.stats()["reaped_orphans"] == 0


def test_check_shows_the_pool(lab):
    import json
    import subprocess
    from svhelpers import PYTHON, REPO
    path = lab.manifest("pooled", command="/bin/true", pool=2, sandbox={"profiles": ["system"],
                                                                        "rlimits": {"NPROC": 50}})
    r = subprocess.run([PYTHON, "-m", "supervisor", "check", "--json", "--manifest", str(path),
                        "--state-root", str(lab.state_root)], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout)["manifests"][0]
    assert entry["pool"] == 2
    assert any("pool's 2 waiting children" in w for w in entry["warnings"]), entry["warnings"]


@pytest.mark.timeout(30)
def test_supervisor_killed_takes_zygote_and_pool(pooled):
    """SIGKILL leaves no handler to run: the zygote and every waiting child
    go by PDEATHSIG."""
    sv, _ = pooled
    run(sv.client, "psh", ["true"])
    assert wait_until(lambda: len(_waiting_children(sv)) == POOL, 5)
    family = [sv.client.stats()["zygote"], *_waiting_children(sv), *_helpers(sv).values()]
    assert len(family) == 1 + 2 * POOL
    sv.proc.kill()
    sv.proc.wait()
    sv.stopped = True
    assert wait_until(lambda: not [p for p in family if alive(p)], 5), [p for p in family if alive(p)]


def test_zygote_holds_nothing_of_the_supervisor(sv):
    """No environment, no fd of the supervisor's but its stdio and its own
    channels, requests and events (and /proc/self/stat, for the thread check)."""
    zygote = sv.client.stats()["zygote"]
    with open(f"/proc/{zygote}/environ", "rb") as f:
        assert f.read() == b""
    fds = {int(fd): os.readlink(f"/proc/{zygote}/fd/{fd}") for fd in os.listdir(f"/proc/{zygote}/fd")}
    ours = {fd: target for fd, target in sv.fds().items() if fd <= 2}
    assert {fd: fds[fd] for fd in (0, 1, 2)} == ours
    assert fds[3].startswith("socket:") and fds[4].startswith("socket:")
    assert sorted(fds) == [0, 1, 2, 3, 4, 5] and fds[5] == f"/proc/{zygote}/stat", fds


# ---- pool: auto, the default ---------------------------------------------

def _auto_lab(lab, **env: str):
    lab.manifest("auto", command="/bin/true", user=65534, pool=None)   # no pool setting
    lab.manifest("rare", command="/bin/true", user=65534, pool=None)
    lab.manifest("nproc", command="/bin/true", user=65534, pool=None, sandbox={"profiles": ["system"],
                                                                   "rlimits": {"NPROC": 50}})
    lab.manifest("off", command="/bin/true", user=65534, pool=0)
    return lab.start(env=env)


@pytest.mark.timeout(30)
def test_auto_pool_after_a_burst_none_after_one_spawn(lab):
    """A manifest without `pool:` keeps a child ready once it is spawned a
    few times in a row (Demand.ENGAGE within WINDOW s), and none after one
    spawn; `pool: 0` never; an NPROC limit never (waiting children would
    count against it). The ready child is a pooled one like any other."""
    from supervisor.zygote.pools import Demand
    sv = _auto_lab(lab)
    assert run(sv.client, "rare").code == 0
    for name in ("auto", "nproc", "off"):
        for _ in range(Demand.ENGAGE + 2):
            assert run(sv.client, name).code == 0
    assert wait_until(lambda: _pooled(sv, "auto") >= 1, 5), sv.client.stats()
    waiting = set(_waiting_children(sv))
    assert waiting and len(waiting) <= Demand.CAP, waiting
    time.sleep(0.5)
    pooled = sv.client.stats()["pooled"]
    assert set(pooled) == {"auto"}, pooled
    assert run(sv.client, "auto").child.pid in waiting   # served by a ready child
    assert wait_until(lambda: _pooled(sv, "auto") >= 1, 5)
    sv.signal(signal.SIGHUP)   # a reload drains it, as any pool
    assert wait_until(lambda: not sv.client.stats()["pooled"] and not _others(sv), 5), _others(sv)
    stats = sv.client.stats()
    assert stats["reaped_orphans"] == 0 and stats["failed"] == 0, stats


@pytest.mark.timeout(30)
def test_auto_pool_drained_after_idle(lab):
    """The ready children of an adaptive pool go after the idle time
    (LANDLOCK_SUPERVISOR_POOL_IDLE, 300 s by default, 1 s here), and its
    demand is counted afresh."""
    from supervisor.zygote.pools import Demand
    sv = _auto_lab(lab, LANDLOCK_SUPERVISOR_POOL_IDLE="1")
    for _ in range(Demand.ENGAGE):
        assert run(sv.client, "auto").code == 0
    assert wait_until(lambda: _pooled(sv, "auto") >= 1, 5), sv.client.stats()
    assert wait_until(lambda: _pooled(sv, "auto") == 0 and not _others(sv), 5), (sv.client.stats(), _others(sv))
    assert run(sv.client, "auto").code == 0
    time.sleep(0.3)
    assert _pooled(sv, "auto") == 0   # one spawn after the drain: none yet
    assert sv.client.stats()["reaped_orphans"] == 0
