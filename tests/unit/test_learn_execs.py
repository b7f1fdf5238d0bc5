"""learn/execs.py and profiles.regular_file: what learn (unconfined, maybe
root) opens of what a server named as a program or in a `#!` line: regular
files only; a FIFO or a device is never opened (a watchdog's open arms it)."""
from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

from supervisor.manifests import profiles
from supervisor.learn import execs


@pytest.mark.parametrize("target", ["fifo", "/dev/null"])
def test_a_shebang_naming_no_regular_file_is_neither_opened_nor_listed(tmp_path: Path, target: str) -> None:
    if target == "fifo":
        target = str(tmp_path / "fifo")
        os.mkfifo(target)
    script = tmp_path / "s"
    script.write_text(f"#!{target}\n")
    opened: list[str] = []
    real_open = os.open

    def watch(path: str, flags: int, *args: int, **kw: int) -> int:
        if not flags & os.O_PATH:
            opened.append(path)
        return real_open(path, flags, *args, **kw)

    with mock.patch.object(os, "open", watch):
        assert execs.chain(str(script), {}) == []
        with pytest.raises(OSError, match="not a regular file"):
            profiles.regular_file(target)
    assert target not in opened, opened


def test_a_regular_interpreter_is_listed(tmp_path: Path) -> None:
    script = tmp_path / "s"
    script.write_text("#!/bin/sh\n")
    assert execs.chain(str(script), {})[0] == ("/bin/sh", f"the #! line of {script}")
