"""learn's strace parsing, on lines strace 6.1 printed on this machine."""
from __future__ import annotations

import pytest

from supervisor.learn import trace
from supervisor.learn.trace import Access

CWD = "/srv/state"
LINES = [
    ('execve("/usr/bin/python3", ["/usr/bin/python3", "-c", "x"], 0x7ffd /* 35 vars */) = 0',
     [Access("exec", "/usr/bin/python3", evidence="execve", program="python3")]),
    ('openat(AT_FDCWD</tmp/lx>, "/lib/x86_64-linux-gnu/libz.so.1", O_RDONLY|O_CLOEXEC) = '
     '3</usr/lib/x86_64-linux-gnu/libz.so.1.2.13>',
     [Access("read", "/usr/lib/x86_64-linux-gnu/libz.so.1.2.13", evidence="openat", program="python3")]),
    ('openat(AT_FDCWD</tmp/lx>, "/etc", O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_DIRECTORY) = 3</etc>',
     [Access("list", "/etc", evidence="openat", program="python3")]),
    ('openat(AT_FDCWD</tmp/lx>, "/etc", O_RDONLY|O_CLOEXEC|O_PATH) = 6</etc>', []),
    ('openat(AT_FDCWD</tmp/lx2>, "/dev/null", O_RDONLY|O_CLOEXEC) = 7</dev/null<char 1:3>>',
     [Access("read", "/dev/null", evidence="openat", program="python3")]),
    ('openat(AT_FDCWD</tmp/lx>, "/tmp/lx/a b<c>\\303\\251\\n", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0666) = '
     '5</tmp/lx/a b\\74c\\76\\303\\251\\n>',
     [Access("create", "/tmp/lx", evidence="openat", program="python3"),
      Access("write", "/tmp/lx/a b<c>\u00e9\n", evidence="openat", program="python3")]),
    ('openat(AT_FDCWD</srv/state>, "/etc/x", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0666) = -1 EACCES '
     '(Permission denied)',
     [Access("create", "/etc", denied=True, evidence="openat", program="python3"),
      Access("write", "/etc/x", denied=True, evidence="openat", program="python3")]),
    ('openat(AT_FDCWD</srv/state>, "/nope", O_RDONLY) = -1 ENOENT (No such file or directory)', []),
    ('newfstatat(3</etc/hostname>, "", {st_mode=S_IFREG|0755, st_size=3, ...}, AT_EMPTY_PATH) = 0', []),
    ('mkdir("/tmp/lx/d", 0777)                = 0', [Access("create", "/tmp/lx", evidence="mkdir", program="python3")]),
    ('rename("/tmp/lx/d", "/var/e")        = 0',
     [Access("remove", "/tmp/lx", evidence="rename", program="python3"),
      Access("create", "/var", evidence="rename", program="python3")]),
    ('symlink("tr", "ln")                     = 0', [Access("create", CWD, evidence="symlink", program="python3")]),
    ('ftruncate(5</tmp/lx2/tr>, 0)            = 0',
     [Access("write", "/tmp/lx2/tr", evidence="ftruncate", program="python3")]),
    ('connect(3<TCP:[3533493]>, {sa_family=AF_INET, sin_port=htons(9), sin_addr=inet_addr("127.0.0.1")}, 16) = '
     '-1 ECONNREFUSED (Connection refused)',
     [Access("connect_tcp", port=9, evidence="connect", program="python3", address="127.0.0.1")]),
    ('connect(3<TCPv6:[3580516]>, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), '
     'inet_pton(AF_INET6, "::1", &sin6_addr), sin6_scope_id=0}, 28) = -1 EACCES (Permission denied)',
     [Access("connect_tcp", port=443, denied=True, evidence="connect", program="python3", address="::1")]),
    ('bind(4<TCP:[3580519]>, {sa_family=AF_INET, sin_port=htons(8080), sin_addr=inet_addr("127.0.0.1")}, 16) = 0',
     [Access("bind_tcp", port=8080, evidence="bind", program="python3", address="127.0.0.1")]),
    ('connect(5<UDP:[1]>, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("1.1.1.1")}, 16) = 0', []),
    ('connect(4<UNIX-STREAM:[3533496]>, {sa_family=AF_UNIX, sun_path="/run/x.sock"}, 110) = 0',
     [Access("connect_unix", "/run/x.sock", evidence="connect", program="python3")]),
    ('connect(4<UNIX-STREAM:[1]>, {sa_family=AF_UNIX, sun_path=@"abstract"}, 110) = 0', []),
    ('exit_group(1)                           = ?', []),
    ('clone3({flags=CLONE_VM|CLONE_VFORK, exit_signal=SIGCHLD, stack=0x7f, stack_size=0x9000}, 88) = 18348', []),
    ('clone(child_stack=NULL) =', []),   # forged (the server writes its trace directory): no traceback
]


@pytest.mark.parametrize("line,expected", LINES, ids=[line[:40] for line, _ in LINES])
def test_a_line(line: str, expected: list[Access]) -> None:
    task = trace.Task(CWD, "python3")
    call = trace.parse_line(line)
    assert (list(task.accesses(call)) if call else []) == expected


