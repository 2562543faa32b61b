"""What a gateway imports to start: the libraries only some gateways use (the ``mcp`` SDK for MCP
tool loops, kubernetes_asyncio for the Kubernetes discovery provider, huggingface_hub for hub
tokenizers, numpy for an EPD worker's image pixels) are imported when first used, not by the
modules every start imports (issue 26 item 5: they were about a third of start-up's CPU). Likewise
what only some processes use (D118): Celery and kombu (a gateway with a broker, at its first job
sent; the Celery worker), daphne's server, Twisted's reactor and web module (a daphne process),
the redis client (a gateway with REDIS_URL: its channel layer and limits)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import sys
import django
django.setup()
import administration.lifecycle
import administration.management.commands.rungateway
import gateway_project.asgi
OPTIONAL = ('mcp', 'mcp_types', 'kubernetes_asyncio', 'huggingface_hub', 'numpy',
            'celery', 'kombu', 'daphne.server', 'twisted.internet.reactor', 'twisted.web.http', 'redis')
print(' '.join(sorted(name for name in OPTIONAL if name in sys.modules)))
"""


def test_the_start_path_leaves_optional_libraries_unimported() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gateway_project.settings"}
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == ""
