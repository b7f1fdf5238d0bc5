"""Debian's generic kernels: the suite's current image and the virtio/9p modules its initramfs loads, downloaded once."""
from __future__ import annotations

import json
import lzma
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .config import CACHE
from .host import Apt, Mirrors
from .kernels import KERNELS
from .proc import Fail, Skip, run, say
from .qemu import finish_initramfs

# What the initramfs loads to mount the host's root, with what they need.
MODULES = ["virtio_pci", "9pnet_virtio", "9p"]


def prepare(name: str, mirrors: Mirrors) -> dict[str, Any]:
    """Download the suite's current generic kernel (once per version) and
    build its initramfs; return its info. When the archive cannot be read,
    the last kernel prepared for this name is used if there is one."""
    log = CACHE / "logs" / f"prepare-{name}.log"
    log.write_text("")
    pointer = CACHE / "debian" / f"{name}.json"
    apt = Apt(name, KERNELS[name]["suites"], mirrors, log)
    errors = apt.update()
    meta = apt.show("linux-image-amd64")
    pkg = re.search(r"\b(linux-image-\d[^\s,(|]*)", (meta or {}).get("Depends", ""))
    info = apt.show(pkg.group(1)) if pkg else None
    if not info:
        why = "; ".join(errors) or f"{KERNELS[name]['suites'][0]} has no linux-image-amd64"
        if pointer.exists():
            old = json.loads(pointer.read_text())
            say(f"{name}: archive unusable ({why}); using cached {old['pkg']}")
            return finish_initramfs(old, log)
        raise Skip(why)
    kdir = CACHE / "debian" / f"{info['Package']}_{info['Version']}"
    if not (kdir / "info.json").exists():
        say(f"{name}: downloading {info['Package']} {info['Version']} (log: {log})")
        extract_kernel(apt, info, kdir, log)
    got = json.loads((kdir / "info.json").read_text())
    pointer.write_text(json.dumps(got))
    return finish_initramfs(got, log)


def extract_kernel(apt: Apt, info: dict[str, str], kdir: Path, log: Path) -> None:
    """Keep the kernel image and, decompressed, the modules the initramfs
    needs to reach the host root over virtio 9p, in load order."""
    work = CACHE / "build" / kdir.name
    shutil.rmtree(work, ignore_errors=True)
    root, kver, image = _unpack(apt, info, work, log)
    run(["depmod", "-b", root, kver], log)
    p = subprocess.run(["modprobe", "-d", str(root), "-S", kver, "--show-depends", "-a", *MODULES],
                       capture_output=True, text=True)
    if p.returncode:
        raise Fail(f"{kver}: modprobe --show-depends failed: {p.stderr.strip()}")
    tmp = kdir.with_name(kdir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "modules").mkdir(parents=True)
    order = _copy_modules(re.findall(r"^insmod (\S+)", p.stdout, re.M), tmp / "modules", kver)
    shutil.copy(image, tmp / "vmlinuz")
    got = {"pkg": info["Package"], "version": info["Version"], "kver": kver,
           "dir": str(kdir), "modules": order}
    (tmp / "info.json").write_text(json.dumps(got))
    shutil.rmtree(kdir, ignore_errors=True)
    tmp.rename(kdir)
    shutil.rmtree(work, ignore_errors=True)


def _unpack(apt: Apt, info: dict[str, str], work: Path, log: Path) -> tuple[Path, str, Path]:
    """The image package and its parts unpacked: (root, kernel version, vmlinuz)."""
    # Since 7.x the image package is empty and depends on its parts
    # (linux-{base,binary,modules}-ABI): fetch those along with it.
    pkgs = {info["Package"]: info["Version"]}
    suffix = info["Package"][len("linux-image"):]
    for dep in re.findall(r"(linux-[\w.+-]+) \(= ([^)]+)\)", info.get("Depends", "")):
        if dep[0].endswith(suffix):
            pkgs[dep[0]] = dep[1]
    root = work / "root"
    for deb in apt.download(pkgs, work):
        run(["dpkg-deb", "-x", deb, root], log)
    # Newer packages install to /usr/lib/modules; depmod -b wants /lib.
    if not (root / "lib/modules").exists() and (root / "usr/lib/modules").exists():
        (root / "lib").symlink_to("usr/lib")
    kvers = [d.name for d in (root / "lib/modules").glob("*")]
    if len(kvers) != 1:
        raise Fail(f"{' '.join(pkgs)}: expected one lib/modules/VERSION, found {kvers}")
    kver = kvers[0]
    images = [p for p in (root / f"boot/vmlinuz-{kver}", root / f"lib/modules/{kver}/vmlinuz")
              if p.is_file()]
    if not images:
        raise Fail(f"{' '.join(pkgs)}: no vmlinuz for {kver}")
    return root, kver, images[0]


def _copy_modules(paths: list[str], dest: Path, kver: str) -> list[str]:
    """Each module once, decompressed, into dest; return their names in load order."""
    order: list[str] = []
    for path in paths:
        src = Path(path)
        base = re.sub(r"\.ko(\.\w+)?$", ".ko", src.name)
        if base in order:
            continue
        if src.suffix == ".xz":
            data = lzma.decompress(src.read_bytes())
        elif src.suffix == ".zst":
            data = subprocess.run(["zstd", "-dcq", str(src)], capture_output=True,
                                  check=True).stdout
        elif src.suffix == ".ko":
            data = src.read_bytes()
        else:
            raise Fail(f"{kver}: cannot decompress module {src.name}")
        (dest / base).write_bytes(data)
        order.append(base)
    return order
