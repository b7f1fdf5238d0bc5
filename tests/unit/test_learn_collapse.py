"""learn's collapse (accesses -> grants) and exclusions, as tables: no system call."""
from __future__ import annotations

import pytest

from supervisor.learn.collapse import Layout, Proposal, collapse
from supervisor.learn.exclude import DIR, LINK, OTHER, Excluded, covering_set, refusal
from supervisor.learn.trace import Access

HOME = "/home/ann"
LAYOUT = Layout(cwd="/srv/state", state_dir="/srv/state", area="/srv", scratch="/var/tmp/learn",
                home=HOME, writable=("/data/out",), homes=(HOME, "/home/bob", "/root"),
                excluded=(Excluded(f"{HOME}/.ssh", "a secret location"), Excluded("/home/bob", "another user's home"),
                          Excluded("/etc/shadow", "a secret location")),
                chosen=("system", "node"),
                fragments={"system": {"read_only": ["/usr/lib"], "read_write_noexec": ["/dev/null"]},
                           "node": {"read_only": ["/usr/bin/node"]},
                           "dns-tls": {"read_only_noexec": ["/etc/resolv.conf", "/etc/ssl/certs"]}},
                package_roots=("/opt/venv",), ports=())


def grants(p: Proposal) -> set[tuple[str, str]]:
    return {(g.cls, g.path) for g in p.grants}


# (accesses, grants expected, refused keys, writes proposed, profiles)
TABLE = [
    ("the exact executable", [Access("exec", "/usr/local/bin/tool")], {("read_only", "/usr/local/bin/tool")}, set()),
    ("covered by a chosen profile", [Access("read", "/usr/lib/x/libz.so"), Access("exec", "/usr/bin/node")],
     set(), set()),
    ("a node_modules tree", [Access("read", "/app/node_modules/a/index.js"),
                             Access("read", "/app/node_modules/@s/b/package.json")],
     {("read_only_noexec", "/app/node_modules")}, set()),
    ("executing in node_modules makes the tree read_only", [Access("read", "/app/node_modules/a/x.js"),
                                                             Access("exec", "/app/node_modules/.bin/a")],
     {("read_only", "/app/node_modules")}, set()),
    ("/etc file by file", [Access("read", "/etc/hosts"), Access("read", "/etc/host.conf")],
     {("read_only_noexec", "/etc/hosts"), ("read_only_noexec", "/etc/host.conf")}, set()),
    ("/proc/<pid> is /proc", [Access("read", "/proc/123/maps"), Access("read", "/proc/meminfo")],
     {("read_only_noexec", "/proc")}, set()),
    ("/sys four levels", [Access("read", "/sys/fs/cgroup/x/memory.max")],
     {("read_only_noexec", "/sys/fs/cgroup/x")}, set()),
    ("a venv", [Access("read", "/opt/venv/lib/python3.11/site-packages/m/__init__.py"),
                Access("exec", "/opt/venv/bin/python3")], {("read_only", "/opt/venv")}, set()),
    ("/usr/share/<pkg>", [Access("read", "/usr/share/zoneinfo/Etc/UTC")],
     {("read_only_noexec", "/usr/share/zoneinfo")}, set()),
    ("a tool's home directory", [Access("read", f"{HOME}/.cache/tool/a/b")],
     {("read_only_noexec", f"{HOME}/.cache/tool")}, set()),
    ("a file in the home: exact, never the home", [Access("read", f"{HOME}/.gitconfig")],
     {("read_only_noexec", f"{HOME}/.gitconfig")}, set()),
    ("a secret is refused", [Access("read", f"{HOME}/.ssh/id_ed25519")], set(), {f"read {HOME}/.ssh/id_ed25519"}),
    ("a .env file anywhere is refused", [Access("read", "/work/p/.env")], set(), {"read /work/p/.env"}),
    ("another user's home is refused", [Access("read", "/home/bob/notes")], set(), {"read /home/bob/notes"}),
    ("never /", [Access("list", "/")], set(), {"list /"}),
    ("never a whole home", [Access("list", HOME)], set(), {f"list {HOME}"}),
    ("the state directory is covered", [Access("write", "/srv/state/db"), Access("read", "/srv/npm-cache/x")],
     set(), set()),
    ("running from the state directory makes it execute", [Access("exec", "/srv/state/bin/tool")],
     {("read_write", "${STATE_DIR}")}, set()),
    ("a --write path", [Access("create", "/data/out/sub"), Access("read", "/data/out/sub/x")],
     {("read_write_noexec", "/data/out")}, set()),
    ("a --write path only read is still granted as given", [Access("read", "/data/out/x")],
     {("read_write_noexec", "/data/out")}, set()),
    ("a file made in /tmp itself: never /tmp", [Access("create", "/tmp")], set(), set()),
    ("a directory of its own in /tmp", [Access("create", "/tmp/app"), Access("write", "/tmp/app/x")],
     {("read_write_noexec", "/tmp/app")}, set()),
    ("a temporary name, written then read", [Access("write", "/var/tmp/ll8wq3na"),
                                              Access("read", "/var/tmp/ll8wq3na")], set(), set()),
    ("a temporary directory's files", [Access("create", "/tmp/tmpk2_x9abc"), Access("read", "/tmp/tmpk2_x9abc/f")],
     set(), set()),
    ("a made-up name only read is a directory like any", [Access("read", "/tmp/llsv-k2x9abcd/srv/x.py")],
     {("read_only_noexec", "/tmp/llsv-k2x9abcd/srv")}, set()),
    ("learn's own files", [Access("read", "/var/tmp/learn/trace-1/t.1")], set(), set()),
    ("a name a manifest writes exactly", [Access("exec", "/opt/x\n    - \"/home\"\n#\u2028\x1b")],
     {("read_only", "/opt/x\n    - \"/home\"\n#\u2028\x1b")}, set()),
    ("a name that is no UTF-8 is refused", [Access("exec", "/opt/bad\udcff")], set(), {"exec /opt/bad\udcff"}),
    ("its directory is granted all the same", [Access("read", "/opt/pkg/bad\udcff")],
     {("read_only_noexec", "/opt/pkg")}, set()),
    ("a socket named so is refused", [Access("connect_unix", "/run/bad\udcff")], set(), {"connect_unix /run/bad\udcff"}),
]


