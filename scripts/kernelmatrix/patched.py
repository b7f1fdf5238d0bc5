"""The test-only kernel: built once from Debian's source with the ABI patch, an ordinary x86-64 kernel booted by qemu."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from .config import CACHE, HERE
from .debian import finish_initramfs
from .host import Apt, Mirrors
from .kernels import PATCHED_SOURCE_PKG, PATCHED_SOURCE_SUITES
from .proc import Fail, Skip, run, say, sha

PATCH, FRAGMENT = HERE / "landlock-abi.patch", HERE / "guest.config"


def cache_key() -> str:
    """The patch and the config fragment, not the source's version: a Debian
    point release must not cost a rebuild on every run."""
    return sha(PATCH, FRAGMENT)


def binary() -> Path:
    """Where the kernel image is cached (beside it its initramfs, by debian.finish_initramfs)."""
    return CACHE / "patched" / f"linux-{cache_key()}" / "vmlinuz"


def prepare(mirrors: Mirrors) -> dict[str, Any]:
    """Build (once) the patched kernel and its initramfs; return its info
    (the shape debian.prepare returns: qemu boots both the same way)."""
    kernel = binary()
    meta = kernel.with_name("info.json")
    log = CACHE / "logs" / "prepare-patched.log"
    if kernel.exists() and meta.exists():
        return finish_initramfs(json.loads(meta.read_text()), log)
    log.write_text("")
    apt = Apt("patched-source", PATCHED_SOURCE_SUITES, mirrors, log)
    errors = apt.update()
    pkg = apt.show(PATCHED_SOURCE_PKG)
    if not pkg:
        raise Skip(f"no suite serves {PATCHED_SOURCE_PKG}: {'; '.join(errors) or 'not found'}")
    work = CACHE / "build" / f"patched-{cache_key()}"
    shutil.rmtree(work, ignore_errors=True)
    say(f"patched: downloading {PATCHED_SOURCE_PKG} {pkg['Version']} and building (log: {log})")
    src = _unpack(apt, pkg["Version"], work, log)
    _build(src, log)
    kernel.parent.mkdir(parents=True, exist_ok=True)
    tmp = kernel.with_suffix(".tmp")
    shutil.copy(src / "arch/x86/boot/bzImage", tmp)
    tmp.rename(kernel)
    # No modules: virtio and 9p are built in.
    info = {"dir": str(kernel.parent), "version": pkg["Version"], "modules": []}
    meta.write_text(json.dumps(info))
    shutil.rmtree(work, ignore_errors=True)
    return finish_initramfs(info, log)


def _unpack(apt: Apt, version: str, work: Path, log: Path) -> Path:
    """The source package's tree, patched; return its directory."""
    deb, = apt.download({PATCHED_SOURCE_PKG: version}, work)
    run(["dpkg-deb", "-x", deb, work / "pkg"], log)
    tarballs = list((work / "pkg/usr/src").glob("linux-source-*.tar.*"))
    if len(tarballs) != 1:
        raise Fail(f"{deb.name} has no single source tarball: {tarballs}")
    run(["tar", "-xf", tarballs[0], "-C", work], log)
    src = work / tarballs[0].name.split(".tar")[0]
    try:
        run(["patch", "-p1", "--forward", "--batch", "-i", PATCH], log, cwd=src)
    except Fail:
        raise Fail(f"{PATCH.name} does not apply to {PATCHED_SOURCE_PKG} "
                   f"{version}: update it (log: {log})")
    return src


def _build(src: Path, log: Path) -> None:
    """allnoconfig + the fragment, then the kernel."""
    make: list[Any] = ["nice", "make", "-C", src, "ARCH=x86_64"]
    run(make + ["allnoconfig"], log)
    run([src / "scripts/kconfig/merge_config.sh", "-m", "-O", src,
         src / ".config", FRAGMENT], log, cwd=src)
    run(make + ["olddefconfig"], log)
    # merge_config only warns when an option cannot be set: refuse instead,
    # a kernel without 9p or Landlock would fail in confusing ways.
    have = set((src / ".config").read_text().splitlines())
    lost = [ln for ln in FRAGMENT.read_text().splitlines()
            if ln.startswith("CONFIG_") and ln not in have]
    if lost:
        raise Fail(f"options of {FRAGMENT.name} not in the built config: {lost}")
    run(make + [f"-j{os.cpu_count() or 2}", "bzImage"], log, timeout=3600)
