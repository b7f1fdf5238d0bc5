"""Built-in sandbox profiles: what kinds of program need, measured on real servers.

A profile is a function of the manifest's context (its command, the child's
environment, its state directory) returning paths per class and env. Rules
are put on symlink targets: Landlock binds a rule to the inode it opens.
"""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import BinaryIO

PathClasses = dict[str, list[str]]

# Variables that name a CA bundle or directory: when a manifest passes one
# through (as these machines need to reach registries), its file is granted.
CA_VARIABLES = ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
                "CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO", "UV_CERT")
# Where an administrator adds a CA of their own (a company's, a proxy's) for
# update-ca-certificates / update-ca-trust, per distribution family; and the
# bundle those tools then write, holding the distribution's CAs and those.
LOCAL_CA_DIRS = ("/usr/local/share/ca-certificates", "/etc/pki/ca-trust/source/anchors",
                 "/etc/ca-certificates/trust-source/anchors", "/etc/pki/trust/anchors")
SYSTEM_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                     "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem")
# npm and uv give up on a registry they cannot reach within about 25 s, and
# say so on stderr (their defaults: 70 s for a refused connection with npm,
# minutes for one that never answers; an MCP client waits silently meanwhile).
NPM_BOUNDS = {"npm_config_fetch_retries": "1", "npm_config_fetch_retry_mintimeout": "1000",
              "npm_config_fetch_retry_maxtimeout": "4000", "npm_config_fetch_timeout": "10000"}
UV_BOUNDS = {"UV_HTTP_RETRIES": "1", "UV_HTTP_CONNECT_TIMEOUT": "5", "UV_HTTP_TIMEOUT": "10"}


@dataclass(frozen=True)
class Context:
    """What a profile is built from: the child's environment, its state, its command."""
    env: Mapping[str, str]      # the child's environment as the manifest builds it
    state_dir: str | None
    command: str
    # <state root>/servers/<name>: the supervisor's directory holding the
    # server's writable parts as siblings (state, caches). A cache is never
    # inside a directory the server may write: there it could be swapped
    # for a symlink before the next spawn's rules are built.
    area: str | None = None
    # The names the manifest sets in `env` or inherits (present where it is
    # loaded): a profile's default for one of them gives way.
    given: frozenset[str] = frozenset()


@dataclass
class Fragment:
    """What profiles add to a manifest: path rules, environment, warnings, quiet paths."""
    paths: PathClasses = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # Paths its programs read when they may and do without when denied
    # (node's /proc and /sys probes): such denials are counted, not shown.
    quiet: list[str] = field(default_factory=list)

    def add(self, cls: str, *paths: str) -> None:
        bucket = self.paths.setdefault(cls, [])
        for p in paths:
            if p not in bucket:
                bucket.append(p)

    def merge(self, other: "Fragment") -> None:
        for cls, paths in other.paths.items():
            self.add(cls, *paths)
        self.env.update(other.env)
        self.warnings += other.warnings
        self.quiet += [q for q in other.quiet if q not in self.quiet]


def _real(*paths: str) -> list[str]:
    """Each existing path and, when it is a symlink, its target too. Profiles
    list paths of several distributions: the absent ones are no news."""
    out = []
    for p in paths:
        if os.path.exists(p):
            out.append(p)
            real = os.path.realpath(p)
            if real != p:
                out.append(real)
    return out


def _program(name: str, env: Mapping[str, str]) -> str | None:
    import shutil   # here: ~1.7 ms of a private supervisor's start when no profile looks a program up
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    return os.path.realpath(found) if found else None


def regular_file(path: str) -> BinaryIO:
    """path opened for reading, if a regular file. Its type is known before
    it is opened for reading: a server can name anything as a program or in
    a `#!` line, and learn (unconfined, maybe root) must never open a FIFO
    (it would block) or a device (a watchdog's open arms it, a tape's
    rewinds). O_PATH opens nothing; the reopen through /proc/self/fd is of
    that very inode."""
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return open(f"/proc/self/fd/{fd}", "rb")
    finally:
        os.close(fd)


def shebang(path: str) -> list[str]:
    """The words of a `#!` line, or []."""
    try:
        with regular_file(path) as f:
            line = f.readline(256)
    except OSError:
        return []
    if not line.startswith(b"#!"):
        return []
    return line[2:].decode(errors="surrogateescape").split()


