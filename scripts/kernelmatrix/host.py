"""The host: the Debian packages each part needs, the Debian mirrors, a private APT, the cache and its lock."""
from __future__ import annotations

import fcntl
import os
import re
import subprocess
from pathlib import Path
from typing import IO

from .config import CACHE
from .proc import Fail, Skip, die, run, say

HOST_PKGS = {  # what each part needs on the host (Debian package names)
    "any": ["busybox-static"],  # guest-init powers off with it
    "kernel-build": ["build-essential", "flex", "bison", "bc", "patch", "xz-utils", "libelf-dev"],
    "qemu": ["qemu-system-x86", "kmod", "cpio", "xz-utils", "zstd"],
}
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
Mirrors = tuple[str | None, str | None]


def ensure_host_packages(groups: list[str]) -> None:
    pkgs = sorted({p for g in groups for p in HOST_PKGS[g]})
    missing = [p for p in pkgs if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
        text=True).stdout != "install ok installed"]
    if not missing:
        return
    if os.geteuid() != 0:
        die(f"missing host packages: {' '.join(missing)}\n"
            f"  install them: sudo apt-get install {' '.join(missing)}")
    say(f"host: apt-get install {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]):
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode:
            die(f"{' '.join(cmd[:2])} failed:\n{p.stdout}{p.stderr}")


def debian_mirrors() -> Mirrors:
    """(main, security) archive URIs, from the host's own APT sources, so that
    a machine's mirror or proxy is used; MULTIKERNEL_MIRROR and
    MULTIKERNEL_SECURITY_MIRROR override them."""
    main = os.environ.get("MULTIKERNEL_MIRROR")
    sec = os.environ.get("MULTIKERNEL_SECURITY_MIRROR")
    p = subprocess.run(["apt-get", "indextargets", "--no-release-info",
                        "--format", "$(REPO_URI) $(RELEASE)"],
                       capture_output=True, text=True)
    for line in sorted(set(p.stdout.split("\n"))):
        uri, _, release = line.partition(" ")
        if release.endswith("-security"):
            sec = sec or uri
        elif release and "-" not in release:
            main = main or uri
    return main, sec


class Apt:
    """A private APT (own sources, lists and cache under CACHE/apt/NAME),
    to read other Debian suites without touching the host's /etc/apt."""

    def __init__(self, name: str, suites: list[str], mirrors: Mirrors, log: Path) -> None:
        self.dir, self.log = CACHE / "apt" / name, log
        etc = self.dir / "etc"
        for d in ("lists/partial", "archives/partial", "etc/parts",
                  "etc/sources.list.d", "etc/preferences.d"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        main, security = mirrors
        if not main:
            raise Skip("no Debian mirror in the host's APT sources: set "
                       "MULTIKERNEL_MIRROR (and MULTIKERNEL_SECURITY_MIRROR)")
        lines = [f"deb [signed-by={KEYRING}] {security if s.endswith('-security') else main} {s} main"
                 for s in suites if security or not s.endswith("-security")]
        (etc / "sources.list").write_text("\n".join(lines) + "\n")
        conf = [f'Dir::State "{self.dir}";', 'Dir::State::status "/dev/null";',
                f'Dir::Cache "{self.dir}";', 'Dir::Cache::srcpkgcache "";',
                f'Dir::Etc "{etc}";',
                'Dir::Etc::sourcelist "sources.list";', 'Dir::Etc::parts "parts";',
                'APT::Architecture "amd64";', 'APT::Architectures { "amd64"; };',
                'Acquire::Languages "none";', 'APT::Sandbox::User "root";',
                # Mirrors here may be frozen snapshots: Release files expire
                # while their signatures (still checked) stay good.
                'Acquire::Check-Valid-Until "false";', 'Acquire::Check-Date "false";']
        conf += self._host_proxies()
        (self.dir / "apt.conf").write_text("\n".join(conf) + "\n")
        self.env = dict(os.environ, APT_CONFIG=str(self.dir / "apt.conf"))

    @staticmethod
    def _host_proxies() -> list[str]:
        p = subprocess.run(["apt-config", "shell", "H", "Acquire::http::Proxy",
                            "S", "Acquire::https::Proxy"], capture_output=True, text=True)
        vals = dict(re.findall(r"^(\w)='(.*)'$", p.stdout, re.M))
        return [f'Acquire::{k}::Proxy "{vals[v]}";'
                for k, v in (("http", "H"), ("https", "S")) if vals.get(v)]

    def update(self) -> list[str]:
        """Refresh the lists; return apt's error lines (some suites may fail
        while the one we need works: callers judge by what they can find)."""
        p = subprocess.run(["apt-get", "update", "-q"], env=self.env,
                           capture_output=True, text=True, timeout=300)
        with open(self.log, "a") as f:
            f.write(f"\n$ apt-get update ({self.dir})\n{p.stdout}{p.stderr}")
        return [ln[3:] for ln in (p.stdout + p.stderr).splitlines()
                if ln.startswith(("E: ", "W: Failed to fetch"))][:2] or \
            ([f"apt-get update exited {p.returncode}"] if p.returncode else [])

    def show(self, pkg: str) -> dict[str, str] | None:
        """The candidate's control fields, or None if no suite serves pkg."""
        p = subprocess.run(["apt-cache", "show", "--no-all-versions", pkg],
                           env=self.env, capture_output=True, text=True)
        if p.returncode or not p.stdout.strip():
            return None
        return dict(re.findall(r"^([\w-]+): (.*)$", p.stdout, re.M))

    def download(self, pkgs: dict[str, str], dest: Path) -> list[Path]:
        """Download {name: version} into dest; return the .deb paths."""
        dest.mkdir(parents=True, exist_ok=True)
        run(["apt-get", "download", "-q", *(f"{p}={v}" for p, v in pkgs.items())],
            self.log, timeout=1200, cwd=dest, env=self.env)
        debs = [d for p in pkgs for d in dest.glob(f"{p}_*.deb")]
        if len(debs) != len(pkgs):
            raise Fail(f"apt-get download {' '.join(pkgs)} left {len(debs)} .deb files in {dest}")
        return debs



def lock_cache() -> IO[str]:
    """Make the cache's directories and hold its lock (waiting for another run's)."""
    try:
        for d in ("logs", "run", "patched", "debian", "build", "apt"):
            (CACHE / d).mkdir(parents=True, exist_ok=True)
        lock = open(CACHE / ".lock", "w")
    except OSError as e:
        die(f"cannot use the cache {CACHE}: {e}\n"
            "  run as root or set MULTIKERNEL_CACHE to a writable directory")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        say(f"waiting for another multikernel run to release {CACHE}/.lock")
        fcntl.flock(lock, fcntl.LOCK_EX)
    return lock
