# Explicit permissions for applying and for acting on others' changes (changes/rules.py),
# instead of Django's change/delete permissions standing in for them. The role groups get
# them from controlpanel.roles.sync_roles after migrate.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("changes", "0001_change_requests_and_approvals"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="changerequest",
            options={
                "ordering": ["-created_at", "-pk"],
                "permissions": [
                    ("approve_changerequest", "Can approve or reject others' changes"),
                    ("apply_changerequest", "Can apply, rebase, roll back and resume changes"),
                    ("override_changerequest", "Can submit or withdraw others' changes"),
                ],
            },
        ),
    ]
