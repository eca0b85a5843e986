from django.apps import AppConfig


class HostsConfig(AppConfig):
    name = "hosts"

    def ready(self):
        # Models and services load only once Django's app registry is ready (AppConfig.ready).
        from controlpanel.services import register_secret_rule
        from hosts import checks  # noqa: F401 - registers the system checks
        from hosts.engines.redaction import is_secret
        from hosts.services import occupancy, operations

        # An apply or restart under way holds its deployment (see hosts.services.occupancy).
        occupancy.register("hosts.operation", operations.occupants)
        # The audit log (a lower layer) masks what the engines' specs mark secret.
        register_secret_rule(is_secret)
