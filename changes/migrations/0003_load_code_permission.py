# Proposing or approving a change that turns on a flag that loads code (trust_remote_code)
# needs its own permission, held by Admins only (changes/rules.py, controlpanel/roles.py).

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("changes", "0002_explicit_apply_and_override_permissions"),
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
                    ("load_code_changerequest", "Can propose or approve flags that load code"),
                ],
            },
        ),
    ]
