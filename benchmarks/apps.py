from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _builtin_profiles(sender, **kwargs):
    # A post_migrate handler: the services load after the app registry, as its models need.
    from benchmarks.services.profiles import ensure_builtin_profiles

    ensure_builtin_profiles()


def _builtin_probe_sets(sender, **kwargs):
    # The built-in quality probe sets, stored (a new version when their files changed) so a
    # fresh install lists them and a change can be probed at once.
    from benchmarks.services.probes import sync_builtin_sets

    sync_builtin_sets()


class BenchmarksConfig(AppConfig):
    name = "benchmarks"

    def ready(self):
        # Models and services load only once Django's app registry is ready (AppConfig.ready).
        from benchmarks.services import probes, runs
        from hosts.services import occupancy

        post_migrate.connect(_builtin_profiles, sender=self)
        post_migrate.connect(_builtin_probe_sets, sender=self)
        # A run queued or running holds its deployment (see hosts.services.occupancy).
        occupancy.register("benchmarks.run", runs.occupants)
        # So does a quality probe: it asks the engine too, and a restart would fail its items.
        occupancy.register("benchmarks.probe", probes.occupants)