def test_relative_paths_follow_the_cwd_strace_shows_and_chdir() -> None:
    lines = ['openat(AT_FDCWD</tmp/lx>, "x", O_RDONLY) = 3</tmp/lx/x>',
             'unlink("e/../y") = 0',
             'chdir("/var") = 0',
             'rmdir("lx/e") = 0']
    got, _ = trace.read_task(lines, CWD, "python3")
    assert [(a.kind, a.path) for a in got] == [("read", "/tmp/lx/x"), ("remove", "/tmp/lx"), ("remove", "/var/lx")]
    assert (got[0].evidence, got[0].program) == ("openat", "python3")


def test_a_task_that_never_ran_a_program_is_named_by_its_parents_never_by_its_id() -> None:
    """A thread or a fork is the program that cloned it; an execve names the
    program that ran the new one."""
    files = [
        ("100", ['execve("/usr/bin/node", ["node"], 0x7ffd /* 3 vars */) = 0',
                 'clone3({flags=CLONE_VM|CLONE_THREAD, exit_signal=0}, 88) = 101',
                 'vfork() = 102']),
        ("101", ['openat(AT_FDCWD</srv>, "/etc/hosts", O_RDONLY) = 3</etc/hosts>',
                 'clone(child_stack=NULL, flags=CLONE_CHILD_SETTID|SIGCHLD) = 103']),
        ("102", ['execve("/bin/sh", ["sh"], 0x7 /* 3 vars */) = 0',
                 'openat(AT_FDCWD</srv>, "/etc/passwd", O_RDONLY) = 3</etc/passwd>']),
        ("103", ['openat(AT_FDCWD</srv>, "/etc/group", O_RDONLY) = 3</etc/group>']),
        ("104", ['openat(AT_FDCWD</srv>, "/etc/orphan", O_RDONLY) = 3</etc/orphan>']),
    ]
    got = [(a.path, a.program) for a in trace.read_tasks(files, "/srv")]
    assert got == [("/usr/bin/node", "the server"), ("/etc/hosts", "node"), ("/bin/sh", "node"),
                   ("/etc/passwd", "sh"), ("/etc/group", "node"), ("/etc/orphan", "the server")]


def test_a_socket_arrow_does_not_end_the_fd_annotation() -> None:
    call = trace.parse_line('connect(3<TCP:[127.0.0.1:36120->127.0.0.1:9]>, {sa_family=AF_INET, '
                            'sin_port=htons(9), sin_addr=inet_addr("127.0.0.1")}, 16) = 0')
    assert call is not None and len(call.args) == 3


def test_unescape() -> None:
    assert trace.unescape(r"a\"b\\c\x41\101\n") == 'a"b\\cAA\n'


def test_the_command_line_never_uses_seccomp() -> None:
    argv = trace.strace_argv("/t/t", ["/usr/bin/node", "x.js"])
    assert "--seccomp-bpf" not in argv and argv[-3:] == ["--", "/usr/bin/node", "x.js"]


def test_the_supervisors_denied_events_are_denials_too() -> None:
    from supervisor.learn import runner
    from supervisor.learn.trace import BIND_TCP, CONNECT_TCP, CREATE, EXEC, LIST, READ
    events = [
        {"event": "denied", "rights": ["fs.execute", "fs.read_file"], "kind": "path", "object": "/usr/bin/env",
         "process": {"pid": 3, "comm": "npx"}},
        {"event": "denied", "rights": ["fs.read_dir"], "kind": "path", "object": "/etc", "process": None},
        {"event": "denied", "rights": ["fs.make_reg"], "kind": "path", "object": "/var/tmp", "process": None},
        {"event": "denied", "rights": ["net.connect_tcp"], "kind": "tcp", "object": "127.0.0.1:443"},
        {"event": "denied", "rights": ["net.bind_tcp"], "kind": "tcp", "object": "0.0.0.0:8080"},
        {"event": "denied", "rights": ["scope.signal"], "kind": "process", "object": "pid 1 (init)"},
    ]
    run = runner.Run([], 0, "", "/nonexistent", "/", 0.0, 0, (), events)
    got = [(a.kind, a.path, a.port, a.denied) for a in runner.audit_denials(run)]
    assert got == [(EXEC, "/usr/bin/env", 0, True), (READ, "/usr/bin/env", 0, True), (LIST, "/etc", 0, True),
                   (CREATE, "/var/tmp", 0, True), (CONNECT_TCP, "", 443, True), (BIND_TCP, "", 8080, True)]
    assert [a.address for a in runner.audit_denials(run) if a.port] == ["127.0.0.1", "0.0.0.0"]


def test_the_tracers_own_denials_are_not_the_servers() -> None:
    """strace reads /proc/sys/kernel/pid_max and its tracees' /proc files: with host audit on, those
    records once granted all of /proc."""
    from supervisor.learn import runner
    strace = {"pid": 7, "comm": "strace", "exe": "/usr/bin/strace"}
    events = [{"rights": ["fs.read_file"], "kind": "path", "object": "/proc/sys/kernel/pid_max", "process": strace},
              {"rights": ["fs.read_file"], "kind": "path", "object": "/proc/8/status", "process": strace},
              {"rights": ["fs.read_file"], "kind": "path", "object": "/etc/x",
               "process": {"pid": 8, "comm": "strace", "exe": "/usr/bin/strace"}}]   # a server that runs strace
    run = runner.Run([], 0, "", "/nonexistent", "/", 0.0, 0, (), events, tracer=7)
    assert [(a.path, a.program) for a in runner.audit_denials(run)] == [("/etc/x", "strace")]
