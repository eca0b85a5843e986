"""``manage.py serve``: the panel over ASGI (uvicorn), with the embedded worker when embedded."""

from __future__ import annotations

import uvicorn
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from controlpanel import private_files, static_collect
from controlpanel.celery import app
from controlpanel.embedded import EmbeddedRuntime
from hosts.demo import DemoFleet, bring_up


class Command(BaseCommand):
    help = (
        "Serve the panel with uvicorn. Embedded mode (REDIS_URL unset) also runs a Celery "
        "worker and beat in this process. --demo first migrates, collects static files (when "
        "they changed), creates the demo logins and seeds a demo fleet, then starts the "
        "fleet's local host agents (each supervising a simulated GPU server)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--demo", action="store_true", help="prepare and seed demo data")
        parser.add_argument(
            "--no-worker", action="store_true", help="do not start the embedded worker and beat"
        )
        parser.add_argument(
            "--no-demo-fleet",
            dest="demo_fleet",
            action="store_false",
            help="with --demo: do not start the local demo agents and simulators",
        )

    def handle(self, *args, host, port, demo, no_worker, demo_fleet, **options):
        # Everything this process (and the demo agents it starts) writes from now on is
        # owner-only, and what earlier runs left in var/ is made so: the database holds the
        # sessions, var/ the secret key and the demo password.
        private_files.private_umask()
        private_files.private_dir(settings.VAR_DIR)
        private_files.restrict_tree(settings.VAR_DIR)
        if demo:
            call_command("migrate", interactive=False, verbosity=0)
            static_collect.collect_if_changed()
            call_command("seed_demo", stdout=self.stdout)

        runtime = fleet = None
        if settings.EMBEDDED and not no_worker:
            runtime = EmbeddedRuntime(app, concurrency=settings.EMBEDDED_WORKER_CONCURRENCY)
            runtime.start()
            if demo and demo_fleet:
                fleet = self._start_demo_fleet(runtime)
        elif not settings.EMBEDDED:
            self.stdout.write("Production mode: run `celery -A controlpanel worker` and `beat`.")

        self.stdout.write(self.style.SUCCESS(f"Control panel on http://{host}:{port}/"))
        self.stdout.flush()
        try:
            self._serve(host, port)
        finally:
            if fleet is not None:
                fleet.stop()
            if runtime is not None:
                runtime.stop()

    def _start_demo_fleet(self, runtime: EmbeddedRuntime) -> DemoFleet:
        """The demo's local agents, brought up; on failure everything started is stopped."""
        fleet = DemoFleet(settings.VAR_DIR)
        try:
            fleet.start()
        except RuntimeError as exc:
            fleet.stop()
            runtime.stop()
            raise CommandError(str(exc)) from None
        bring_up()
        self.stdout.write(f"Demo fleet: {len(fleet.procs)} local agents with simulated GPUs.")
        return fleet

    def _serve(self, host: str, port: int) -> None:
        try:
            # One process: the in-memory broker and channel layer cannot span several.
            uvicorn.run(
                "controlpanel.asgi:application",
                host=host,
                port=port,
                workers=1,
                lifespan="off",
                log_level=settings.LOGGING["root"]["level"].lower(),
                # Keep the panel's logging (settings.LOGGING): its handler redacts reset links
                # and URL passwords, uvicorn's access log included.
                log_config=None,
                proxy_headers=True,
            )
        except SystemExit as exc:
            raise CommandError(f"uvicorn stopped: {exc}") from None
