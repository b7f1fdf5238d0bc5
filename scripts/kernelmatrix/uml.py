"""The User-Mode Linux kernel: built once from Debian's source with the test-only ABI patch, and its command line."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from .config import CACHE, HERE
from .host import Apt, Mirrors
from .kernels import KERNELS, UML_SOURCE_PKG, UML_SOURCE_SUITES
from .proc import Fail, Skip, run, say, sha

PATCH, FRAGMENT = HERE / "landlock-abi.patch", HERE / "uml.config"


def cache_key() -> str:
    """The patch and the config fragment, not the source's version: a Debian
    point release must not cost a rebuild on every run."""
    return sha(PATCH, FRAGMENT)


def binary() -> Path:
    """Where the stripped kernel is cached."""
    return CACHE / "uml" / f"linux-{cache_key()}"


def prepare(mirrors: Mirrors) -> dict[str, Any]:
    """Build (once) the stripped User-Mode Linux kernel; return its info."""
    kernel = binary()
    meta = kernel.with_name(kernel.name + ".json")
    if kernel.exists() and meta.exists():
        return dict(json.loads(meta.read_text()))
    log = CACHE / "logs" / "prepare-uml.log"
    log.write_text("")
    apt = Apt("uml-source", UML_SOURCE_SUITES, mirrors, log)
    errors = apt.update()
    pkg = apt.show(UML_SOURCE_PKG)
    if not pkg:
        raise Skip(f"no suite serves {UML_SOURCE_PKG}: {'; '.join(errors) or 'not found'}")
    work = CACHE / "build" / f"uml-{cache_key()}"
    shutil.rmtree(work, ignore_errors=True)
    say(f"uml: downloading {UML_SOURCE_PKG} {pkg['Version']} and building (log: {log})")
    src = _unpack(apt, pkg["Version"], work, log)
    _build(src, log)
    tmp = kernel.with_suffix(".tmp")
    run(["strip", "-o", tmp, src / "linux"], log)
    tmp.rename(kernel)
    info = {"binary": str(kernel), "version": pkg["Version"]}
    meta.write_text(json.dumps(info))
    shutil.rmtree(work, ignore_errors=True)
    return info


def _unpack(apt: Apt, version: str, work: Path, log: Path) -> Path:
    """The source package's tree, patched; return its directory."""
    deb, = apt.download({UML_SOURCE_PKG: version}, work)
    run(["dpkg-deb", "-x", deb, work / "pkg"], log)
    tarballs = list((work / "pkg/usr/src").glob("linux-source-*.tar.*"))
    if len(tarballs) != 1:
        raise Fail(f"{deb.name} has no single source tarball: {tarballs}")
    run(["tar", "-xf", tarballs[0], "-C", work], log)
    src = work / tarballs[0].name.split(".tar")[0]
    try:
        run(["patch", "-p1", "--forward", "--batch", "-i", PATCH], log, cwd=src)
    except Fail:
        raise Fail(f"{PATCH.name} does not apply to {UML_SOURCE_PKG} "
                   f"{version}: update it (log: {log})")
    return src


def _build(src: Path, log: Path) -> None:
    """allnoconfig + the fragment, then the kernel."""
    make: list[Any] = ["make", "-C", src, "ARCH=um", "SUBARCH=x86_64"]
    run(make + ["allnoconfig"], log)
    run([src / "scripts/kconfig/merge_config.sh", "-m", "-O", src,
         src / ".config", FRAGMENT], log, cwd=src)
    run(make + ["olddefconfig"], log)
    # merge_config only warns when an option cannot be set: refuse instead,
    # a kernel without hostfs or Landlock would fail in confusing ways.
    have = set((src / ".config").read_text().splitlines())
    lost = [ln for ln in FRAGMENT.read_text().splitlines()
            if ln.startswith("CONFIG_") and ln not in have]
    if lost:
        raise Fail(f"options of {FRAGMENT.name} not in the built config: {lost}")
    run(make + [f"-j{os.cpu_count() or 2}", "linux"], log, timeout=3600)


def command(name: str, info: dict[str, Any], guest_params: list[str]) -> list[Any]:
    return [info["binary"], "mem=1024M", "rootfstype=hostfs", "rootflags=/", "ro",
            f"init={HERE / 'guest-init'}", "con=null", "con0=fd:0,fd:1", "quiet",
            *KERNELS[name]["append"], *guest_params]
