"""What the running kernel's Landlock does, checked with raw system calls.

Run on the host and in every kernel of scripts/multikernel, including the
User-Mode Linux kernel whose `landlock_abi=N` test patch emulates ABIs 1-6:
on the real old kernels (Debian 6.1 = ABI 2, 5.10 = none) the same tests
show that the patch answers like the kernels it stands in for.
"""
import errno
import json
import os

import pytest

import llsyscalls as ll


def test_abi_is_expected(expected_abi):
    abi, err = ll.abi()
    want = os.environ.get("EXPECT_ABI", "(unset: the running ABI)")
    assert abi == expected_abi, f"ABI {abi} ({err or 'ok'}), EXPECT_ABI {want}"
    if abi == 0:
        assert err in ("ENOSYS", "EOPNOTSUPP")


@pytest.fixture
def need_landlock(running_abi):
    if running_abi < 1:
        pytest.skip("kernel without Landlock")


def _in_child(fn):
    """Run fn() in a forked child (Landlock confines it for good) and return
    what it returns, through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            out = json.dumps(fn()).encode()
        except BaseException as e:  # report anything, never return into pytest
            out = json.dumps({"child error": repr(e)}).encode()
            code = 1
        try:
            os.write(w, out)
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    result = json.loads(data or b"null")
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


def _try_open(path):
    try:
        os.close(os.open(path, os.O_RDONLY))
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


@pytest.mark.enforcement  # tests/conftest.py: must not skip where Landlock exists
@pytest.mark.usefixtures("need_landlock")
def test_read_file_confined_to_allowed_dir(tmp_path):
    allowed, other = str(tmp_path / "allowed"), str(tmp_path / "other")
    for d in (allowed, other):
        os.mkdir(d)
        with open(os.path.join(d, "f"), "w") as f:
            f.write("x")
    # The root filesystem is 9p or hostfs in the guests: check it too.
    paths = {"inside": os.path.join(allowed, "f"),
             "sibling": os.path.join(other, "f"), "rootfs": __file__}

    def confined():
        fd = ll.create_ruleset(fs=ll.FS_READ_FILE)
        ll.add_path_rule(fd, allowed, ll.FS_READ_FILE)
        ll.restrict_self(fd)
        os.close(fd)
        return {k: _try_open(p) for k, p in paths.items()}

    assert {k: _try_open(p) for k, p in paths.items()} == dict.fromkeys(paths, "ok")
    assert _in_child(confined) == {"inside": "ok", "sibling": "EACCES",
                                   "rootfs": "EACCES"}


def _errno_of(**kw):
    try:
        os.close(ll.create_ruleset(**kw))
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


@pytest.fixture
def last_bits(running_abi, need_landlock):
    if running_abi not in ll.LAST_BITS:
        pytest.skip(f"ABI {running_abi} is newer than llsyscalls.LAST_BITS")
    return ll.LAST_BITS[running_abi]


def test_known_rights_accepted(running_abi, last_bits):
    fs_last, net_last, scope_last = last_bits
    assert _errno_of(fs=(2 << fs_last) - 1) == "ok"
    if net_last >= 0:
        assert _errno_of(fs=ll.FS_READ_FILE, net=(2 << net_last) - 1,
                         size=ll.ATTR_SIZE_NET) == "ok"
    if scope_last >= 0:
        assert _errno_of(fs=ll.FS_READ_FILE, scoped=(2 << scope_last) - 1,
                         size=ll.ATTR_SIZE_SCOPED) == "ok"


def test_rights_beyond_abi_are_einval(last_bits):
    fs_last, net_last, scope_last = last_bits
    assert _errno_of(fs=1 << (fs_last + 1)) == "EINVAL"
    assert _errno_of(fs=ll.FS_READ_FILE | 1 << (fs_last + 1)) == "EINVAL"
    if net_last >= 0:
        assert _errno_of(fs=ll.FS_READ_FILE, net=1 << (net_last + 1),
                         size=ll.ATTR_SIZE_NET) == "EINVAL"
    if scope_last >= 0:
        assert _errno_of(fs=ll.FS_READ_FILE, scoped=1 << (scope_last + 1),
                         size=ll.ATTR_SIZE_SCOPED) == "EINVAL"


def test_attr_fields_beyond_abi_are_e2big(running_abi, need_landlock):
    # An older kernel's struct ends before the newer fields: it accepts them
    # zeroed and refuses them set (copy_struct_from_user), whatever the size.
    read = ll.FS_READ_FILE
    assert _errno_of(fs=read, size=ll.ATTR_SIZE_SCOPED) == "ok"
    net = _errno_of(fs=read, net=ll.NET_CONNECT_TCP, size=ll.ATTR_SIZE_NET)
    assert net == ("ok" if running_abi >= 4 else "E2BIG")
    scoped = _errno_of(fs=read, scoped=ll.SCOPE_SIGNAL, size=ll.ATTR_SIZE_SCOPED)
    assert scoped == ("ok" if running_abi >= 6 else "E2BIG")


@pytest.mark.parametrize("flag", sorted(ll.RESTRICT_FLAGS))
def test_restrict_flags_beyond_abi_are_einval(running_abi, need_landlock, flag):
    """The log flags came with ABI 7 and TSYNC with 8: an older kernel refuses them (EINVAL), and a
    confinement without them (as ours is before 8: a single-threaded child needs no TSYNC) still holds."""
    def confined():
        fd = ll.create_ruleset(fs=ll.FS_READ_FILE)
        try:
            ll.restrict_self(fd, flag)
            got = "ok"
        except OSError as e:
            got = errno.errorcode.get(e.errno, str(e.errno))
        if got == "EINVAL":
            ll.restrict_self(fd)
        return {"flag": got, "confined": _try_open("/etc/hostname")}

    want = "ok" if running_abi >= ll.RESTRICT_FLAGS[flag] else "EINVAL"
    assert _in_child(confined) == {"flag": want, "confined": "EACCES"}
