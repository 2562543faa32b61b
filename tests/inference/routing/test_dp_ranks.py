"""The data-parallel rank an attempt takes under --dp-aware (inference/routing/dp_ranks.py): round
robin by in-flight count without a load report, the least loaded rank by the load monitor's report
plus the requests in flight, a rank given back when its attempt ends, and no rank at all for a
worker without ranks."""

from __future__ import annotations

from inference.routing.dp_ranks import give_back, take_rank
from inference.routing.workers import WorkerHandle, WorkerLoad, WorkerRecord, WorkerStatus


def handle(dp_ranks: int) -> WorkerHandle:
    record = WorkerRecord(
        id="w", url="http://w:1", model_id="m", runtime_type="sglang", status=WorkerStatus.READY, dp_ranks=dp_ranks
    )
    return WorkerHandle(record, WorkerLoad())


def test_a_worker_without_ranks_takes_none() -> None:
    for size in (0, 1):
        worker = handle(size)
        assert take_rank(worker) is worker and worker.dp_rank is None
        give_back(worker)  # nothing to give back
        assert worker.load.rank_in_flight == []


def test_ranks_go_round_robin_when_nothing_is_in_flight() -> None:
    worker = handle(3)
    taken = []
    for _ in range(6):
        attempt = take_rank(worker)
        taken.append(attempt.dp_rank)
        assert attempt.record is worker.record and attempt.load is worker.load and attempt.id == worker.id
        give_back(attempt)
    assert taken == [0, 1, 2, 0, 1, 2]
    assert worker.load.rank_in_flight == [0, 0, 0]


def test_the_rank_with_fewest_requests_in_flight_is_taken() -> None:
    worker = handle(2)
    first, second = take_rank(worker), take_rank(worker)
    assert {first.dp_rank, second.dp_rank} == {0, 1}
    give_back(first)
    # The rank still busy is avoided until its request ends.
    assert take_rank(worker).dp_rank == first.dp_rank
    assert worker.load.rank_in_flight == [1, 1]


def test_the_load_report_steers_to_the_least_loaded_rank() -> None:
    worker = handle(2)
    worker.load.engine_load = (
        {"dp_rank": 0, "num_running_reqs": 4, "num_waiting_reqs": 2},
        {"dp_rank": 1, "num_running_reqs": 1, "num_waiting_reqs": 0},
    )
    taken = [take_rank(worker).dp_rank for _ in range(5)]
    # Rank 1 (reported 1) until the requests this process put on it (in no report yet) make it 6.
    assert taken == [1, 1, 1, 1, 1]
    assert {take_rank(worker).dp_rank, take_rank(worker).dp_rank} == {0, 1}  # a tie at 6, then each once
    assert worker.load.rank_in_flight == [1, 6]


def test_a_report_for_a_rank_outside_the_size_is_ignored() -> None:
    worker = handle(2)
    worker.load.engine_load = ({"dp_rank": 7, "num_running_reqs": 100, "num_waiting_reqs": 0},)
    assert [take_rank(worker).dp_rank for _ in range(2)] == [0, 1]