@pytest.mark.parametrize("what,accesses,expected,refused", TABLE, ids=[row[0] for row in TABLE])
def test_collapse(what: str, accesses: list[Access], expected: set[tuple[str, str]], refused: set[str]) -> None:
    p = collapse(accesses, LAYOUT)
    assert grants(p) == expected
    assert set(p.refused) == refused
    assert not p.writes


def test_a_write_outside_what_learning_allowed_is_a_proposal_not_a_grant() -> None:
    p = collapse([Access("write", "/etc/app.conf", denied=True, evidence="openat by x")], LAYOUT)
    assert not p.grants and list(p.writes) == ["/etc/app.conf"]


def test_an_optional_profile_replaces_its_paths() -> None:
    p = collapse([Access("read", "/etc/resolv.conf"), Access("read", "/etc/ssl/certs/a.pem")], LAYOUT)
    assert not p.grants and p.profiles == ["system", "node", "dns-tls"]


def test_ports_and_broad_flags() -> None:
    p = collapse([Access("connect_tcp", port=443), Access("bind_tcp", port=8080),
                  Access("read", "/proc/self/stat")], LAYOUT)
    assert list(p.connect_tcp) == [443] and list(p.bind_tcp) == [8080]
    assert p.grants[0].flag.startswith("BROAD")


def test_a_collapse_that_would_hold_a_secret_falls_back_to_the_exact_path() -> None:
    layout = Layout(cwd="/srv/state", state_dir="/srv/state", area="/srv", scratch="/x",
                    excluded=(Excluded("/data/keys", "a secret location"),))
    p = collapse([Access("read", "/data/file")], layout)
    assert grants(p) == {("read_only_noexec", "/data/file")}


