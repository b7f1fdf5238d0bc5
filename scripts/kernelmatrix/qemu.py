"""What every guest boots with: a busybox initramfs that reaches the host's root over virtio 9p, and the qemu command line."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .config import HERE
from .proc import Fail, sha, spawn


def finish_initramfs(info: dict[str, Any], log: Path) -> dict[str, Any]:
    """busybox-static + the modules + initramfs-init as /init: a plain
    (uncompressed) newc cpio, rebuilt when the init script or busybox change."""
    kdir, init = Path(info["dir"]), HERE / "initramfs-init"
    busybox = Path(shutil.which("busybox", path="/usr/bin:/bin") or "/bin/busybox")
    initrd = kdir / f"initrd-{sha(init, busybox)}.img"
    if not initrd.exists():
        stage = kdir / "initramfs"
        shutil.rmtree(stage, ignore_errors=True)
        for d in ("bin", "lib/modules", "proc", "sys", "dev", "newroot"):
            (stage / d).mkdir(parents=True)
        shutil.copy(busybox, stage / "bin/busybox")
        shutil.copy(init, stage / "init")
        for m in info["modules"]:
            shutil.copy(kdir / "modules" / m, stage / "lib/modules" / m)
        (stage / "modules").write_text("\n".join(info["modules"]) + "\n")
        files = sorted(str(p.relative_to(stage)) for p in stage.rglob("*"))
        tmp = initrd.with_suffix(".tmp")
        with open(tmp, "wb") as out, open(log, "ab") as err:
            p = subprocess.run(["cpio", "-o", "-H", "newc", "-R", "0:0", "--quiet"],
                               input="\n".join(files).encode(), stdout=out,
                               stderr=err, cwd=stage)
        if p.returncode:
            raise Fail(f"cpio failed building {initrd} (log: {log})")
        tmp.rename(initrd)
        shutil.rmtree(stage)
    return dict(info, initrd=str(initrd))


TCG = ["-accel", "tcg", "-cpu", "max"]
KVM = ["-accel", "kvm", "-cpu", "host"]
KVM_PROBE_TIMEOUT = 90  # seconds for a KVM guest to boot and run /bin/true


def choose_accel(info: dict[str, Any], log: Path) -> tuple[list[str], str]:
    """KVM where it works (the host's CPU at native speed), else TCG (any
    host; slower, which GUEST_TIMEOUT allows for): (qemu's options, why).
    That /dev/kvm opens is not enough: under nested virtualisation a KVM
    guest was seen to stop at its first cmpxchg16b ("emulation failure"),
    so a guest of `info`'s kernel must boot and run /bin/true first."""
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC))
    except OSError as e:
        return TCG, f"TCG: /dev/kvm: {e.strerror}"
    log.write_text("")
    spawn(command(dict(info, accel=KVM), ["GUEST_CMD=/bin/true", "MK_KEEP_TMP="], []), log, KVM_PROBE_TIMEOUT)
    if "MULTIKERNEL-EXIT=0" in log.read_text(errors="replace"):
        return KVM, "KVM"
    return TCG, f"TCG: a KVM guest did not run /bin/true within {KVM_PROBE_TIMEOUT}s (log: {log})"


def command(info: dict[str, Any], guest_params: list[str], append: list[str]) -> list[Any]:
    """qemu booting a prepared kernel and its initramfs on the host's root,
    with info["accel"] (TCG if unset); append: the kernel's own parameters."""
    return ["qemu-system-x86_64", *info.get("accel", TCG), "-m", "1024", "-smp", "1",
            "-nodefaults", "-display", "none", "-serial", "stdio", "-no-reboot",
            "-kernel", Path(info["dir"]) / "vmlinuz", "-initrd", info["initrd"],
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,"
            "readonly=on,multidevs=remap",
            "-append", " ".join(["console=ttyS0", "quiet", "panic=-1",
                                 f"MK_INIT={HERE / 'guest-init'}", *append, *guest_params])]
