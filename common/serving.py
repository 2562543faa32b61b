"""Where this process stands among the serving processes of one supervised gateway
(``rungateway --workers N``): the supervisor gives each its place through the environment
(``GW_RUN_DIR``, ``GW_SERVING_INDEX``, ``GW_SERVING_PROCESSES``). Read here once for every layer:
the host's leadership and load sharing (``administration.host``) and the ZMQ engine client, which
is one of N clients of a worker's engines (D69)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COUNT_ENV", "INDEX_ENV", "RUN_DIR_ENV", "ServingPlace", "serving_place"]

RUN_DIR_ENV = "GW_RUN_DIR"
INDEX_ENV = "GW_SERVING_INDEX"
COUNT_ENV = "GW_SERVING_PROCESSES"


@dataclass(frozen=True, slots=True)
class ServingPlace:
    """This process's place among the serving processes of one gateway."""

    run_dir: Path
    index: int
    count: int

    def environment(self) -> dict[str, str]:
        return {RUN_DIR_ENV: str(self.run_dir), INDEX_ENV: str(self.index), COUNT_ENV: str(self.count)}


def serving_place() -> ServingPlace | None:
    """This process's place when a supervisor started it, else None (a gateway of one process)."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return None
    return ServingPlace(Path(run_dir), int(os.environ.get(INDEX_ENV, "0")), int(os.environ.get(COUNT_ENV, "1")))
