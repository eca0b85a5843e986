from django.apps import AppConfig


class ChangesConfig(AppConfig):
    name = "changes"

    def ready(self):
        from changes.services import apply
        from hosts.services import occupancy

        # The change holding a deployment's lock holds the deployment for everything else
        # too; its own pipeline passes it as the owner (see hosts.services.occupancy).
        occupancy.register("changes.lock", apply.occupants)