def _interpreters(program: str, env: Mapping[str, str]) -> list[str]:
    """A script's shebang target, and for `env NAME` the NAME it finds."""
    words = shebang(program)
    if not words:
        return []
    out = _real(words[0])
    if os.path.basename(words[0]) == "env":
        name = next((w for w in words[1:] if not w.startswith("-")), None)
        target = _program(name, env) if name else None
        if target:
            out.append(target)
            out += _interpreters(target, env)
    return out


def local_ca_bundle() -> str | None:
    """The distribution's CA bundle, when a CA was added locally: node (its
    own built-in list) and uv (Mozilla's) would not trust that CA otherwise.
    None without one: node pays 30-60 ms a start to read a bundle."""
    try:
        if not any(not name.startswith(".") for d in LOCAL_CA_DIRS if os.path.isdir(d) for name in os.listdir(d)):
            return None
    except OSError:
        return None
    return next((b for b in SYSTEM_CA_BUNDLES if os.path.isfile(b)), None)


def _defaults(f: Fragment, ctx: Context, values: Mapping[str, str]) -> None:
    """values for the names the manifest neither sets nor inherits."""
    f.env.update({k: v for k, v in values.items() if k not in ctx.given})


def _ca_default(f: Fragment, ctx: Context, var: str) -> None:
    bundle = local_ca_bundle()
    if bundle and var not in ctx.given:
        f.env[var] = bundle
        f.add("read_only_noexec", *_real(bundle))


def system(ctx: Context) -> Fragment:
    """What any dynamically linked program needs: libraries, the ELF interpreter, the command and its shebang chain, ld.so.cache, locale and zoneinfo, /dev/null and friends."""
    f = Fragment()
    f.add("read_only", *_real("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/libexec"))
    f.add("read_only", *_real(ctx.command), *_interpreters(ctx.command, ctx.env))
    f.add("read_only_noexec", *_real("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
                                     "/usr/share/locale", "/usr/share/zoneinfo", "/etc/localtime",
                                     "/etc/timezone", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
                                     "/etc/ssl/openssl.cnf", "/dev/urandom", "/dev/random",
                                     "/dev/zero", "/dev/full"))
    # git opens /dev/null O_RDWR, shells redirect to it.
    f.add("read_write_noexec", "/dev/null")
    return f


def dns_tls(ctx: Context) -> Fragment:
    """Resolver files and CA certificates, on their symlink targets, and the CA files named by the child's environment."""
    f = Fragment()
    f.add("read_only_noexec", *_real("/etc/resolv.conf", "/etc/hosts", "/etc/host.conf",
                                     "/etc/gai.conf", "/etc/nsswitch.conf", "/etc/ssl/certs",
                                     "/usr/share/ca-certificates", "/etc/ca-certificates",
                                     "/etc/pki", "/usr/lib/ssl"))
    for var in CA_VARIABLES:
        if ctx.env.get(var, "").startswith("/"):
            f.add("read_only_noexec", *_real(ctx.env[var]))
    return f


def node(ctx: Context) -> Fragment:
    """The node binary found on the child's PATH."""
    f = Fragment()
    binary = _program("node", ctx.env)
    if binary is None:
        f.warnings.append("profile node: no node on the child's PATH")
    else:
        f.add("read_only", binary)
    # Measured: its memory and CPU probes, and the locale alias table.
    f.quiet += ["/proc", "/sys/devices/system/cpu", "/sys/fs/cgroup", "/etc/locale.alias"]
    return f


def _needs_state(ctx: Context, profile: str) -> tuple[str, str]:
    """(state dir, area): npm's logs and config go to the one, caches to the other."""
    if not ctx.state_dir:
        raise ValueError(f"profile {profile} needs `state_dir: true` (its caches live there, "
                         "never shared with another server or the user's own tools)")
    if not ctx.area:
        raise ValueError(f"profile {profile} needs a state root (its caches live in "
                         "<state root>/servers/<name>)")
    return ctx.state_dir, ctx.area


