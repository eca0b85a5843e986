"""Create the Viewer, Operator, Approver and Admin groups with their permissions.

Permissions normally appear only after migrate finishes (post_migrate), so they are created
here first for the models that exist at this point. Models added later get theirs through the
post_migrate hook in ControlPanelConfig.ready, which runs the same sync.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

from controlpanel.roles import ROLES, sync_roles


def create_roles(apps, schema_editor):
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    sync_roles(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"))


def delete_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=[r.name for r in ROLES]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("controlpanel", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, delete_roles)]
