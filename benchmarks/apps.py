from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _builtin_profiles(sender, **kwargs):
    from benchmarks.services.profiles import ensure_builtin_profiles

    ensure_builtin_profiles()


class BenchmarksConfig(AppConfig):
    name = "benchmarks"

    def ready(self):
        from benchmarks.services import probes, runs
        from hosts.services import occupancy

        post_migrate.connect(_builtin_profiles, sender=self)
        # A run queued or running holds its deployment (see hosts.services.occupancy).
        occupancy.register("benchmarks.run", runs.occupants)
        # So does a quality probe: it asks the engine too, and a restart would fail its items.
        occupancy.register("benchmarks.probe", probes.occupants)
