"""Ruleset: a Spec turned into one Landlock ruleset fd on this kernel."""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

from . import rights, syscalls
from .support import Support, probe
from .report import Report
from .resolve import Inode, Opened, Resolver, SymlinkInsideWritable, writable_inodes
from .spec import LOG_FLAGS, Spec, SpecError

_FS_FEATURES = ("filesystem", "refer", "truncate", "ioctl_dev", "unix")
_NET_FEATURES = ("tcp", "udp")


class LandlockUnavailable(RuntimeError):
    """Landlock, or a required feature, is missing while the spec fails closed."""


# (path, (st_dev, st_ino) or None when missing, follow): see Ruleset.identity.
PathIdentity = tuple[str, Inode | None, bool]


@dataclass
class Ruleset:
    """A built Landlock ruleset, its report, and the inodes its rules were bound to."""
    fd: int                 # -1: nothing to enforce (unrestricted, or best effort)
    restrict_flags: int
    report: Report
    # A rule binds to the inode opened at build time, so a replaced path
    # needs a new ruleset: (path, (st_dev, st_ino) or None when missing,
    # follow) for every rule. `follow` only for a path ending in a symlink,
    # which is outside every writable grant: elsewhere a link put in place of
    # the path is a change, not the thing to look through.
    identity: tuple[PathIdentity, ...] = field(default=())

    def restrict_self(self) -> None:
        if self.fd >= 0:
            syscalls.restrict_self(self.fd, self.restrict_flags)

    def is_current(self) -> bool:
        return all(_inode(path, follow) == ino for path, ino, follow in self.identity)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _inode(path: str, follow: bool) -> Inode | None:
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def wanted_features(spec: Spec) -> list[str]:
    wanted = [] if spec.unrestricted_filesystem else list(_FS_FEATURES)
    if not spec.unrestricted_network:
        wanted += _NET_FEATURES
    wanted += ["scope_" + s for s in spec.scopes]
    if spec.log:
        wanted.append("logging")
    return wanted


@dataclass(frozen=True)
class Downgrade:
    """What a Spec gets on a kernel: the rights handled, what is dropped and why.

    go-landlock's `downgrade` (restrict.go), as a value: decided apart from
    the system calls that make the ruleset, and tested as a table."""
    features: tuple[str, ...]      # wanted and usable, sorted
    dropped: dict[str, str]        # wanted, unusable -> why (Report.downgraded)
    fs: int = 0                    # handled access rights
    net: int = 0
    scope: int = 0
    restrict_flags: int = 0        # a plain int: the Entry goes by marshal

    @property
    def handles_anything(self) -> bool:
        return bool(self.fs or self.net or self.scope)


def downgrade(spec: Spec, support: Support) -> Downgrade:
    """Spec x what the kernel supports -> Downgrade. Pure. Raises
    LandlockUnavailable when a required feature is missing (the filesystem
    is required unless best_effort or unrestricted)."""
    required = set(spec.require)
    if not spec.unrestricted_filesystem and not spec.best_effort:
        required.add("filesystem")
    absent = sorted(f for f in required if f not in support.features)
    if absent:
        raise LandlockUnavailable("required Landlock feature(s) unavailable: " + "; ".join(
            f"{f}: {support.missing[f]}" for f in absent))
    wanted = wanted_features(spec)
    usable = [rights.FEATURE_BY_NAME[f] for f in wanted if f in support.features]
    flags = 0
    if "logging" in support.features:
        for flag in spec.log:
            flags |= int(LOG_FLAGS[flag])
    return Downgrade(features=tuple(sorted(f.name for f in usable)),
                     dropped={f: support.missing[f] for f in wanted if f not in support.features},
                     fs=sum(f.fs for f in usable), net=sum(f.net for f in usable),
                     scope=sum(f.scope for f in usable), restrict_flags=flags)


def build(spec: Spec, support: Support | None = None) -> Ruleset:
    """Raises SpecError (a path it cannot use) or LandlockUnavailable."""
    support = support or probe(spec.max_abi)
    d = downgrade(spec, support)
    report = Report(kernel_abi=support.kernel_abi, errata=support.errata, downgraded=d.dropped,
                    handled_fs=rights.names(rights.FS, d.fs), handled_net=rights.names(rights.Net, d.net),
                    scoped=rights.names(rights.Scope, d.scope), features=list(d.features),
                    unix_connect_unrestricted=not d.fs & rights.FS.RESOLVE_UNIX,
                    udp_unrestricted=not d.net & rights.Net.CONNECT_SEND_UDP)
    if not d.handles_anything:
        if d.features or d.dropped:   # something was wanted, and no right of it is handled
            report.abi = -1
            report.add_note("Landlock unavailable: running UNCONFINED (best effort): "
                            + support.missing.get("filesystem", "no usable feature"))
        else:
            report.add_note("nothing to restrict: unrestricted filesystem and network, no scopes")
        return Ruleset(-1, 0, report)

    report.abi = support.abi
    size = (syscalls.ATTR_SIZE_SCOPED if d.scope else
            syscalls.ATTR_SIZE_NET if d.net else syscalls.ATTR_SIZE_FS)
    fd = syscalls.create_ruleset(syscalls.RulesetAttr(d.fs, d.net, d.scope), size)
    try:
        identity = _add_path_rules(fd, spec, d.fs, report)
        _add_port_rules(fd, spec, d.net)
    except BaseException:
        os.close(fd)
        raise
    if report.skipped_paths:
        report.add_note("missing paths skipped: " + ", ".join(report.skipped_paths))
    return Ruleset(fd, d.restrict_flags, report, identity)


