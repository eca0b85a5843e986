"""Telemetry at fleet scale (hosts.services.telemetry_fleet): batches of readings stored with
one insert, shards that partition the fleet, hosts polled concurrently over HTTP from the
fleet simulator (hosts.agent.fleet), a slow host that does not hold back the others."""

import asyncio
import os
import re
import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from hosts.agent.fleet import Fleet
from hosts.models import Gpu, GpuSample, Host
from hosts.services import telemetry as single
from hosts.services import telemetry_fleet, telemetry_loop, telemetry_sql
from hosts.services.transports import forget_transport
from tests.factories import make_gpu, make_host
from tests.hosts.test_telemetry_store import reading

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def two_gpu_hosts(n):
    # Online already: the steady state (a host coming online is told so once, per host).
    hosts = []
    for _ in range(n):
        host = make_host(status="online")
        for i in range(2):
            make_gpu(host, index=i, uuid=f"GPU-aaaa-{i}-{host.pk}")
        hosts.append(host)
    return hosts


def readings_for(hosts, util=(50, 0), t=None):
    out = []
    for host in Host.objects.filter(pk__in=[h.pk for h in hosts]).prefetch_related(
        "gpus", "deployments__gpus"
    ):
        r = reading(util=util, t=t)
        for item in r["gpus"]:
            item["uuid"] = f"GPU-aaaa-{item['index']}-{host.pk}"
        out.append((host, r))
    return out


def inserts(captured):
    # INSERT on SQLite, COPY on PostgreSQL (hosts.services.telemetry_sql).
    return [q["sql"] for q in captured.captured_queries if q["sql"].startswith(("INSERT", "COPY"))]


def test_a_batch_is_one_insert_and_the_same_queries_for_n_or_3n_hosts():
    counts = []
    for n in (3, 9):
        batch = readings_for(two_gpu_hosts(n))
        with CaptureQueriesContext(connection) as captured:
            stored = telemetry_fleet.record_batch(batch)
        assert stored == 2 * n
        sample_inserts = [s for s in inserts(captured) if "gpusample" in s]
        assert len(sample_inserts) == 1, sample_inserts
        counts.append(len(captured.captured_queries))
    assert counts[0] == counts[1], counts  # nothing per host or per GPU


def test_a_batch_stores_the_values_and_the_newest_readings():
    hosts = two_gpu_hosts(2)
    telemetry_fleet.record_batch(readings_for(hosts, util=(73.5, 4)))
    for host in hosts:
        busy = GpuSample.objects.get(gpu__host=host, gpu__index=0)
        assert busy.utilization_pct == 73.5 and busy.power_w == 400.0
        assert busy.memory_used_bytes == 60 * 2**30 and busy.clocks_event_reasons == 0
        idle = Gpu.objects.get(host=host, index=1)
        assert idle.last_sample["utilization_gpu_pct"] == 4 and idle.last_sample_at is not None
        host.refresh_from_db()
        assert host.status == "online" and host.host_readings["cpu_percent"] == 12.5
        assert host.last_seen_at == busy.time


def test_shards_partition_the_hosts_exactly():
    hosts = {make_host().pk for _ in range(10)}
    seen = [{h.pk for h in telemetry_fleet.shard_hosts(shard, 3)} & hosts for shard in range(3)]
    assert set().union(*seen) == hosts
    assert sum(len(s) for s in seen) == len(hosts)
    assert all(seen)


def test_a_shard_still_running_skips():
    from django.core.cache import cache

    cache.add("telemetry-shard:4:1", 1, timeout=30)
    try:
        assert telemetry_fleet.poll_shard(1, 4).skipped
    finally:
        cache.delete("telemetry-shard:4:1")
    assert not telemetry_fleet.poll_shard(1, 4).skipped


def test_beat_enqueues_one_task_per_shard(settings, monkeypatch):
    from hosts import tasks

    sent = []
    monkeypatch.setattr(
        tasks.poll_telemetry_shard, "apply_async", lambda args, **kw: sent.append(args)
    )
    settings.TELEMETRY_SHARDS = 3
    assert tasks.poll_telemetry() == 3
    assert sent == [(0, 3), (1, 3), (2, 3)]