def npx(ctx: Context) -> Fragment:
    """node, dns-tls, npm and npx; npm's cache beside the state directory, its logs and config in it; update check off; fetch retries and timeouts bounded; NODE_EXTRA_CA_CERTS the system bundle when a CA was added locally."""
    state, area = _needs_state(ctx, "npx")
    f = Fragment()
    f.merge(node(ctx))
    f.merge(dns_tls(ctx))
    # npx is a script for env + node; npm runs the package's bin through sh -c.
    for name in ("npx", "npm", "env", "sh"):
        found = _program(name, ctx.env)
        if found:
            f.add("read_only", found)
    node_binary = _program("node", ctx.env)
    prefix = os.path.dirname(os.path.dirname(node_binary)) if node_binary else "/usr"
    f.add("read_only", *_real(os.path.join(prefix, "lib", "node_modules"), "/usr/share/nodejs"))
    # The global npmrc may name a CA file: unreadable, npm exits 1 saying nothing.
    for npmrc in (os.path.join(prefix, "etc", "npmrc"), "/etc/npmrc"):
        f.add("read_only_noexec", *_real(npmrc))
        f.add("read_only_noexec", *_real(*_npmrc_cafiles(npmrc)))
    f.env.update({
        "HOME": state,
        "npm_config_cache": os.path.join(area, "npm-cache"),
        "npm_config_logs_dir": os.path.join(state, "npm-logs"),
        "npm_config_userconfig": os.path.join(state, "npmrc"),
        "npm_config_update_notifier": "false",
        "npm_config_fund": "false",
        "npm_config_audit": "false",
    })
    _defaults(f, ctx, NPM_BOUNDS)
    _ca_default(f, ctx, "NODE_EXTRA_CA_CERTS")
    # npx installs what it runs into the cache: that tree must also execute.
    f.add("read_write", os.path.join(area, "npm-cache"))
    f.quiet.append("/usr/bin/ldd")   # npm's libc detection, with a cold cache
    return f


def _npmrc_cafiles(npmrc: str) -> list[str]:
    try:
        with open(npmrc) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [value.strip() for key, _, value in (line.partition("=") for line in lines)
            if key.strip() == "cafile" and value.strip().startswith("/")]


def _venv_root(program: str) -> str | None:
    d = os.path.dirname(os.path.abspath(program))
    while d != "/":
        if os.path.isfile(os.path.join(d, "pyvenv.cfg")):
            return d
        d = os.path.dirname(d)
    return None


def python(ctx: Context) -> Fragment:
    """The command's virtual environment and its base interpreter."""
    f = Fragment()
    venv = _venv_root(ctx.command)
    if venv:
        f.add("read_only", venv)
        try:
            with open(os.path.join(venv, "pyvenv.cfg")) as cfg:
                settings = dict(line.split("=", 1) for line in cfg if "=" in line)
            home = settings.get("home ", settings.get("home", "")).strip()
        except OSError:
            home = ""
        if home:
            for name in os.listdir(home):
                if name.startswith("python3"):
                    f.add("read_only", *_real(os.path.join(home, name)))
    for interpreter in _interpreters(ctx.command, ctx.env):
        f.add("read_only", interpreter)
    return f


def uvx(ctx: Context) -> Fragment:
    """python, dns-tls, uv and its shell launchers; uv's cache and tool directories beside the state directory; HTTP retries and timeouts bounded; SSL_CERT_FILE the system bundle when a CA was added locally."""
    _, area = _needs_state(ctx, "uvx")
    f = Fragment()
    f.merge(dns_tls(ctx))
    f.merge(python(ctx))
    # uv's relocatable launchers start through /bin/sh, dirname and realpath.
    for name in ("uv", "uvx", "sh", "dirname", "realpath", "python3"):
        found = _program(name, ctx.env)
        if found:
            f.add("read_only", *_real(found))
    f.env.update({
        "UV_CACHE_DIR": os.path.join(area, "uv-cache"),
        "UV_TOOL_DIR": os.path.join(area, "uv-tools"),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_CONFIG": "1",
    })
    _defaults(f, ctx, UV_BOUNDS)
    _ca_default(f, ctx, "SSL_CERT_FILE")
    # The environments uv builds in its cache are executed from there.
    f.add("read_write", os.path.join(area, "uv-cache"))
    f.add("read_write_noexec", os.path.join(area, "uv-tools"))
    # Measured (learn's traces): uv's memory and CPU probes, and the
    # server's CPU quota; examples/time-uvx.yaml works without them.
    f.quiet += ["/proc", "/sys/fs/cgroup", "/sys/kernel/mm/transparent_hugepage"]
    return f


PROFILES: dict[str, Callable[[Context], Fragment]] = {
    "system": system, "dns-tls": dns_tls, "node": node, "npx": npx, "python": python, "uvx": uvx,
}


def combine(names: Iterable[str], ctx: Context, fail: Callable[[str], None]) -> Fragment:
    out = Fragment()
    for name in names:
        if name not in PROFILES:
            fail(f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
        try:
            out.merge(PROFILES[name](ctx))
        except ValueError as e:
            fail(str(e))
    return out
