"""Symlinks in rule paths: a link inside a writable grant is refused (a
confined process may have put it there to widen its next ruleset), a link
elsewhere is followed; the currency check sees a path swapped for a link."""
from __future__ import annotations

import errno
import os

import pytest

from landlock import Spec, SpecError, abi_version, build
from landlock.ruleset import inside_writable

# build() opens rule paths only where there is a ruleset to add them to.
pytestmark = pytest.mark.skipif(not abi_version(), reason="this kernel has no Landlock: no rule path is opened")


def _swap_for_link(path, target) -> None:
    """What a confined server can do to a directory it may write in."""
    os.rename(path, f"{path}.away")
    os.symlink(target, path)


@pytest.fixture
def grants(layout):
    """d: a writable grant; d/cache: a grant nested in it (npx's npm-cache)."""
    (layout.d / "cache").mkdir()
    (layout.d / "cache" / "tool").write_text("tool")
    return layout


@pytest.mark.parametrize("cls", ["read_write", "read_write_noexec", "read_only", "read_only_noexec",
                                 "connect_unix"])
@pytest.mark.parametrize("target", ["/", "out"])
def test_nested_grant_swapped_for_a_link_is_refused(grants, cls, target):
    target = "/" if target == "/" else str(grants.out)
    cache = grants.d / "cache"
    outer = "read_write" if cls == "read_write_noexec" else "read_write_noexec"
    spec = Spec(**{outer: (str(grants.d),), cls: (str(cache),)}, max_abi=1)
    build(spec).close()
    _swap_for_link(cache, target)
    with pytest.raises(SpecError) as e:
        build(spec)
    assert f"{cls}: {cache}: symlink {cache} " in str(e.value)
    assert str(grants.d) in str(e.value)


def test_link_in_the_middle_of_a_path_inside_a_grant_is_refused(grants):
    os.symlink(grants.out, grants.d / "sub")
    spec = Spec(read_write=(str(grants.d),), read_only=(str(grants.d / "sub" / "file"),))
    with pytest.raises(SpecError, match=f"read_only: {grants.d}/sub/file: symlink {grants.d}/sub "):
        build(spec)


def test_relative_link_inside_a_grant_is_refused(grants):
    os.symlink("../out", grants.d / "rel")
    with pytest.raises(SpecError, match="symlink"):
        build(Spec(read_write=(str(grants.d),), read_only=(str(grants.d / "rel"),)))


def test_dangling_link_inside_a_grant_is_refused_not_skipped(grants):
    os.symlink("/nonexistent-target", grants.d / "dangling")
    with pytest.raises(SpecError, match="symlink"):
        build(Spec(read_write=(str(grants.d),), read_only=(str(grants.d / "dangling"),)))


def test_grant_reached_through_an_outside_link_still_counts(grants):
    """Outside links are followed; once the walk is in the grant (by inode),
    a link there is refused all the same."""
    os.symlink(grants.d, grants.root / "alias")
    os.symlink(grants.out, grants.d / "inner")
    spec = Spec(read_write=(str(grants.d),), read_only=(str(grants.root / "alias" / "inner"),))
    with pytest.raises(SpecError, match=f"symlink {grants.d}/inner lies inside the writable grant {grants.d}"):
        build(spec)


@pytest.mark.parametrize("link", ["absolute", "relative", "dotdot", "chain"])
def test_links_outside_every_grant_are_followed(grants, link):
    """/etc/resolv.conf -> ../run/... and the like: made by whoever the sandbox does not confine."""
    target = {"absolute": str(grants.out / "file"), "relative": "out/file",
              "dotdot": "d/../out/file", "chain": "hop"}[link]
    if link == "chain":
        os.symlink("out/file", grants.root / "hop")
    os.symlink(target, grants.root / "link")
    ruleset = build(Spec(read_write=(str(grants.d),), read_only=(str(grants.root / "link"),)))
    try:
        want = os.stat(grants.out / "file")
        assert ruleset.identity[-1] == (str(grants.root / "link"), (want.st_dev, want.st_ino), True)
        assert ruleset.is_current()
    finally:
        ruleset.close()


def test_a_link_loop_outside_the_grants_is_a_spec_error(layout):
    os.symlink("b", layout.root / "a")
    os.symlink("a", layout.root / "b")
    with pytest.raises(SpecError, match="symbolic links"):
        build(Spec(read_only=(str(layout.root / "a"),)))


