"""manage.py ensure_admin: create or update a staff superuser for the admin console, non-interactively.

The username comes from --username or GW_ADMIN_USERNAME, the password from GW_ADMIN_PASSWORD (or the
file named by GW_ADMIN_PASSWORD_FILE) or --password. Prefer the environment for the password: a
command-line argument is visible to other users of the machine. Running it again resets the
password and makes sure the account is active, staff and superuser.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from common.envconf import env_secret, env_str


class Command(BaseCommand):
    help = "Create or update a staff superuser (for the admin console) from options or the environment."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", help="default: GW_ADMIN_USERNAME")
        parser.add_argument("--password", help="default: GW_ADMIN_PASSWORD or the file GW_ADMIN_PASSWORD_FILE")
        parser.add_argument("--email", default="", help="stored on the account (optional)")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"] or env_str("GW_ADMIN_USERNAME")
        password = options["password"] or env_secret("GW_ADMIN_PASSWORD")
        if not username:
            raise CommandError("no username: pass --username or set GW_ADMIN_USERNAME")
        if not password:
            raise CommandError("no password: set GW_ADMIN_PASSWORD (or GW_ADMIN_PASSWORD_FILE) or pass --password")
        User = get_user_model()
        with transaction.atomic():
            user = User.objects.select_for_update().filter(**{User.USERNAME_FIELD: username}).first()
            created = user is None
            if user is None:
                user = User(**{User.USERNAME_FIELD: username})
            try:
                validate_password(password, user)
            except ValidationError as exc:
                raise CommandError("password refused: " + " ".join(exc.messages)) from None
            user.set_password(password)
            user.is_active = True
            user.is_staff = True
            user.is_superuser = True
            if options["email"]:
                user.email = options["email"]
            user.save()
        self.stdout.write(self.style.SUCCESS(f"{'Created' if created else 'Updated'} staff superuser {username!r}"))