# --- over HTTP, against the fleet simulator ------------------------------------------------------
@pytest.fixture
def fleet_agents():
    """Simulated agents on free ports in a background loop; ``hold`` is an event the agent
    numbered ``slow`` waits on before answering (set it to let it answer)."""
    fleet = Fleet(3, "h100-sxm:8", "fleet-token")
    loop = asyncio.new_event_loop()
    hold = threading.Event()
    state = {"slow": None, "connections": 0, "requests": []}

    async def start():
        servers = []
        for number in range(3):

            async def handle(reader, writer, number=number):
                state["connections"] += 1
                if number == state["slow"]:
                    await loop.run_in_executor(None, hold.wait, 30)
                await fleet.serve_connection(number, reader, writer)

            servers.append(await asyncio.start_server(handle, "127.0.0.1", 0))
        return [s.sockets[0].getsockname()[1] for s in servers]

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    ports = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    hosts = [make_host(port=port, agent_token="fleet-token") for port in ports]
    yield hosts, hold, state
    hold.set()
    telemetry_loop.close_clients()  # kept-alive connections to servers about to stop

    async def drain():  # the servers' handlers end once their connections are closed
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    asyncio.run_coroutine_threadsafe(drain(), loop).result(15)
    for host in hosts:
        forget_transport(host.pk)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def due(hosts):
    return [h for h in telemetry_fleet.due_hosts(0, 1) if h.pk in {x.pk for x in hosts}]


def test_hosts_polled_over_http_are_stored_with_their_gpus(fleet_agents):
    hosts, _hold, _state = fleet_agents
    hosts[2].agent_token = "wrong"
    hosts[2].save()
    result = telemetry_fleet.poll_hosts(due(hosts))
    assert result.hosts == 3 and result.failed == 1 and result.samples == 16
    for host in hosts[:2]:
        host.refresh_from_db()
        assert host.status == "online" and host.gpus.count() == 8  # inventory learned
        assert GpuSample.objects.filter(gpu__host=host).count() == 8
    hosts[2].refresh_from_db()
    assert hosts[2].status == "auth_failed"


def test_a_slow_host_does_not_hold_back_the_others(fleet_agents, settings, monkeypatch):
    hosts, hold, state = fleet_agents
    settings.TRANSPORT_TIMEOUT = 60  # the slow host is slow, not down
    telemetry_fleet.poll_hosts(due(hosts))  # learn the inventories first
    state["slow"] = 1
    telemetry_loop.close_clients()  # the fixture delays a new connection, not a kept-alive one
    batches = []
    real = telemetry_fleet.record_batch

    def recording(readings, **kw):
        batches.append({h.pk for h, _ in readings})
        hold.set()  # the slow host answers only once the first batch is being written
        return real(readings, **kw)

    monkeypatch.setattr(telemetry_fleet, "record_batch", recording)
    result = telemetry_fleet.poll_hosts(due(hosts), deadline=0.5)
    assert batches[0] == {hosts[0].pk, hosts[2].pk}
    assert batches[1:] == [{hosts[1].pk}]
    assert result.samples == 24 and result.failed == 0


# --- PostgreSQL's COPY and UPDATE … FROM (VALUES …) ----------------------------------------------
FIELDS = [name for name, _kind in telemetry_sql.SAMPLE_COLUMNS]


def odd_readings(hosts, t):
    """Readings with values the columns must convert: floats for integer columns, numbers as
    strings, a missing value, one that is no number, and NaN / infinity (which Python's JSON
    parser lets an agent send but no JSON column can hold)."""
    batch = readings_for(hosts, util=(73.5, 4), t=t)
    for _host, r in batch:
        gpu = r["gpus"][0]
        gpu.update(sm_clock_mhz=1980.0, mem_clock_mhz="2619", power_w="401.5")
        gpu.update(temperature_c=None, pcie_tx_kbps="N/A", clocks_event_reasons=4)
        gpu.update(pcie_rx_kbps=float("nan"))
        r["host"]["odd"] = {"load": [float("inf"), 1.5]}
    return batch


