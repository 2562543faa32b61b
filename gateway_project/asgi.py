"""ASGI entry point: a Channels ProtocolTypeRouter.

HTTP goes through a Channels URLRouter: data-plane routes (/v1/* inference, /generate, /rerank,
probes) to plain async ASGI handlers, everything else (admin console, control-plane APIs) to Django.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

# The admin console's CSS and JS are served from the installed apps (no collectstatic step).
django_app = ASGIStaticFilesHandler(get_asgi_application())

from typing import Any, cast  # noqa: E402

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from administration.lifecycle import LIFECYCLE  # noqa: E402
from inference.api.routes import data_plane_routes  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": LIFECYCLE.gate(URLRouter([*data_plane_routes(), re_path(r"", cast(Any, django_app))])),
        "lifespan": LIFECYCLE.lifespan,
    }
)
