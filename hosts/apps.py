from django.apps import AppConfig


class HostsConfig(AppConfig):
    name = "hosts"

    def ready(self):
        from controlpanel.services import register_secret_rule
        from hosts.engines.redaction import is_secret

        # The audit log (a lower layer) masks what the engines' specs mark secret.
        register_secret_rule(is_secret)
