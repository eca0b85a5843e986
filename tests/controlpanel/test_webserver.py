"""The production web tier's command line (controlpanel/webserver.py)."""

import json

import pytest

from controlpanel import webserver


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_workers_default_to_the_cpus_this_process_may_use(monkeypatch):
    monkeypatch.setattr(webserver.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert webserver.web_concurrency({}) == 3
    assert webserver.web_concurrency({"WEB_CONCURRENCY": " "}) == 3
    assert flag(webserver.uvicorn_argv({}), "--workers") == "3"


def test_web_concurrency_sets_the_workers():
    assert webserver.web_concurrency({"WEB_CONCURRENCY": "5"}) == 5
    assert flag(webserver.uvicorn_argv({"WEB_CONCURRENCY": "2"}), "--workers") == "2"


@pytest.mark.parametrize("value", ["0", "-1", "many", "2.5"])
def test_a_bad_web_concurrency_stops_with_a_message(value):
    with pytest.raises(SystemExit, match="WEB_CONCURRENCY"):
        webserver.web_concurrency({"WEB_CONCURRENCY": value})


def test_command_line_keeps_the_proxy_header_rules_and_recycles_workers():
    argv = webserver.uvicorn_argv({"WEB_CONCURRENCY": "2"})
    assert argv[:2] == ["uvicorn", "controlpanel.webapp:application"]
    assert flag(argv, "--host") == "0.0.0.0" and flag(argv, "--port") == "8000"
    assert "--proxy-headers" in argv
    # Never "*" by default: X-Forwarded-For is believed only from the proxy.
    assert flag(argv, "--forwarded-allow-ips") == "127.0.0.1"
    assert int(flag(argv, "--limit-max-requests")) > int(flag(argv, "--limit-max-requests-jitter"))
    assert int(flag(argv, "--timeout-graceful-shutdown")) < 10  # compose's stop grace period

    env = {"FORWARDED_ALLOW_IPS": "10.0.0.5", "WEB_HOST": "127.0.0.1", "WEB_PORT": "9001"}
    argv = webserver.uvicorn_argv({**env, "WEB_CONCURRENCY": "1"})
    assert flag(argv, "--forwarded-allow-ips") == "10.0.0.5"
    assert flag(argv, "--host") == "127.0.0.1" and flag(argv, "--port") == "9001"


def test_uvicorn_accepts_the_command_line():
    # Every flag exists in the installed uvicorn (a renamed flag would stop the container).
    from uvicorn.main import main as uvicorn_main

    argv = webserver.uvicorn_argv({"WEB_CONCURRENCY": "2"})
    ctx = uvicorn_main.make_context("uvicorn", argv[1:])
    assert ctx.params["workers"] == 2 and ctx.params["proxy_headers"] is True
    assert ctx.params["forwarded_allow_ips"] == "127.0.0.1"


def test_web_workers_pool_database_connections_unless_told_otherwise():
    # Persistent per-thread connections leak under ASGI (one per finished request's thread).
    assert webserver.server_environ({})["DATABASE_POOL_SIZE"] == str(webserver.DEFAULT_POOL_SIZE)
    assert webserver.server_environ({"DATABASE_POOL_SIZE": " "})["DATABASE_POOL_SIZE"] == "10"
    assert webserver.server_environ({"DATABASE_POOL_SIZE": "4"})["DATABASE_POOL_SIZE"] == "4"
    assert webserver.server_environ({"DATABASE_POOL_SIZE": "0"})["DATABASE_POOL_SIZE"] == "0"
    assert webserver.server_environ({"X": "y"})["X"] == "y"  # the rest passes through


def test_web_processes_yield_the_cpu_to_the_telemetry_poll():
    assert webserver.web_nice({}) == webserver.DEFAULT_NICE == 5
    assert webserver.web_nice({"WEB_NICE": "0"}) == 0
    assert webserver.web_nice({"WEB_NICE": " 19 "}) == 19


@pytest.mark.parametrize("value", ["-1", "20", "low"])
def test_a_bad_web_nice_stops_with_a_message(value):
    with pytest.raises(SystemExit, match="WEB_NICE"):
        webserver.web_nice({"WEB_NICE": value})


def test_main_lowers_the_priority_before_uvicorn_takes_over(monkeypatch):
    calls = []
    monkeypatch.setenv("WEB_NICE", "7")
    monkeypatch.setattr(webserver, "lower_priority", lambda n: calls.append(("nice", n)))
    monkeypatch.setattr(
        webserver.os, "execvpe", lambda file, argv, env: calls.append(("exec", argv[2]))
    )
    webserver.main()
    assert calls == [("nice", 7), ("exec", "uvicorn")]


@pytest.mark.parametrize("leader", [True, False])
def test_a_session_leader_lowers_its_sessions_weight_too(monkeypatch, tmp_path, leader):
    autogroup = tmp_path / "autogroup"
    autogroup.write_text("/autogroup-1 nice 0\n")
    niced = []
    monkeypatch.setattr(webserver, "AUTOGROUP", str(autogroup))
    monkeypatch.setattr(webserver.os, "nice", niced.append)
    monkeypatch.setattr(webserver.os, "getsid", lambda pid: 42 if leader else 1)
    monkeypatch.setattr(webserver.os, "getpid", lambda: 42)
    webserver.lower_priority(5)
    assert niced == [5]
    assert autogroup.read_text() == ("5" if leader else "/autogroup-1 nice 0\n")
    webserver.lower_priority(0)  # 0: nothing to change
    assert niced == [5]


def test_no_autogroup_is_no_error(monkeypatch, tmp_path):
    monkeypatch.setattr(webserver, "AUTOGROUP", str(tmp_path / "absent" / "autogroup"))
    monkeypatch.setattr(webserver.os, "nice", lambda n: None)
    monkeypatch.setattr(webserver.os, "getsid", lambda pid: 42)
    monkeypatch.setattr(webserver.os, "getpid", lambda: 42)
    webserver.lower_priority(5)


def test_the_served_application_runs_with_a_tuned_collector():
    """controlpanel.webapp (what uvicorn serves): the same application as controlpanel.asgi,
    with the start-up objects frozen, the first generation's threshold raised and a shorter
    GIL switch interval. In a
    process of its own: the test run's collector is left as it is."""
    import subprocess
    import sys

    code = (
        "import gc, json; base = gc.get_threshold()\n"
        "from controlpanel import asgi, webapp\n"
        "import sys\n"
        "print(json.dumps([webapp.application is asgi.application, gc.get_freeze_count(),"
        " list(gc.get_threshold()), list(base), sys.getswitchinterval()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    same, frozen, threshold, default, switch = json.loads(out.strip().splitlines()[-1])
    assert same
    assert frozen > 10_000  # Django and the apps, out of the collector's walks
    assert threshold == [10_000, 50, 100] and default[0] == 700
    assert switch == pytest.approx(0.001)  # CPython's default: 0.005