TREE = {"/": [("etc", DIR), ("home", DIR), ("usr", DIR), ("bin", LINK), ("vmlinuz", OTHER)],
        "/home": [("ann", DIR), ("bob", DIR)],
        "/home/ann": [(".ssh", DIR), (".cache", DIR), ("notes", OTHER)],
        "/etc": [("shadow", OTHER), ("hosts", OTHER), ("ssl", DIR)]}


def test_covering_set_grants_everything_but_the_excluded_paths() -> None:
    got = covering_set(["/home/ann/.ssh", "/home/bob", "/etc/shadow"], lambda d: TREE.get(d, []))
    assert got == ["/etc/hosts", "/etc/ssl", "/home/ann/.cache", "/home/ann/notes", "/usr", "/vmlinuz"]


def test_covering_set_of_nothing_is_every_top_level_entry_and_of_root_nothing() -> None:
    assert covering_set([], lambda d: TREE.get(d, [])) == ["/etc", "/home", "/usr", "/vmlinuz"]
    assert covering_set(["/"], lambda d: TREE.get(d, [])) == []


def test_covering_set_refuses_a_relative_path() -> None:
    """Its ancestors never reach / (a relative --state-root once looped for ever)."""
    with pytest.raises(ValueError, match="must be absolute: state"):
        covering_set(["/etc/shadow", "state"], lambda d: TREE.get(d, []))


def test_refusal() -> None:
    ex = [Excluded("/home/ann/.aws", "a secret location")]
    assert refusal("/home/ann/.aws/credentials", ex) == "a secret location"
    assert refusal("/home/ann/.awsome", ex) is None
    assert refusal("/p/.env.local", ex) == "a .env file"
    assert refusal("/p/env", ex) is None


def test_reads_its_profile_does_without_are_left_out() -> None:
    from dataclasses import replace
    layout = replace(LAYOUT, quiet=("/proc", "/sys/fs/cgroup"))
    p = collapse([Access("read", "/proc/12/cgroup"), Access("read", "/sys/fs/cgroup/memory/x"),
                  Access("read", "/sys/devices/system/cpu/online")], layout)
    assert set(p.optional) == {"/proc", "/sys/fs/cgroup"}
    assert grants(p) == {("read_only_noexec", "/sys/devices/system/cpu")}


def test_a_home_under_tmp_keeps_tmp_writes_exact_and_a_write_file_needs_no_create() -> None:
    from dataclasses import replace
    layout = replace(LAYOUT, homes=(*LAYOUT.homes, "/tmp/h"), writable=("/tmp/h/kg/m.jsonl",),
                     write_files=("/tmp/h/kg/m.jsonl",))
    p = collapse([Access("create", "/tmp/h/kg"), Access("write", "/tmp/h/kg/m.jsonl"),
                  Access("create", "/tmp/other")], layout)
    assert grants(p) == {("read_write_noexec", "/tmp/h/kg/m.jsonl"), ("read_write_noexec", "/tmp/other")}


def test_a_write_path_inside_an_excluded_home_is_granted_as_given() -> None:
    from dataclasses import replace
    layout = replace(LAYOUT, writable=("/home/bob/shared",))
    p = collapse([Access("read", "/home/bob/shared/a"), Access("create", "/home/bob/shared"),
                  Access("read", "/home/bob/notes")], layout)
    assert grants(p) == {("read_write_noexec", "/home/bob/shared")}
    assert set(p.refused) == {"read /home/bob/notes"}


@pytest.mark.parametrize("path,ok", [
    ("/usr/lib/x", True), ("/a b/#c: d/- e/{f}/*g/&h/'i'/\"j\"/\\k", True),
    ("/x\ny", True), ("/x\ry", True), ("/x\u0085y", True), ("/x\u2028y\u2029", True), ("/x\x1b[2Jy", True),
    ("/x\ty\x00", True), ("/caf\u00e9/\U0001f600", True), ("/x\ufeff\ufffe", True),
    ("/bad\udcff", False), ("/bad\ud800", False),
    # The loader would expand these: another path, or a manifest that does not load.
    ("/tmp/${HOME}", False), ("/x/${STATE_DIR}/y", False), ("/tmp/$HOME", True), ("/tmp/${}", True),
])
def test_a_path_is_written_only_exactly(path: str, ok: bool) -> None:
    """manifests/scalar.writable: the JSON-quoted scalar parses back to exactly the path."""
    from supervisor.manifests.scalar import q, writable
    from supervisor.manifests.document import parse
    assert writable(path) == ok
    if ok:
        assert parse("t", f"p: {q(path)}".encode()) == {"p": path}