def test_dangling_link_outside_the_grants_is_a_missing_path(layout):
    os.symlink(layout.root / "nowhere", layout.root / "dangling")
    ruleset = build(Spec(read_only=(str(layout.root / "dangling"), str(layout.d))))
    try:
        assert ruleset.report.skipped_paths == [str(layout.root / "dangling")]
    finally:
        ruleset.close()
    with pytest.raises(SpecError, match="No such file"):
        build(Spec(read_only=(str(layout.root / "dangling"),), strict_paths=True))


def test_swap_for_a_link_to_the_same_directory_is_not_current(grants):
    """The rule still holds the old inode; the currency check must not look
    through the link (lstat), so the rebuild happens and refuses."""
    cache = grants.d / "cache"
    spec = Spec(read_write=(str(grants.d), str(cache)))
    ruleset = build(spec)
    try:
        assert ruleset.is_current()
        os.rename(cache, grants.d / "cache2")
        os.symlink("cache2", cache)
        assert not ruleset.is_current()
    finally:
        ruleset.close()
    with pytest.raises(SpecError, match="symlink"):
        build(spec)


def test_retargeted_outside_link_is_not_current(layout):
    os.symlink(layout.d / "file", layout.root / "conf")
    ruleset = build(Spec(read_only=(str(layout.root / "conf"),)))
    try:
        assert ruleset.is_current()
        os.unlink(layout.root / "conf")
        os.symlink(layout.out / "file", layout.root / "conf")
        assert not ruleset.is_current()
    finally:
        ruleset.close()


@pytest.mark.enforcement
def test_refused_in_the_child_too(run_confined, grants):
    cache = grants.d / "cache"
    _swap_for_link(cache, "/")
    result = run_confined(Spec(read_write=(str(grants.d), str(cache))), lambda: os.listdir("/"))
    assert isinstance(result.error, SpecError) and "symlink" in str(result.error)


@pytest.mark.enforcement
def test_unswapped_nested_grant_still_works(confined_errno, grants):
    spec = Spec(read_write_noexec=(str(grants.d),), read_only=(str(grants.d / "cache"),))
    assert confined_errno(spec, lambda: (grants.d / "cache" / "tool").read_text()) == 0
    assert confined_errno(spec, lambda: (grants.out / "file").read_text()) == errno.EACCES


def test_inside_writable(grants):
    os.symlink(grants.d, grants.root / "alias")
    spec = Spec(read_write=(str(grants.d), str(grants.d / "cache")),
                read_only=(str(grants.root / "alias" / "cache"), "/usr"),
                read_only_noexec=(str(grants.d / "not-yet"), str(grants.d)),
                connect_unix=(str(grants.d / "cache" / "sock"),))
    assert sorted(inside_writable(spec)) == sorted([
        ("read_write", str(grants.d / "cache"), str(grants.d)),
        ("read_only", str(grants.root / "alias" / "cache"), str(grants.d)),
        ("read_only_noexec", str(grants.d / "not-yet"), str(grants.d)),  # missing: by its text
        ("connect_unix", str(grants.d / "cache" / "sock"), str(grants.d)),
    ])


def test_inside_writable_reports_a_swapped_grant(grants):
    _swap_for_link(grants.d / "cache", "/")
    spec = Spec(read_write=(str(grants.d), str(grants.d / "cache")))
    assert inside_writable(spec) == [("read_write", str(grants.d / "cache"), str(grants.d))]


def test_no_writable_grant_nothing_inside():
    assert inside_writable(Spec(read_only=("/usr", "/etc/resolv.conf"))) == []


def test_untrusted_tree_without_its_grant(grants):
    """A spec narrowed from a wider one may drop the writable grant but names
    it in untrusted_trees: a link planted there is refused all the same
    (between the narrowing's check and the build, a server could swap)."""
    os.symlink(grants.out, grants.d / "sub")
    rule = str(grants.d / "sub" / "file")
    build(Spec(read_only=(rule,))).close()   # followed: nothing says d is writable
    with pytest.raises(SpecError, match=f"symlink {grants.d}/sub "):
        build(Spec(read_only=(rule,), untrusted_trees=(str(grants.d),)))
