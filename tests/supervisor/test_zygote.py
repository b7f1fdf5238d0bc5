"""The zygote package without a supervisor: its wire (every message survives
encode/decode, a child's failure is parsed as it is written), its import
budget (what the zygote holds, every fork copies), and the order of a
child's steps, for a supervisor's child (fresh and pooled) and for
landlock-exec alike (landlock.enter.CONFINE, then LAST)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from landlock import enter
from supervisor.client import interpreter
from supervisor.zygote import boot, child, messages

# What the zygote's entry may load beyond a bare `python -I -S`: C modules,
# what ctypes and collections bring, prctl, landlock.enter, and this
# package's own small modules. Not json, socket.py, selectors, typing,
# dataclasses, enum, marshal's users in the supervisor...
BUDGET_OURS = {"supervisor", "supervisor.zygote", "supervisor.zygote.main", "supervisor.zygote.messages",
               "supervisor.zygote.canary", "supervisor.zygote.child", "landlock", "landlock.enter",
               "landlock.syscalls", "prctl", "_prctl"}
BUDGET_STDLIB = {"__future__", "_collections", "_collections_abc", "_ctypes", "_operator", "_socket", "_stat",
                 "_struct", "array", "collections", "collections.abc", "ctypes", "ctypes._endian", "errno",
                 "genericpath", "importlib", "importlib._bootstrap", "importlib._bootstrap_external", "itertools",
                 "keyword", "operator", "os", "os.path", "posixpath", "reprlib", "resource", "select", "stat",
                 "struct", "types", "warnings"}


def _modules(code: str) -> set[str]:
    out = subprocess.run(interpreter.argv(f"{code}; import sys; print(' '.join(sys.modules))", boot.IMPORTS),
                         capture_output=True, text=True, env={}, check=True)
    return set(out.stdout.split())


def test_zygote_import_budget():
    """As zygote.boot starts it, the zygote's entry loads nothing more."""
    entry = boot.ENTRY.replace("main.main()", "main")   # imported, not run
    loaded = _modules(entry) - _modules("pass")
    ours = {name for name in loaded if name.split(".")[0] in ("supervisor", "landlock", "prctl", "_prctl")}
    assert ours == BUDGET_OURS
    assert loaded - ours <= BUDGET_STDLIB, sorted(loaded - ours - BUDGET_STDLIB)


ENTRY = enter.Entry((1000, 1000, (1000, 27)), (0, 1, 2), True, ((7, 1024, 4096),), 1)


@pytest.mark.parametrize("message", [
    messages.Spawn("/bin/true", "/", 0o22, ENTRY, 1879113728, 120),
    messages.Pool("/bin/true", "/tmp", 0o77, ENTRY, "web", 3, (1879113729, None)),
    messages.Refill("web", 3, None), messages.Drain("web"), messages.Ready(42), messages.Forked(43, None),
    messages.ForkFailed(11, "Resource temporarily unavailable"), messages.Pooled("web", 3, 44, 45, None, "/run/c/0f"),
    messages.PoolFailed("web", 3, 44, 0, "chdir:13:Permission denied", 1879113729), messages.Unused((1, 2)),
    messages.Request(["/bin/echo", "hi"], {"PATH": "/bin"}),
])
def test_every_message_survives_the_wire(message):
    back = messages.decode(messages.encode(message))
    assert type(back) is type(message) and back == message
    if "entry" in message._fields:
        assert type(back.entry) is enter.Entry


def test_what_is_not_a_message():
    import marshal
    for data in (b"", b"junk", marshal.dumps(("Nope", 1)), marshal.dumps(("Forked", 1, 2, 3)), marshal.dumps(3)):
        with pytest.raises(ValueError):
            messages.decode(data)


def test_child_failure_as_written_and_read():
    failure = messages.ChildFailure("chdir", 13, "Permission denied: a:b")
    assert messages.ChildFailure.decode(failure.encode()) == failure
    assert str(failure) == "chdir: Permission denied: a:b"
    assert messages.ChildFailure.decode(b"exec") == ("exec", 0, "")


def test_stages_list_the_shared_steps_in_order():
    shared = [stage for stage, _ in enter.STEPS]
    assert [stage for stage in child.STAGES if stage in shared] == shared
    assert child.STAGES[-1] == "exec" and len(set(child.STAGES)) == len(child.STAGES)


# ---- the order of the steps, both paths ----------------------------------------------------