@pytest.mark.parametrize("access,comment", [
    (Access("connect_tcp", port=443, evidence="connect by node", program="node", address="140.82.1.3"),
     "port 443 to every address (a Landlock port rule names no address): node connected to 140.82.1.3 port 443"),
    (Access("bind_tcp", port=8080, evidence="bind by python3", program="python3", address="0.0.0.0"),
     "port 8080 on every address (a Landlock port rule names no address): python3 bound 0.0.0.0 port 8080"),
])
def test_a_port_grant_says_what_it_reaches_and_who_asked(access: Access, comment: str) -> None:
    p = collapse([access], LAYOUT)
    assert next(iter({**p.connect_tcp, **p.bind_tcp}.values())).startswith(comment)


@pytest.mark.parametrize("name,made", [
    ("ll8wq3na", True), ("p_368h8l", True),             # Python's temp-directory probe
    ("tmpk2_x9abc", True), ("tmp0s1chent", True),       # mkstemp, mkdtemp
    ("learn-2a_kx9pz", True), ("npm-aB3dE9", True),     # mkdtemp with a prefix: Python's, node's
    ("server.12345.sock", True), ("x-368", True),       # pids
    ("3f9a0c1be2d4", True),                             # a hex token
    ("myapp", False), ("database", False), ("node-v20", False), ("python3.11", False), ("sessions", False),
    ("out-abcdefgh", False),
])
def test_a_made_up_name(name: str, made: bool) -> None:
    from supervisor.learn.temporary import made_up
    assert made_up(name) is made


def test_a_temporary_name_is_listed_never_granted_nor_proposed() -> None:
    p = collapse([Access("create", "/var/tmp", denied=True), Access("write", "/var/tmp/ll8wq3na", denied=True),
                  Access("read", "/var/tmp/ll8wq3na", denied=True), Access("create", "/tmp")], LAYOUT)
    assert not p.grants and not p.writes and set(p.temporary) == {"/var/tmp", "/var/tmp/ll8wq3na", "/tmp"}


@pytest.mark.parametrize("path,word", [
    ("/", "a system directory"), ("/usr/bin", "a system directory"), ("/etc", "a system directory"),
    ("/opt", "a system directory"), ("/usr/share", "a system directory"), ("/var/lib", "a system directory"),
    ("/proc", "every process's /proc files"), ("/proc/sys/kernel", "every process's /proc files"),
    ("/sys/fs/cgroup/x", "the kernel's state"), ("/tmp", "shared with every user"),
    ("/var/tmp", "shared with every user"), ("/dev/shm", "shared with every user"),
    ("/usr/bin/ldd", ""), ("/etc/hosts", ""), ("/usr/share/zoneinfo", ""), ("/opt/venv", ""), ("/tmp/app", ""),
    ("/app/node_modules", ""), ("${STATE_DIR}", ""), (f"{HOME}/.cache/tool", ""),
])
def test_broad_is_one_rule(path: str, word: str) -> None:
    from supervisor.learn.collapse import broad
    flag = broad(path)
    assert (word in flag and flag.startswith("BROAD: ")) if word else flag == ""


@pytest.mark.parametrize("access,granted", [
    (Access("read", "/usr/bin/ldd"), ("read_only_noexec", "/usr/bin/ldd")),     # node read it once
    (Access("read", "/usr/share/dict-words"), ("read_only_noexec", "/usr/share/dict-words")),
    (Access("read", "/var/lib/thing.db"), ("read_only_noexec", "/var/lib/thing.db")),
    (Access("read", "/mnt/data/a.csv"), ("read_only_noexec", "/mnt/data")),
    (Access("list", "/usr/bin"), ("read_only_noexec", "/usr/bin")),               # listed whole: flagged
])
def test_a_system_directory_is_never_granted_for_one_file_it_read(access: Access, granted: tuple[str, str]) -> None:
    p = collapse([access], LAYOUT)
    assert grants(p) == {granted}
    assert all(bool(g.flag) == (g.path in ("/usr/bin",)) for g in p.grants)


