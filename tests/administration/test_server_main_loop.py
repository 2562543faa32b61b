"""The uvicorn server's main loop (administration/servers.py, D94): one wake a second, each doing
uvicorn's once-a-second work, and the exit signal ends it at once."""

from __future__ import annotations

import asyncio
import signal

import uvicorn

from administration import servers
from administration.lifecycle import LIFECYCLE


def _server(tick_secs: float) -> servers._DrainingServer:
    server = servers._DrainingServer(uvicorn.Config("gateway_project.asgi:application", lifespan="off"))
    server.TICK_SECS = tick_secs
    return server


async def test_every_wake_of_the_main_loop_does_the_once_a_second_work() -> None:
    """uvicorn's loop woke ten times a second and refreshed the Date header on every tenth wake
    (counter % 10 == 0); ours wakes only when that is due: every counter it passes is a tenth."""
    server = _server(0.01)
    counters: list[int] = []

    async def on_tick(counter: int) -> bool:
        counters.append(counter)
        return len(counters) == 4

    server.on_tick = on_tick  # type: ignore[method-assign]
    await asyncio.wait_for(server.main_loop(), 30.0)
    assert counters == [0, 10, 20, 30]


async def test_the_exit_signal_ends_the_main_loop_without_waiting_for_its_tick() -> None:
    server = _server(3600.0)
    main = asyncio.ensure_future(server.main_loop())
    for _ in range(100):  # into its first wait
        await asyncio.sleep(0)
    assert not LIFECYCLE.started  # begin_drain does nothing here
    server.handle_exit(signal.SIGTERM, None)
    await asyncio.wait_for(main, 30.0)  # an hour's tick otherwise
    assert server.should_exit
