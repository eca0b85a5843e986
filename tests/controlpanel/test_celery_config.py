"""Celery configuration that would only break at run time, checked up front."""

from controlpanel.celery import app


def panel_tasks():
    app.loader.import_default_modules()
    return {name: task for name, task in app.tasks.items() if not name.startswith("celery.")}


def test_tasks_are_discovered():
    assert {"hosts.tasks.check_host", "hosts.tasks.check_all_hosts"} <= set(panel_tasks())


def test_every_task_has_a_consistent_time_limit():
    conf = app.conf
    for name, task in panel_tasks().items():
        hard = task.time_limit or conf.task_time_limit
        soft = task.soft_time_limit or conf.task_soft_time_limit
        assert hard, f"{name} has no time limit"
        assert soft is None or soft <= hard, f"{name}: soft limit {soft} > hard limit {hard}"


def test_beat_schedule_names_real_tasks():
    tasks = panel_tasks()
    for entry in app.conf.beat_schedule.values():
        assert entry["task"] in tasks


def test_not_eager():
    assert not app.conf.task_always_eager


def test_redis_never_redelivers_a_task_that_is_still_running():
    """With late acks, Redis gives an unacknowledged message to another worker after the
    visibility timeout: it must outlast every task's hard limit, a 3-hour benchmark's too."""
    from django.conf import settings

    timeout = app.conf.broker_transport_options["visibility_timeout"]
    assert timeout > settings.BENCHMARK_MAX_SECONDS + 120
    assert timeout > 3600  # Redis's own default, which a 3-hour run outlasts
    for name, task in panel_tasks().items():
        hard = task.time_limit or app.conf.task_time_limit
        assert hard < timeout, f"{name}: hard limit {hard} s ≥ visibility timeout {timeout} s"


def test_visibility_timeout_follows_the_longest_benchmark(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DEBUG")}
    env.update(VAR_DIR=str(tmp_path), BENCHMARK_MAX_SECONDS="36000")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout'])",
        ],
        cwd=Path(__file__).resolve().parents[2],
        env={**env, "DJANGO_SETTINGS_MODULE": "controlpanel.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) > 36000 + 120


def test_a_killed_worker_process_gives_its_task_back():
    # The redelivered copy closes the run ("the worker stopped during the run") instead of
    # the message being acknowledged and the run left "running".
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost
