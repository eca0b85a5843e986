"""``manage.py diagnose DEPLOYMENT [--json] [--no-live]``: run the advisor on one deployment
now and print its findings (severity, title, what was seen, the suggested change)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from changes.services import diagnosis
from hosts.models import Deployment


def find_deployment(name: str) -> Deployment:
    """``host/name`` or a deployment name that only one host uses."""
    host, _, engine = name.rpartition("/")
    found = Deployment.objects.select_related("host").filter(name=engine)
    if host:
        found = found.filter(host__name=host)
    matches = list(found[:2])
    if not matches:
        raise CommandError(f"No deployment {name!r}.")
    if len(matches) > 1:
        raise CommandError(f"Several hosts run a deployment {engine!r}: say host/{engine}.")
    return matches[0]


class Command(BaseCommand):
    help = "Run the advisor's rules on a deployment now and print what they find."

    def add_arguments(self, parser):
        parser.add_argument("deployment", help="name, or host/name")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument(
            "--no-live", action="store_true", help="do not scrape the engine's /metrics"
        )

    def handle(self, *args, **options):
        deployment = find_deployment(options["deployment"])
        evaluation = diagnosis.refresh(deployment, live=not options["no_live"])
        gathered = evaluation.gathered
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "deployment": str(deployment),
                        "engine_status": gathered.engine_status,
                        "engine_error": gathered.engine_error,
                        "findings": [f.as_dict() for f in evaluation.found],
                    },
                    indent=2,
                    default=str,
                )
            )
            return
        engine = {
            "live": "engine /metrics read live",
            "skipped": "engine not scraped (--no-live)",
        }.get(gathered.engine_status, f"engine not read: {gathered.engine_error}")
        self.stdout.write(f"{deployment}: {len(evaluation.found)} finding(s); {engine}")
        for finding in evaluation.found:
            self.stdout.write("")
            self.stdout.write(f"[{finding.severity.upper()}] {finding.title}  ({finding.rule})")
            self.stdout.write(f"  seen: {finding.seen}")
            if finding.source:
                self.stdout.write(f"  from: {finding.source}")
            self.stdout.write(f"  why:  {finding.why}")
            suggestion = finding.suggestion
            if suggestion is not None:
                flags = ", ".join(f"{k}={v}" for k, v in suggestion.settings.items())
                fix = " · ".join(x for x in (flags, suggestion.action) if x)
                self.stdout.write(f"  fix:  {fix}")