# Runs the zygote's child function in this (non-forked) process, tracing its
# `stage` as it changes; exec is replaced by printing what was seen.
_CHILD = r"""
import json, os, sys
from landlock import enter
from supervisor.zygote import child, messages

seen = []

def lines(frame, event, arg):
    if event == "line" and frame.f_locals.get("stage") not in (None, *seen[-1:]):
        seen.append(frame.f_locals["stage"])
    return lines

def calls(frame, event, arg):
    return lines if frame.f_code is child._walk.__code__ else None

def execve(program, argv, env):
    os.write(1, json.dumps(seen).encode())
    os._exit(0)
os.execve = execve

entry = enter.Entry(None, None, False, (), 0)
zygote = child.Zygote(os.getppid(), (), -1, False)
stdio = [os.dup(fd) for fd in (0, 1, 2)]
err_w = os.open(os.devnull, os.O_WRONLY)   # a pooled child's "ready" (a pipe's reader would be closed)
sys.settrace(calls)
if sys.argv[1] == "fresh":
    data = messages.encode(messages.Request(["/bin/true"], {}))
    request = os.memfd_create("request")
    os.write(request, data)
    target = messages.Spawn("/bin/true", "/", 0o22, entry, None, len(data))
    c = child._Child(zygote, target, target.entry, None, err_w, -1, stdio, request, len(data), -1, False)
    child._walk(c, child._sequence(request, None))
else:
    import socket
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    errpipe, child_err_w = os.pipe()
    messages.send(ours, messages.Request(["/bin/true"], {}), [*stdio, child_err_w])
    target = messages.Pool("/bin/true", "/", 0o22, entry, "p", 1, (None,))
    gid = None if sys.argv[1] == "pooled" else os.getgid()   # (the Entry has no credentials to take it)
    c = child._Child(zygote, target, target.entry, gid, err_w, -1, None, -1, 0, theirs.fileno(), False)
    child._walk(c, child._sequence(-1, gid))
"""

# landlock-exec as its command line runs it, recording the calls of the
# steps; exec replaced as above.
_EXEC = r"""
import json, os, sys
from landlock import cli, enforce, enter

NAMES = {"detach_terminal", "join_session_keyring", "drop_privileges", "restrict", "set_rlimits"}
seen = []

def calls(frame, event, arg):
    if event == "call" and frame.f_code.co_name in NAMES and frame.f_globals["__name__"] in (
            "landlock.enter", "landlock.enforce"):
        seen.append(frame.f_code.co_name)

def execve(program, argv, env):
    sys.setprofile(None)
    os.write(1, json.dumps(seen + ["exec"]).encode())
    os._exit(0)
os.execve = execve
sys.setprofile(calls)
cli.main(["--ro", "/", "--best-effort", "--rlimit", "NOFILE=256", "--", "/bin/true"])
"""


def _steps(script: str, *args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _stages(sequence: child.Steps) -> list[str]:
    return [stage for stage, _ in sequence]


# The orders, written out here and not read from child.py: a reorder there
# (close_fds after confine, say: a security bug) must fail a test. The
# stage names are on the wire too (`spawn_failed` carries `stage`).
FRESH = ["signals", "request", "stdio", "close_fds", "setsid", "keyring", "privileges", "confine", "chdir",
         "pdeathsig", "rlimits", "exec"]
POOLED = ["signals", "close_fds", "helper", "setsid", "keyring", "privileges", "confine", "chdir", "pdeathsig",
          "wait", "stdio", "rlimits", "exec"]
POOLED_SHARED_GID = ["signals", "close_fds", "helper", "setsid", "keyring", "privileges", "confine", "chdir",
                     "pdeathsig", "wait", "tampered", "stdio", "exec"]
STAGES = ("signals", "request", "stdio", "close_fds", "helper", "setsid", "keyring", "privileges", "confine",
          "chdir", "pdeathsig", "wait", "tampered", "rlimits", "exec")


def test_the_sequences_are_the_orders_written_here():
    assert (_stages(child.FRESH), _stages(child.POOLED), _stages(child.POOLED_SHARED_GID), child.STAGES) == (
        FRESH, POOLED, POOLED_SHARED_GID, STAGES)


def test_a_fresh_childs_steps_in_order():
    assert _steps(_CHILD, "fresh") == FRESH


def test_a_pooled_childs_steps_in_order():
    """Without a session gid of its own: it compares its limits at
    hand-over, and sets them under that stage (child.POOLED_SHARED_GID)."""
    assert _steps(_CHILD, "pooled") == POOLED_SHARED_GID


def test_a_pooled_child_with_a_session_gid_sets_its_rlimits_after_stdio():
    assert _steps(_CHILD, "pooled-gid") == POOLED


def test_landlock_exec_takes_the_same_steps_rlimits_last():
    assert _steps(_EXEC) == ["detach_terminal", "join_session_keyring", "drop_privileges", "restrict",
                             "set_rlimits", "exec"]
