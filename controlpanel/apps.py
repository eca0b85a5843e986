from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ControlPanelConfig(AppConfig):
    name = "controlpanel"
    verbose_name = "Control panel"

    def ready(self):
        from controlpanel import (
            checks,  # noqa: F401 - registers the system checks
            signals,  # noqa: F401 - connects the login/logout receivers
        )
        from controlpanel.roles import sync_roles_after_migrate

        post_migrate.connect(sync_roles_after_migrate, dispatch_uid="controlpanel.sync_roles")
