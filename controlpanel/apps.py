from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_migrate, post_save


class ControlPanelConfig(AppConfig):
    name = "controlpanel"
    verbose_name = "Control panel"

    def ready(self):
        # Models and services load only once Django's app registry is ready (AppConfig.ready).
        from controlpanel import (
            checks,  # noqa: F401 - registers the system checks
            signals,  # noqa: F401 - connects the login/logout receivers
        )
        from controlpanel.pagecache import model_written
        from controlpanel.roles import sync_roles_after_migrate

        # Any write of a model a page shows makes the shared page parts new (pagecache).
        for signal in (post_save, post_delete, m2m_changed):
            signal.connect(model_written, dispatch_uid="controlpanel.pagecache")

        post_migrate.connect(sync_roles_after_migrate, dispatch_uid="controlpanel.sync_roles")