def stored(hosts):
    """What a batch stored for ``hosts``, without the rows' and hosts' own ids."""
    pks = [h.pk for h in hosts]
    samples = sorted(
        (s.gpu.index, s.time, *(getattr(s, f) for f in FIELDS))
        for s in GpuSample.objects.filter(gpu__host__in=pks).select_related("gpu")
    )
    gpus = sorted(
        (g.index, g.last_sample_at, sorted(g.last_sample.items()))
        for g in Gpu.objects.filter(host__in=pks)
    )
    host_rows = sorted(
        (
            h.host_readings["cpu_percent"],
            h.host_readings.get("odd"),
            h.telemetry_source,
            h.telemetry_note,
            h.last_seen_at,
        )
        for h in Host.objects.filter(pk__in=pks)
    )
    return samples, gpus, host_rows


def test_the_sample_columns_are_the_single_paths_fields():
    assert set(FIELDS) == set(single.SAMPLE_FIELDS)


# --- the per-process GPU map ---------------------------------------------------------------------
def test_the_gpu_map_picks_up_a_new_host_and_a_new_gpu():
    hosts = two_gpu_hosts(2)
    telemetry_fleet.record_batch(readings_for(hosts))
    assert {hosts[0].pk, hosts[1].pk} <= telemetry_fleet.gpu_map().keys()
    new = two_gpu_hosts(1)[0]  # saved GPUs: the version in the cache changes
    assert new.pk in telemetry_fleet.gpu_map()
    assert telemetry_fleet.record_batch(readings_for([*hosts, new])) == 6
    assert GpuSample.objects.filter(gpu__host=new).count() == 2
    # A GPU added without signals (a bulk insert) is found when a reading names it.
    Gpu.objects.bulk_create([Gpu(host=new, index=2, uuid=f"GPU-aaaa-2-{new.pk}", memory_bytes=1)])
    ((host, r),) = readings_for([new])
    r["gpus"].append({**r["gpus"][1], "index": 2, "uuid": f"GPU-aaaa-2-{new.pk}"})
    assert telemetry_fleet.record_batch([(host, r)]) == 3
    assert GpuSample.objects.filter(gpu__host=new, gpu__index=2).count() == 1
    assert f"GPU-aaaa-2-{new.pk}" in telemetry_fleet.gpu_map()[new.pk][0]


def test_the_gpu_map_is_rebuilt_when_a_gpu_changes_elsewhere():
    host = two_gpu_hosts(1)[0]
    before = telemetry_fleet.gpu_map()
    assert telemetry_fleet.gpu_map() is before  # nothing changed: the same map, no query
    gpu = Gpu.objects.get(host=host, index=1)
    gpu.uuid = "GPU-swapped"
    gpu.save()
    after = telemetry_fleet.gpu_map()
    assert "GPU-swapped" in after[host.pk][0] and f"GPU-aaaa-1-{host.pk}" not in after[host.pk][0]
    gpu.delete()
    assert 1 not in telemetry_fleet.gpu_map()[host.pk][1]


# --- the per-process event loop ------------------------------------------------------------------
def test_polls_reuse_the_process_loop_and_its_kept_alive_connections(fleet_agents):
    hosts, _hold, state = fleet_agents
    telemetry_fleet.poll_hosts(due(hosts))
    loop = telemetry_loop.running_loop()
    session = loop.session
    opened = state["connections"]  # the poll's, and the inventory's of each new host
    result = telemetry_fleet.poll_hosts(due(hosts))
    assert result.samples == 24 and telemetry_loop.running_loop() is loop
    assert loop.session is session and state["connections"] == opened  # no new connection


def test_the_loop_serves_several_threads_at_once():
    results = []

    def ask(n):
        results.append(telemetry_loop.run(asyncio.sleep(0.05, result=n), timeout=10))

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert sorted(results) == list(range(6))


