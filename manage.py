#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

from __future__ import annotations

import os
import sys


def main() -> None:
    if sys.argv[1:2] == ["rungateway"]:  # no collector passes over the start's objects (D118)
        from common.start_collector import pause_for_start

        pause_for_start()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