WRITABLE_CLASSES = ("read_write", "read_write_noexec")


def _writable_first(spec: Spec) -> list[tuple[str, str]]:
    """Writable grants first: a grant swapped for a link is named as such,
    before the paths it would make look inside."""
    rules = spec.path_rules
    return ([r for r in rules if r[0] in WRITABLE_CLASSES]
            + [r for r in rules if r[0] not in WRITABLE_CLASSES])


def _resolver(spec: Spec) -> Resolver:
    return Resolver(writable_inodes([r for r in spec.path_rules if r[0] in WRITABLE_CLASSES]
                                    + [("untrusted_trees", p) for p in spec.untrusted_trees]))


def _open_rule(resolver: Resolver, cls: str, path: str, spec: Spec, report: Report) -> Opened | None:
    """The rule's path opened, or None when it is missing and may be skipped."""
    try:
        return resolver.open(cls, path)
    except SpecError:
        raise
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR) and not spec.strict_paths:
            report.skipped_paths.append(path)
            return None
        raise SpecError(f"{cls}: {path}: {e.strerror}") from None


def _add_path_rules(fd: int, spec: Spec, handled_fs: int, report: Report) -> tuple[PathIdentity, ...]:
    identity: list[PathIdentity] = []
    resolver = _resolver(spec)
    for cls, path in _writable_first(spec):
        opened = _open_rule(resolver, cls, path, spec, report)
        if opened is None:
            identity.append((path, None, False))
            continue
        try:
            access = int(rights.PATH_CLASSES[cls]) & handled_fs
            if not stat.S_ISDIR(opened.st.st_mode):
                access &= int(rights.FILE_RIGHTS)
            # None, e.g. connect_unix before ABI 9: reported as downgraded.
            if access:
                syscalls.add_rule(fd, syscalls.RULE_PATH_BENEATH,
                                  syscalls.PathBeneathAttr(access, opened.fd))
        except OSError as e:
            raise SpecError(f"{cls}: {path}: {e.strerror}") from None
        finally:
            os.close(opened.fd)
        identity.append((path, (opened.st.st_dev, opened.st.st_ino), opened.trailing_link))
    return tuple(identity)


def inside_writable(spec: Spec) -> list[tuple[str, str, str]]:
    """(class, path, writable grant) for every rule path strictly inside a
    writable grant of the spec (its own grants included): a confined process
    can replace what such a path names between two builds. By the inodes
    walked, and by the text for paths that do not exist (yet)."""
    resolver = _resolver(spec)
    grants = [(p.rstrip("/") or "/", p) for cls in WRITABLE_CLASSES for p in getattr(spec, cls)]
    out = []
    for cls, path in spec.path_rules:
        grant = None
        try:
            opened = resolver.walk(cls, path)
        except SymlinkInsideWritable as e:
            grant = e.grant
        except OSError:
            pass
        else:
            os.close(opened.fd)
            if opened.grant is not None and resolver.writable.get(
                    (opened.st.st_dev, opened.st.st_ino)) != opened.grant:
                grant = opened.grant
        if grant is None:
            norm = os.path.normpath(path)
            grant = next((g for prefix, g in grants
                          if norm != prefix and norm.startswith(prefix.rstrip("/") + "/")), None)
        if grant is not None:
            out.append((cls, path, grant))
    return out


def _add_port_rules(fd: int, spec: Spec, handled_net: int) -> None:
    bind_udp = spec.bind_udp
    # A UDP socket that sends or connects before any bind() is bound by the
    # kernel to an ephemeral port, which Landlock (ABI 10) checks as a bind
    # to port 0: without that rule a client allowed to reach a port (a DNS
    # lookup) could not send at all. Port 0 means "any ephemeral port",
    # never a chosen one, so it grants nothing a listener could use.
    if spec.connect_udp and 0 not in bind_udp:
        bind_udp += (0,)
    for ports, right in ((spec.bind_tcp, rights.Net.BIND_TCP),
                         (spec.connect_tcp, rights.Net.CONNECT_TCP),
                         (bind_udp, rights.Net.BIND_UDP),
                         (spec.connect_udp, rights.Net.CONNECT_SEND_UDP)):
        if handled_net & right:
            for port in ports:
                syscalls.add_rule(fd, syscalls.RULE_NET_PORT, syscalls.NetPortAttr(right, port))