def _in_forked_child(conn):
    # The parent's loop thread does not exist here: a new loop must be started and work.
    fresh = telemetry_loop._state is None
    answer = telemetry_loop.run(asyncio.sleep(0, result=42), timeout=10)
    conn.send((fresh, answer, telemetry_loop.running_loop().pid == os.getpid()))


def test_a_forked_worker_process_gets_its_own_loop():
    import multiprocessing

    telemetry_loop.run(asyncio.sleep(0))  # the parent's loop is running
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_in_forked_child, args=(child,))
    process.start()
    assert parent.poll(20)
    assert parent.recv() == (True, 42, True)
    process.join(10)


def test_a_late_shard_task_skips_the_hosts_just_read(settings):
    """A busy worker runs a shard's tasks late and back to back: the late ones read only what
    is due, so the poll slows down under load instead of reading hosts twice a second."""
    from datetime import timedelta

    from django.utils import timezone

    settings.TELEMETRY_INTERVAL = 1.0
    now = timezone.now()
    just_read = make_host(name="just-read", status="online", last_poll_at=now)
    due_now = make_host(name="due", status="online", last_poll_at=now - timedelta(seconds=0.6))
    never = make_host(name="never", status="online")
    down = make_host(name="down", status="unreachable", last_poll_at=now)  # backoff decides
    kept = telemetry_fleet.not_just_polled([just_read, due_now, never, down], now)
    assert [h.name for h in kept] == ["due", "never", "down"]
    later = now + timedelta(seconds=0.5)
    assert "just-read" in [h.name for h in telemetry_fleet.not_just_polled([just_read], later)]


def test_the_pollers_second_read_decrypts_no_secret(fleet_agents, monkeypatch):
    """The poll reads its hosts every second without their encrypted columns: secrets are
    read (in one query, in the poll's own thread) only for a host whose transport is still to
    be built, and once built none is read or decrypted again."""
    from controlpanel import crypto

    hosts, _hold, _state = fleet_agents
    telemetry_fleet.poll_hosts(due(hosts))  # the inventories learned (a full read each)
    for host in hosts:
        forget_transport(host.pk)
    decrypted = []
    real = crypto.decrypt
    monkeypatch.setattr(crypto, "decrypt", lambda value: decrypted.append(value) or real(value))
    with CaptureQueriesContext(connection) as first:
        result = telemetry_fleet.poll_hosts(due(hosts))
    assert result.failed == 0 and result.samples == 24
    assert len(decrypted) == 3  # the three agents' tokens, once each
    assert len(_secret_reads(first)) == 1
    decrypted.clear()
    with CaptureQueriesContext(connection) as second:
        result = telemetry_fleet.poll_hosts(due(hosts))
    assert result.failed == 0 and result.samples == 24
    assert decrypted == []
    assert _secret_reads(second) == []


def _secret_reads(captured) -> list[str]:
    """The statements that select a host's token (not the flag of whether one is stored)."""
    selected = re.compile(r'"agent_token"(,| FROM)')
    return [q["sql"] for q in captured.captured_queries if selected.search(q["sql"])]


@pytest.mark.parametrize(
    ("transport", "fields", "expected"),
    [
        ("agent", {"agent_token": "t"}, True),
        ("agent", {"agent_token": ""}, False),
        ("ssh", {"ssh_username": "ops", "ssh_private_key": "KEY"}, True),
        ("ssh", {"ssh_username": "", "ssh_private_key": "KEY"}, False),
        ("ssh", {"ssh_username": "ops", "ssh_private_key": ""}, False),
    ],
)
def test_a_host_read_without_secrets_knows_whether_they_are_stored(transport, fields, expected):
    from hosts.models import without_secrets

    host = make_host(transport=transport, **{"agent_token": "", **fields})
    read = without_secrets(Host.objects.filter(pk=host.pk)).get()
    assert host.has_credentials is expected
    with CaptureQueriesContext(connection) as captured:
        assert read.has_credentials is expected
    assert len(captured) == 0  # from the flags: no secret read
