"""Room in every page of the GPU and host tables for the poll's updates (PostgreSQL only).

The fleet poll rewrites every GPU's newest reading every second (4,000 row updates a
second at 500 hosts × 8 GPUs). None of the columns it sets is indexed, so PostgreSQL can
update a row in place on its own page (a HOT update: no index entry written, the old version
pruned on the page without waiting for VACUUM), but only where the page has room. At the
default fillfactor of 100 it had none: 6 % of the updates were HOT, the GPU table grew to
88 MB for 4,000 rows in 30 s and PostgreSQL spent most of its poll time on index writes and
dead rows (``scripts/bench_fleet.py`` prints the share now). Rows written before this
migration move to pages with room as they are updated."""

from django.db import migrations

TABLES = ("hosts_gpu", "hosts_host")
FILLFACTOR = 50


def set_fillfactor(apps, schema_editor, value=FILLFACTOR):
    if schema_editor.connection.vendor != "postgresql":
        return  # SQLite (embedded) has no such setting, nor the fleet
    for table in TABLES:
        schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {int(value)})")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("hosts", "0009_gpu_sample_hours"),
    ]

    operations = [migrations.RunPython(set_fillfactor, reset_fillfactor)]
