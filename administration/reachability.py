"""Whether a worker answers its probes, logged once per change: the first failed probe logs why
(the connection error, the HTTP status, or the gRPC status), and the first answer after failures
logs that it answers; the retries in between log nothing. Registration's discovery loop
(administration/registration.py) and the health checks (administration/health.py) keep one each
per worker. A reason names the worker's URL (which never carries credentials, D25) and never a key.
"""

from __future__ import annotations

import logging

__all__ = ["Reachability"]

log = logging.getLogger(__name__)


class Reachability:
    """One worker's probe outcomes, as ``what`` (registration, health check) sees them."""

    __slots__ = ("url", "what", "failing", "failures")

    def __init__(self, url: str, what: str) -> None:
        self.url = url
        self.what = what
        self.failing = False
        self.failures = 0

    def failed(self, reason: str) -> bool:
        """A probe got no (healthy) answer: logged when the previous one answered, or at the first
        (then True: the worker just became unreachable)."""
        self.failures += 1
        if self.failing:
            return False
        self.failing = True
        log.warning("worker %s cannot be reached (%s): %s; retrying, logged again when it answers",
                    self.url, self.what, reason)
        return True

    def answered(self) -> None:
        """A probe got its answer: logged when the previous ones failed."""
        if self.failing:
            log.info("worker %s answers again (%s) after %d failed probe%s",
                     self.url, self.what, self.failures, "" if self.failures == 1 else "s")
        self.failing = False
        self.failures = 0
