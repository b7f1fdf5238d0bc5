"""Spec validation, requirement levels, the Report, the empty Spec, and
the single-thread rule of apply()."""
from __future__ import annotations

import errno
import json
import os
import socket
import threading

import pytest

import landlock
from landlock import LandlockUnavailable, NotSingleThreaded, Report, Spec, SpecError, rights

KERNEL_ABI = landlock.abi_version()


@pytest.mark.parametrize("kwargs,field", [
    ({"bind_tcp": (70000,)}, "bind_tcp"),
    ({"connect_tcp": ("80",)}, "connect_tcp"),
    ({"connect_tcp": (-1,)}, "connect_tcp"),
    ({"read_only": ("usr",)}, "read_only"),
    ({"read_write_noexec": ("./tmp",)}, "read_write_noexec"),
    ({"read_only_noexec": "/usr"}, "read_only_noexec"),
    ({"rlimits": {"NOFILES": 1}}, "rlimits"),
    ({"rlimits": {"NOFILE": (10, 5)}}, "rlimits"),
    ({"rlimits": {"NOFILE": "many"}}, "rlimits"),
    ({"require": ("teleport",)}, "require"),
    ({"scopes": ("everything",)}, "scopes"),
    ({"log": ("loud",)}, "log"),
    ({"max_abi": -1}, "max_abi"),
    ({"best_effort": "yes"}, "best_effort"),
    ({"unrestricted_filesystem": True, "require": ("filesystem",)}, "require"),
])
def test_validation_names_the_field(kwargs, field):
    with pytest.raises(SpecError, match=f"^{field}:"):
        Spec(**kwargs)


def test_rlimit_names_are_canonical():
    spec = Spec(rlimits={"rlimit_ofile": 64, "cpu": 5})
    assert [(r.name, r.soft) for r in spec.rlimits] == [("CPU", 5), ("NOFILE", 64)]
    assert Spec(rlimits={"NOFILE": 64, "CPU": 5}) == Spec(rlimits={"CPU": 5, "NOFILE": 64})
    with pytest.raises(SpecError, match="^rlimits: NOFILE given twice"):
        Spec(rlimits={"NOFILE": 64, "OFILE": 128})


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(SpecError, match="read_olny"):
        Spec.from_dict({"read_olny": ["/usr"]})


def test_from_json_rejects_bad_json():
    with pytest.raises(SpecError, match="JSON"):
        Spec.from_json("{")


def test_json_round_trip():
    spec = Spec(read_only=("/usr",), read_write_noexec=("/tmp",), connect_tcp=(443,),
                rlimits={"NOFILE": 64, "CPU": (10, 20), "AS": -1}, require=("network",),
                scopes=("signal",), user=65534, max_abi=4)
    assert Spec.from_json(spec.to_json()) == spec
    assert spec.require == frozenset({"tcp"})  # aliases expand
    assert [r.name for r in spec.rlimits][-1] == "AS"  # memory limits last


@pytest.mark.enforcement
def test_report_is_json_and_round_trips(run_confined, layout):
    report = run_confined(Spec(read_only=(str(layout.d), str(layout.root / "missing")),
                               rlimits={"NOFILE": 64})).report
    data = json.loads(json.dumps(report.to_dict()))
    assert Report.from_dict(data) == report
    assert data["abi"] == landlock.abi_version() and data["enforced"] is True
    assert data["skipped_paths"] == [str(layout.root / "missing")]


# --- requirement levels ----------------------------------------------------

def test_no_landlock_fails_closed_by_default(run_confined):
    result = run_confined(Spec(read_only=("/usr",), max_abi=0), lambda: "ran")
    assert isinstance(result.error, LandlockUnavailable)
    assert "filesystem" in str(result.error)


def test_no_landlock_best_effort_runs_unconfined_and_says_so(run_confined):
    result = run_confined(Spec(max_abi=0, best_effort=True), lambda: len(os.listdir("/")))
    assert result.unwrap() > 0  # really unconfined: the empty spec would deny this
    report = result.report
    assert report.abi == -1 and not report.enforced and report.tid == 0
    assert "UNCONFINED" in report.note
    assert report.no_new_privs and report.capabilities_dropped  # the rest still happens


