"""App configurations of the project's own making."""

from __future__ import annotations

from django.apps import AppConfig


class DaphneCommands(AppConfig):
    """daphne's app (its ``runserver``, serving ASGI) without daphne's own AppConfig module, which
    imports ``daphne.server`` to install Twisted's asyncio reactor at once in every process that sets
    Django up: 0.1 s of a gateway's start, and a reactor only a daphne process wants (D118). A daphne
    process imports the server itself before it serves: ``rungateway --server daphne``
    (administration/servers.py) and daphne's ``runserver`` command module. daphne's own check (its
    app listed before staticfiles, so that its runserver is the one) is not registered: it looks for
    daphne's AppConfig class; this one is listed first in INSTALLED_APPS."""

    name = "daphne"
    label = "daphne"
    verbose_name = "Daphne"