# The texts a person reads in the manifest's comments and the summary:
# sentences naming programs, never task ids.
@pytest.mark.parametrize("access,text", [
    (Access("read", "/etc/hosts", evidence="openat", program="node"), "node read /etc/hosts (openat)"),
    (Access("exec", "/usr/bin/git", denied=True, evidence="execve, round 2", program="node"),
     "node ran /usr/bin/git (execve, round 2, denied)"),
    (Access("exec", "/usr/lib64/ld-linux-x86-64.so.2", evidence="the ELF interpreter of /usr/bin/node",
            program="npm"), "npm ran /usr/lib64/ld-linux-x86-64.so.2 (the ELF interpreter of /usr/bin/node)"),
    (Access("create", "/var/tmp", denied=True, evidence="an audit record", program="python3"),
     "python3 made an entry in /var/tmp (an audit record, denied)"),
    (Access("connect_tcp", port=443, evidence="connect", program="npm"), "npm connected to port 443 (connect)"),
    (Access("read", "/x"), "the server read /x"),
])
def test_an_access_reads_as_a_sentence(access: Access, text: str) -> None:
    from supervisor.learn.collapse import describe
    assert describe(access) == text


MINE = "/work/people/me"   # the invoking user's home: HOME, which passwd does not list
OWN = Layout(cwd="/srv/state", state_dir="/srv/state", area="/srv", scratch="/var/tmp/learn", homes=(MINE,),
             excluded=(Excluded(MINE, "the home of the user running learn"),))


@pytest.mark.parametrize("access,comment", [
    (Access("read", "/work/people/notes.txt", evidence="openat", program="python3"),
     "the path itself: /work/people, the directory of a file it read, would be a directory holding "
     "/work/people/me, the home of the user running learn: python3 read /work/people/notes.txt (openat)"),
    (Access("read", "/usr/bin/ldd", evidence="openat", program="node"),
     "a file of a system directory: the file itself: node read /usr/bin/ldd (openat)"),
    (Access("read", "/proc/12/status", evidence="openat", program="node"),
     "/proc/<pid> binds one process: all of /proc; BROAD: every process's /proc files"),
])
def test_a_grants_comment_is_a_sentence(access: Access, comment: str) -> None:
    from supervisor.learn import render
    text = "\n".join(render.sandbox(collapse([access], OWN)))
    assert f"# {comment}" in text and "task" not in text and "another user" not in text


def test_the_invoking_users_home_is_theirs(tmp_path, monkeypatch) -> None:
    from supervisor.learn.exclude import excluded
    monkeypatch.setenv("HOME", str(tmp_path))
    whys = {e.path: e.why for e in excluded(None, [], [])}
    assert whys[str(tmp_path)] == "the home of the user running learn"


@pytest.mark.parametrize("method,reply,ok,detail", [
    ("tools/call", {"result": {"isError": True, "content": 5}}, False, "(no message)"),
    ("tools/call", {"result": {"isError": True, "content": [{"text": "no"}, 7]}}, False, "no"),
    ("tools/list", {"result": {"tools": 7}}, True, "0 tools"),
    ("tools/list", {"result": {"tools": [{}, {}]}}, True, "2 tools"),
    ("ping", {"error": {"code": 1, "message": "m" * 100000}}, False, "error 1: " + "m" * 291),
])
def test_a_reply_of_any_shape_is_judged_never_a_traceback(method: str, reply: dict, ok: bool, detail: str) -> None:
    """session.outcome: what the server sent is the server's, any shape; its message is bounded."""
    from supervisor.learn.session import outcome
    got = outcome(method, "t", reply)
    assert (got.ok, got.detail) == (ok, detail)