def test_required_feature_missing_is_refused(run_confined):
    result = run_confined(Spec(require=("tcp",), max_abi=3), lambda: "ran")
    assert isinstance(result.error, LandlockUnavailable)
    assert "tcp" in str(result.error)


@pytest.mark.enforcement
def test_unrequired_feature_missing_is_downgraded(run_confined, tcp_listener):
    def connect():
        with socket.socket() as s:
            s.connect(("127.0.0.1", tcp_listener))
        return os.listdir("/")

    abi = min(3, KERNEL_ABI)
    result = run_confined(Spec(max_abi=abi), connect)
    assert isinstance(result.error, PermissionError)  # the filesystem is still confined...
    assert result.error.filename == "/"                # ...after the unrestricted connect
    assert "tcp" in result.report.downgraded and result.report.abi == abi


@pytest.mark.enforcement
def test_report_tells_what_each_abi_handles(run_confined, abi):
    report = run_confined(Spec(max_abi=abi)).report
    wanted = ["filesystem", "refer", "truncate", "ioctl_dev", "unix", "tcp", "udp",
              "scope_abstract_unix_socket", "scope_signal"]
    by_name = rights.FEATURE_BY_NAME
    assert report.abi == abi and report.enforced
    assert sorted(report.features) == sorted(f for f in wanted if by_name[f].abi <= abi)
    assert sorted(report.downgraded) == sorted(f for f in wanted if by_name[f].abi > abi)
    assert ("truncate" in report.downgraded) == (abi < 3)
    assert ("truncate" in report.handled_fs) == (abi >= 3)
    assert report.handled_net == (["bind_tcp", "connect_tcp"] if abi >= 4 else []) + (
        ["bind_udp", "connect_send_udp"] if abi >= 10 else [])
    assert report.scoped == (["abstract_unix_socket", "signal"] if abi >= 6 else [])
    assert "make_char" in report.handled_fs and report.unix_connect_unrestricted == (abi < 9)


# --- the empty Spec ---------------------------------------------------------

@pytest.mark.enforcement
@pytest.mark.parametrize("op", [
    lambda lay: os.listdir("/"),
    lambda lay: open("/etc/passwd", "rb").close(),
    lambda lay: os.open(lay.d, os.O_RDONLY | os.O_DIRECTORY),
    lambda lay: os.mkdir(lay.d / "new"),
    lambda lay: os.unlink(lay.d / "file"),
    lambda lay: os.posix_spawn("/bin/true", ["/bin/true"], {}),
], ids=["list-root", "read-file", "open-dir", "mkdir", "unlink", "exec"])
def test_empty_spec_denies_everything(confined_errno, layout, op):
    assert confined_errno(Spec(), lambda: op(layout)) == errno.EACCES


@pytest.mark.enforcement
def test_empty_spec_denies_tcp(confined_errno, tcp_listener):
    def connect():
        with socket.socket() as s:
            s.connect(("127.0.0.1", tcp_listener))
    # Before ABI 4 TCP is not handled: the Report says it was downgraded.
    assert confined_errno(Spec(), connect) == (errno.EACCES if KERNEL_ABI >= 4 else 0)


# --- one thread only ----------------------------------------------------------

def _start_thread():
    threading.Thread(target=threading.Event().wait, daemon=True).start()


def test_apply_refuses_a_second_thread(run_confined):
    result = run_confined(Spec(), lambda: "ran", before=_start_thread)
    assert isinstance(result.error, NotSingleThreaded)
    assert "2 threads" in str(result.error)


def test_exec_confined_exits_4_with_a_second_thread(run_confined):
    def run():
        landlock.exec_confined(Spec(read_only=("/usr",)), ["/bin/true"], {}, new_session=False)

    result = run_confined(None, run, before=_start_thread)
    assert os.waitstatus_to_exitcode(result.status) == landlock.EXIT_THREADS
