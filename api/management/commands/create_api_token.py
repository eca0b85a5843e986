"""``manage.py create_api_token USERNAME --name NAME [--expires-days N]``: prints the token once."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from api import tokens


class Command(BaseCommand):
    help = "Make an API token for a user and print it (only this once: the panel keeps its hash)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", required=True, help="what uses the token, e.g. ci-nightly")
        parser.add_argument("--expires-days", type=int, default=None)

    def handle(self, *args, username, name, expires_days, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user {username!r}.")
        if not user.is_active:
            raise CommandError(f"User {username!r} is inactive: a token of theirs would not work.")
        try:
            _, raw = tokens.issue(user, name, expires_days, actor=None)
        except tokens.TokenRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(raw)
