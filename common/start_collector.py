"""The cyclic garbage collector across a gateway's start (D118).

A gateway's start allocates some 200,000 container objects that live as long as the process
(modules, classes, settings, the URL and admin registries, the fleet's records). With the collector
on, CPython's default thresholds ran about 500 passes over them while they were being made, four of
them full: a quarter of the CPU from exec to ``/liveness``, all of it finding nothing to free.
``manage.py rungateway`` pauses the collector before the first import; the gateway resumes it once
started (:meth:`administration.lifecycle.GatewayLifecycle.astart`, or the supervisor before it
supervises), with everything alive by then frozen out of its passes.
"""

from __future__ import annotations

import gc

__all__ = ["pause_for_start", "resume_after_start"]


def pause_for_start() -> None:
    """No collection until :func:`resume_after_start` (a start allocates, it does not free)."""
    gc.disable()


def resume_after_start(thresholds: tuple[int, int, int] | None = None) -> None:
    """Everything alive now is kept out of the collector's passes (full passes otherwise walk it and
    stall requests), the collector's ``thresholds`` set if given, and the collector on.

    After a paused start, no collection first: such a start leaves some 4,000 unreachable objects (a
    few hundred KiB, RSS at ``/liveness`` the same with or without), and a full pass over the
    200,000 took 0.15 s of the start's CPU. They are frozen with the rest. A start that migrated the
    store collects the migrations' garbage itself (the rungateway command). With the collector on
    (a gateway not started by ``manage.py rungateway``: an ASGI server given the application, a
    test process starting gateway after gateway), whatever it has not freed yet is collected
    first, as before: frozen garbage is never freed, and a process that starts many gateways
    would keep all of it."""
    if gc.isenabled():
        gc.collect()
    gc.freeze()
    if thresholds is not None:
        gc.set_threshold(*thresholds)
    gc.enable()
