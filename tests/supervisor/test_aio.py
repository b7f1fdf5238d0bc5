"""The asyncio client: the same protocol as Client, awaitable."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from supervisor.client.aio import AsyncClient
from supervisor.client import NoSuchManifest


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 15))


@pytest.mark.timeout(30)
def test_spawn_wait_and_stdio(shared_sv):
    async def main():
        client = AsyncClient(str(shared_sv.socket_path))
        assert (await client.ping())["event"] == "pong"
        r, w = os.pipe()
        child = await client.spawn("sh", ["echo out; exit 3"], stdin=0, stdout=w, stderr=w)
        os.close(w)
        assert child.report.enforced and child.report.no_new_privs
        assert await child.wait() == 3
        assert child.exited["reason"] == "exited"
        assert os.read(r, 100) == b"out\n"
        child.close()
        os.close(r)
    _run(main())


@pytest.mark.timeout(30)
def test_signal_and_context_manager(shared_sv):
    async def main():
        client = AsyncClient(str(shared_sv.socket_path))
        null = os.open(os.devnull, os.O_RDWR)
        async with await client.spawn("sleep", ["30"], stdin=null, stdout=null, stderr=null) as child:
            await child.terminate()
            assert await child.wait() == -signal.SIGTERM
            assert child.exited["reason"] == "signalled_on_request"
        async with await client.spawn("sleep", ["30"], stdin=null, stdout=null, stderr=null) as child:
            pass  # leaving the block kills it
        assert child.returncode == -signal.SIGKILL
        os.close(null)
    _run(main())


@pytest.mark.timeout(30)
def test_errors_are_exceptions(shared_sv):
    async def main():
        client = AsyncClient(str(shared_sv.socket_path))
        with pytest.raises(NoSuchManifest):
            await client.spawn("no-such-server")
    _run(main())


@pytest.mark.timeout(30)
def test_a_signal_or_the_blocks_end_while_another_task_waits(shared_sv):
    """asyncio.subprocess's way: one task awaits wait(), another terminates
    the child or leaves its `async with`: neither waits for the other."""
    async def main():
        client = AsyncClient(str(shared_sv.socket_path))
        null = os.open(os.devnull, os.O_RDWR)
        child = await client.spawn("sleep", ["30"], stdin=null, stdout=null, stderr=null)
        waiting = asyncio.create_task(child.wait())
        await asyncio.sleep(0.2)
        await asyncio.wait_for(child.terminate(), 5)
        assert await waiting == -signal.SIGTERM
        child.close()
        async with await client.spawn("sleep", ["30"], stdin=null, stdout=null, stderr=null) as child:
            waiting = asyncio.create_task(child.wait())
            await asyncio.sleep(0.2)
        assert await waiting == -signal.SIGKILL
        os.close(null)
    _run(main())
