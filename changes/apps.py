from django.apps import AppConfig


class ChangesConfig(AppConfig):
    name = "changes"

    def ready(self):
        # Models and services load only once Django's app registry is ready (AppConfig.ready).
        from changes.services import apply, sweeps
        from hosts.services import occupancy

        # The change holding a deployment's lock holds the deployment for everything else
        # too; its own pipeline passes it as the owner (see hosts.services.occupancy).
        occupancy.register("changes.lock", apply.occupants)
        # A tuning sweep's lanes hold their deployments while trials run (their restarts,
        # benchmarks and the restore are the sweep's own parts).
        occupancy.register("changes.sweep", sweeps.occupants)
