"""What a supervised gateway's serving processes share on their host: the leader lock (one holder,
taken over once released), the leader's load reports (applied by the others), the registry version
in the store (a change anywhere is seen by every process's poll)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from administration.host import HostPeers, Leadership, host_peers, read_load_reports, write_load_reports
from inference.routing.registry import WorkerRegistry
from inference.routing.workers import WorkerRecord, WorkerStatus


def _registry() -> WorkerRegistry:
    registry = WorkerRegistry()
    registry.publish(
        [WorkerRecord(id=name, url=f"http://{name}:1", model_id="m", runtime_type="sglang", status=WorkerStatus.READY)
         for name in ("a", "b")],
        {},
    )
    return registry


async def test_one_leader_at_a_time_and_a_takeover_when_it_leaves(tmp_path: Path) -> None:
    elected: list[str] = []

    async def on(name: str) -> None:
        elected.append(name)

    first = Leadership(tmp_path / "leader.lock", lambda: on("first"))
    second = Leadership(tmp_path / "leader.lock", lambda: on("second"))
    assert first.try_acquire()
    assert (tmp_path / "leader.lock").read_text() == str(os.getpid())
    waiting = asyncio.create_task(second.run())
    await asyncio.sleep(0.2)
    assert not second.leader and elected == []
    first.release()
    await asyncio.wait_for(waiting, 5)
    assert second.leader and elected == ["second"]
    second.release()


def test_followers_apply_the_leaders_load_reports(tmp_path: Path) -> None:
    leader, follower = _registry(), _registry()
    load = leader.load_of("a")
    assert load is not None
    load.engine_load = ({"dp_rank": 0, "num_waiting_reqs": 7},)
    load.overloaded = True
    leader.loads_polled_at = 1234.5
    path = tmp_path / "loads.json"
    write_load_reports(path, leader)
    seen = read_load_reports(path, follower, 0.0)
    a, b = follower.load_of("a"), follower.load_of("b")
    assert a is not None and b is not None
    assert a.engine_load == ({"dp_rank": 0, "num_waiting_reqs": 7},) and a.overloaded
    assert b.engine_load is None and not b.overloaded
    assert follower.loads_polled_at == 1234.5
    a.overloaded = False
    assert read_load_reports(path, follower, seen) == seen and not a.overloaded  # unchanged file: not read
    assert read_load_reports(tmp_path / "missing.json", follower, 0.0) == 0.0


def test_a_supervisor_gives_each_process_its_place(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert host_peers() is None
    for name, value in HostPeers(tmp_path, 1, 3).environment().items():
        monkeypatch.setenv(name, value)
    assert host_peers() == HostPeers(tmp_path, 1, 3)
