"""One wake-up grid for the gateway's background loops.

On a virtual machine most of what a sleeping loop costs is the wake-up itself (the timer, the return
from epoll_wait), about 70 us each on the machines of docs/PERFORMANCE.md, not the work it then does.
A thousand health-check loops each sleeping its own jittered interval wake the process 200 times a
second. Sleeping to the next mark of a shared grid instead makes loops due at about the same time
wake together: the background grid's marks fall on the event-loop canary's (every 10 ms, spec 3), so
a fleet's probes add no wake-ups of their own, only the answers they wait for. Jitter survives at
the grid's resolution (a 5 s interval jittered by 10 % spreads over ten marks).
"""

from __future__ import annotations

import asyncio
import math

__all__ = ["CANARY_TICK_SECS", "TICK_SECS", "next_mark", "sleep_to_mark"]

CANARY_TICK_SECS = 0.01  # the event-loop canary's period (spec 3: a 10 ms canary)
TICK_SECS = 0.1  # the background loops' grid: a multiple of the canary's, so its marks are the canary's too


def next_mark(now: float, delay: float, tick: float = TICK_SECS) -> float:
    """The first mark of the ``tick`` grid after ``now + delay`` (in the event loop's clock)."""
    return (math.floor((now + delay) / tick) + 1) * tick


async def sleep_to_mark(delay: float, tick: float = TICK_SECS) -> None:
    """Sleep at least ``delay`` seconds, until the grid's next mark (at most one tick more)."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    await asyncio.sleep(next_mark(now, delay, tick) - now)
