"""What handing one answer to the client came to, as the answer tells the turn runner: whether it
ended cleanly and what it used. Every ``forward(writer)`` and every attempts loop ``deliver`` returns
one, so the usage a surface already tallied reaches the runner that accounts the request
(docs/DECISIONS.md D66) instead of being counted a second time."""

from __future__ import annotations

from dataclasses import dataclass

from inference.accounting.entry import TokenUsage

__all__ = ["Delivered", "CLEAN", "BROKEN", "LATER"]


@dataclass(slots=True)
class Delivered:
    """Not frozen: a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``,
    three times a plain one's cost on every answer (D85); nothing changes one once made."""

    clean: bool = True  # False: the upstream broke off after the response started
    usage: TokenUsage | None = None  # as the answer reported it; None: it reported none
    # The request goes on after its answer (a background Responses run): whoever runs it on
    # accounts it when it ends, not the route that answered.
    later: bool = False


CLEAN = Delivered(True)  # an answer without usage (an error relayed, a local answer)
BROKEN = Delivered(False)
LATER = Delivered(True, None, True)
