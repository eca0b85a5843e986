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
