from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("benchmarks", "0012_run_shards"),
    ]

    operations = [
        migrations.AddField(
            model_name="benchmarkrun",
            name="client_health",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="The load generator's own health over the run (event-loop lag, CPU "
                "share, late sends, tokens per chunk, client errors) beside the engine's own "
                "TTFT/ITL of the same window; benchmarks.evidence judges it. Empty: not "
                "measured (older or imported).",
            ),
        ),
    ]
