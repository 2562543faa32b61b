"""The hostile suite's process fixtures are the e2e suite's (real gateway processes on loopback)."""

from tests.e2e.conftest import (  # noqa: F401 (fixtures)
    e2e_database_url,
    mock_worker_process,
    server,
    spawn,
    start_gateway,
)
