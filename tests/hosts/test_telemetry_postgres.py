"""The PostgreSQL statements of fleet telemetry (hosts.services.telemetry_sql): a batch is one
COPY and one UPDATE … FROM json_to_recordset(…) per table, the minute roll-up one INSERT …
SELECT … GROUP BY under an advisory lock, and each stores exactly what the ORM fallback
(SQLite's path) does. Second pass only: they need PostgreSQL."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from hosts.models import Gpu, GpuSample, GpuSampleMinute, Host
from hosts.services import telemetry_fleet, telemetry_sql
from tests.factories import make_host
from tests.hosts.test_telemetry_fleet import odd_readings, stored, two_gpu_hosts
from tests.hosts.test_telemetry_loop import servers  # noqa: F401 - the fixture
from tests.hosts.test_telemetry_rollup import (
    BASE,
    assert_same,
    expected_minutes,
    random_samples,
    stored_minutes,
    three_gpus,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_on_postgresql_a_batch_is_one_copy_and_one_update_from_json_each(postgres, monkeypatch):
    t = timezone.now()
    hosts = two_gpu_hosts(3)
    with CaptureQueriesContext(connection) as captured:
        assert telemetry_fleet.record_batch(odd_readings(hosts, t)) == 6
    sql = [q["sql"] for q in captured.captured_queries]
    assert len([s for s in sql if s.startswith("COPY hosts_gpusample")]) == 1
    assert not [s for s in sql if s.startswith("INSERT")]
    updates = [s for s in sql if s.startswith("UPDATE")]
    assert len(updates) == 2 and all("FROM json_to_recordset(" in s for s in updates), updates
    # One parameter each, whatever the batch's size: no query of thousands of placeholders.
    assert all(s.count("::json") == 1 for s in updates)
    by_sql = stored(hosts)
    assert len(by_sql[0]) == 6
    # NaN and infinity are stored as null, in the samples and in the JSON columns alike.
    host = Host.objects.get(pk=hosts[0].pk)
    assert host.host_readings["odd"] == {"load": [None, 1.5]}
    newest = Gpu.objects.get(host=hosts[0], index=0).last_sample
    assert "pcie_rx_kbps" in newest and newest["pcie_rx_kbps"] is None
    # The same readings through the ORM fallback (SQLite's path) on other hosts: the same rows.
    others = two_gpu_hosts(3)
    monkeypatch.setattr(telemetry_sql, "postgres", lambda: False)
    with CaptureQueriesContext(connection) as captured:
        telemetry_fleet.record_batch(odd_readings(others, t))
    assert any(q["sql"].startswith("INSERT") for q in captured.captured_queries)
    assert stored(others) == by_sql
    busy = GpuSample.objects.get(gpu__host=hosts[0], gpu__index=0)
    assert busy.sm_clock_mhz == 1980 and busy.mem_clock_mhz == 2619 and busy.power_w == 401.5
    assert busy.temperature_c is None and busy.pcie_tx_kbps is None
    assert busy.clocks_event_reasons == 4 and busy.pcie_rx_kbps is None


def test_on_postgresql_the_roll_up_is_one_statement_equal_to_the_orm_fallback(
    postgres, monkeypatch
):
    samples = random_samples(three_gpus(), minutes=4, seed=5)
    end = BASE + timedelta(minutes=4)
    with CaptureQueriesContext(connection) as captured:
        written = telemetry_sql.roll_up(None, end)
    statements = [q["sql"] for q in captured.captured_queries if "INSERT" in q["sql"]]
    assert len(statements) == 1 and "GROUP BY gpu_id, date_trunc('minute', time)" in statements[0]
    assert "ON CONFLICT (gpu_id, minute) DO UPDATE" in statements[0]
    assert any("pg_advisory_xact_lock" in q["sql"] for q in captured.captured_queries)
    by_sql = stored_minutes()
    assert written == len(by_sql) == 12
    GpuSampleMinute.objects.all().delete()
    monkeypatch.setattr(telemetry_sql, "postgres", lambda: False)  # the SQLite path
    telemetry_sql.roll_up(None, end)
    assert_same(stored_minutes(), by_sql)
    assert_same(by_sql, expected_minutes(samples))


@pytest.mark.django_db(transaction=True)
# Most updates HOT needs each round's old versions pruned before the next round reads the
# page: >= 90 % on a quiet machine, 138-141 of 240 (57-59 %) in CI runs with four workers
# loading it (cause not pinned down; autovacuum is off here; a failure lists what holds a
# snapshot). The bar is what tells fillfactor 50 from fillfactor 100's 6 % under load too.
@pytest.mark.timing
def test_the_poll_updates_gpus_and_hosts_in_place_on_postgresql(postgres):
    """hosts migration 0010: pages with room, so the poll's updates of the newest readings
    (no indexed column changes) are HOT updates, each second's pruning the last's versions;
    at fillfactor 100 only 6 % were (scripts/bench_fleet.py)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, reloptions FROM pg_class WHERE relname IN ('hosts_gpu', 'hosts_host')"
        )
        options = dict(cursor.fetchall())
    assert options == {"hosts_gpu": ["fillfactor=50"], "hosts_host": ["fillfactor=50"]}
    hosts = two_gpu_hosts(40)  # 80 GPU rows: pages enough that room matters
    t = timezone.now()
    for second in range(3):  # readings fill last_sample; each batch commits
        telemetry_fleet.record_batch(odd_readings(hosts, t + timedelta(seconds=second)))
    before = _updates()
    for second in range(3, 6):
        telemetry_fleet.record_batch(odd_readings(hosts, t + timedelta(seconds=second)))
    updated, hot = (a - b for a, b in zip(_updates(), before, strict=True))
    assert updated == 3 * 80 and hot >= updated / 3, (updated, hot, _holders())


def _holders() -> list[tuple]:
    """Other sessions of this database holding a snapshot or a transaction id: what keeps old
    versions from being pruned (for the message of a failure seen only on a busy machine)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, state, xact_start, backend_xid, backend_xmin,"
            " left(query, 80) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
            " AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)"
        )
        return cursor.fetchall()


def _updates() -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # counted at this statement's end
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'hosts_gpu'"
        )
        return cursor.fetchone()


def test_an_agents_nul_character_does_not_fail_the_batch_on_postgresql(postgres, servers):  # noqa: F811
    """PostgreSQL stores a NUL in neither text nor jsonb: an agent whose note or readings
    hold one (``\\u0000`` is valid JSON) must not fail the batch of every host polled with
    it — the poll's decoder drops the character (hosts.transport.agent.decode)."""
    body = b'{"time": %d, "gpus": [], "note": "disk\\u0000full", "host": {"k": "v\\u0000"}}'
    server = servers(lambda path, headers: (200, "", body % int(time.time())))
    odd = make_host(port=server.port, agent_token="t", status="online")
    fine = two_gpu_hosts(1)[0]
    telemetry_fleet.poll_hosts([odd])
    odd.refresh_from_db()
    assert odd.telemetry_note == "diskfull" and odd.host_readings == {"k": "v"}
    assert telemetry_fleet.record_batch(odd_readings([fine], timezone.now())) == 2
