"""New deployments from the panel (issue 21): the service's rules and fit check, the page that
offers it, and the first start queued as an ordinary apply of config v1."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from controlpanel.models import AuditEntry
from hosts.models import Deployment, EngineConfig, EngineOperation
from hosts.services.deployments import (
    CREATED_NOTE,
    DeploymentRefused,
    create_deployment,
    fit_check,
    free_port,
    settings_from_flags,
)
from tests.factories import make_deployment, make_gpu, make_host

pytestmark = pytest.mark.django_db

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


@pytest.fixture
def host():
    """A real (not simulated) host with two 80 GB H100s."""
    host = make_host(name="gpu-real", address="10.0.0.5", agent_tls=True)
    make_gpu(host, index=0)
    make_gpu(host, index=1)
    return host


def data(**kw) -> dict:
    values = dict(
        name="llama",
        engine="vllm",
        engine_version="0.11.0",
        model=LLAMA_8B,
        gpus=[0],
        port=8100,
        launch_style="process",
        settings={},
    )
    values.update(kw)
    return values


def refusal(host, **kw) -> dict[str, list[str]]:
    with pytest.raises(DeploymentRefused) as caught:
        create_deployment(None, host, data(**kw))
    assert not Deployment.objects.filter(name=kw.get("name", "llama"), host=host).exists()
    return caught.value.errors


# --- the service -------------------------------------------------------------------------------
def test_creation_makes_the_deployment_config_v1_audit_row_and_apply(host, operator):
    deployment, fit = create_deployment(
        operator, host, data(gpus=[1], settings={"max_num_seqs": 128})
    )
    assert deployment.runner == "engine" and deployment.simulator == {}
    assert [g.index for g in deployment.gpus.all()] == [1]
    config = EngineConfig.objects.get(deployment=deployment)
    assert config.version == 1 and config.note == CREATED_NOTE and config.created_by == operator
    assert config.settings == {"max_num_seqs": 128}
    assert config.env == {"CUDA_VISIBLE_DEVICES": "1"}  # the engine sees the GPU it was given
    entry = AuditEntry.objects.get(action="deployment.create")
    assert entry.actor == operator and entry.after["gpus"] == [1]
    assert entry.after["model"] == LLAMA_8B and entry.after["config_version"] == 1
    operation = EngineOperation.objects.get(deployment=deployment)
    assert (operation.kind, operation.status, operation.config) == ("apply", "queued", config)
    assert operation.requested_by == operator
    assert deployment.status == "starting" and deployment.active_config is None
    assert fit.fits is True and fit.kv_tokens > 100_000


def test_several_gpus_set_the_tensor_parallel_size(host):
    deployment, fit = create_deployment(None, host, data(gpus=[0, 1], model=LLAMA_70B))
    config = deployment.configs.get()
    assert config.settings["tensor_parallel_size"] == 2
    assert config.env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert fit.fits is True and fit.facts["tensor_parallel"] == 2


def test_on_a_simulated_host_the_runner_is_the_simulator_sized_by_the_gpus():
    host = make_host(name="sim-x", labels={"simulated": "yes"})
    make_gpu(host, index=0, name="NVIDIA A100-SXM4-80GB")
    make_gpu(host, index=1, name="NVIDIA A100-SXM4-80GB")
    deployment, _ = create_deployment(None, host, data(gpus=[0, 1]))
    assert deployment.runner == "simulator"
    assert deployment.simulator["gpu"] == "a100-80g" and deployment.simulator["num_gpus"] == 2


def test_port_taken_on_the_host_is_refused(host):
    make_deployment(host, name="other", port=8100)
    assert "port" in refusal(host, port=8100)


def test_port_taken_by_another_host_on_the_same_machine_is_refused(host):
    # The demo fleet's simulated hosts all live on 127.0.0.1: one machine, one set of ports.
    make_deployment(make_host(address=host.address), name="other", port=8100)
    assert "taken" in refusal(host, port=8100)["port"][0]


def test_invalid_port_is_refused(host):
    assert "port" in refusal(host, port=70000)


def test_name_that_cannot_be_a_unit_name_is_refused(host):
    assert "name" in refusal(host, name="../etc")


def test_name_taken_on_the_host_is_refused(host):
    make_deployment(host, name="llama", port=8200)
    with pytest.raises(DeploymentRefused) as caught:
        create_deployment(None, host, data())
    assert "name" in caught.value.errors


def test_gpu_used_by_another_deployment_is_refused(host):
    other = make_deployment(host, name="llama-8b", port=8200)
    other.gpus.set([host.gpus.get(index=0)])
    errors = refusal(host, gpus=[0])
    assert errors["gpus"] == ["GPU 0 is used by llama-8b."]


def test_gpu_of_another_host_is_refused(host):
    elsewhere = make_host(name="gpu-other")
    make_gpu(elsewhere, index=5)
    assert "has no GPU 5" in refusal(host, gpus=[5])["gpus"][0]


def test_no_gpu_is_refused(host):
    assert "gpus" in refusal(host, gpus=[])


def test_weights_that_do_not_fit_are_refused_with_the_numbers(host):
    errors = refusal(host, model=LLAMA_70B, gpus=[0])
    message = errors["gpus"][0]
    assert "do not fit" in message and "GiB" in message
    assert not EngineOperation.objects.exists() and not AuditEntry.objects.exists()


@pytest.mark.parametrize("version", ["latest", "", "0.11 beta"])
def test_unreadable_engine_version_is_refused(host, version):
    assert "engine_version" in refusal(host, engine_version=version)


def test_unknown_engine_is_refused(host):
    assert "engine" in refusal(host, engine="tgi")


def test_unknown_setting_is_refused(host):
    assert "no_such_flag" in refusal(host, settings={"no_such_flag": 1})["settings"][0]


def test_flag_the_engine_version_lacks_is_refused(host):
    # --enable-log-requests came with vLLM 0.10.1.
    errors = refusal(host, engine_version="0.10.0", settings={"enable_log_requests": True})
    assert "added in 0.10.1" in errors["settings"][0]
    with pytest.raises(ValueError, match="unrecognized arguments"):
        settings_from_flags("vllm", "0.10.0", "--enable-log-requests")


@pytest.mark.parametrize("model", ["--trust-remote-code", "org/model; rm -rf /", "a b"])
def test_bad_model_text_is_refused(host, model):
    assert "model" in refusal(host, model=model)


def test_unknown_model_warns_but_creates(host):
    deployment, fit = create_deployment(None, host, data(model="acme/house-model-13b"))
    assert deployment.pk and fit.fits is None
    assert "unknown" in fit.message and "could not be checked" in fit.message


def test_fit_reports_the_kv_cache_left():
    host = make_host()
    gpu = make_gpu(host, index=0)
    fit = fit_check("vllm", LLAMA_8B, [gpu], {"gpu_memory_utilization": 0.5})
    # 80 GiB × 0.5 = 40 GiB usable, ~15 GiB of bf16 weights: ~25 GiB of KV cache.
    assert fit.fits and fit.budget_gib == 40.0 and 24 < fit.kv_cache_gib < 26
    # Llama-3.1-8B: 2 × 32 layers × 8 KV heads × 128 × 2 bytes = 128 KiB a token.
    assert 24 * 2**30 / 131072 < fit.kv_tokens < 26 * 2**30 / 131072


def test_flags_are_read_by_the_engines_parser():
    settings = settings_from_flags("vllm", "0.11.0", "--max-num-seqs 64\n--enable-prefix-caching")
    assert settings == {"max_num_seqs": 64, "enable_prefix_caching": True}
    with pytest.raises(ValueError):
        settings_from_flags("vllm", "0.11.0", "--max-num-seqs many")


def test_free_port_skips_ports_in_use(host):
    assert free_port(host) == 8000 and free_port(host, "sglang") == 30000
    make_deployment(host, name="a", port=8000)
    assert free_port(host) == 8001


def test_free_port_on_the_panels_own_machine_skips_what_listens_there(listener):
    """The demo fleet's hosts are 127.0.0.1, where `make run` serves the panel on 8000: the
    offer continues the engines' range and passes over ports in use on this machine."""
    host = make_host(address="127.0.0.1")
    make_deployment(host, name="a", port=listener - 1)
    offered = free_port(host)
    assert offered > listener  # not the engine default, not the listening port


# --- the page ----------------------------------------------------------------------------------
def form(**kw) -> dict:
    values = dict(
        name="llama",
        engine="vllm",
        engine_version="0.11.0",
        model=LLAMA_8B,
        gpus=["0"],
        port="8100",
        launch_style="process",
        flags="--max-num-seqs 128",
    )
    values.update(kw)
    return values


def test_page_offers_gpus_catalogue_and_free_port(client, operator, host):
    other = make_deployment(host, name="llama-8b", port=8000)
    other.gpus.set([host.gpus.get(index=1)])
    client.force_login(operator)
    page = client.get(reverse("hosts:deployment_new", args=[host.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "GPU 0 · NVIDIA H100 80GB HBM3 · 80 GiB" in text
    assert "GPU 1 · NVIDIA H100 80GB HBM3 · 80 GiB · used by llama-8b" in text
    assert 'value="1" disabled' in text or "disabled" in text.split("used by llama-8b")[0][-400:]
    assert (
        '<datalist id="catalogue-models">' in text
        and 'value="meta-llama/Llama-3.1-70B-Instruct"' in text
    )
    assert page.context["form"]["port"].value() == 8001
    assert "Create deployment" in text


def test_operator_creates_through_the_page(client, operator, host):
    client.force_login(operator)
    response = client.post(reverse("hosts:deployment_new", args=[host.pk]), form())
    assert response.status_code == 302 and response["Location"] == host.get_absolute_url()
    deployment = Deployment.objects.get(host=host, name="llama")
    assert deployment.configs.get().settings == {"max_num_seqs": 128}
    assert deployment.operations.get().kind == "apply"
    page = client.get(host.get_absolute_url()).content.decode()
    assert "created, starting" in page


def test_the_page_refuses_code_loading_options_to_an_operator(client, operator, host):
    client.force_login(operator)
    url = reverse("hosts:deployment_new", args=[host.pk])
    response = client.post(url, form(flags="--trust-remote-code"))
    assert response.status_code == 200
    errors = " ".join(response.context["form"].errors["flags"])  # the field they were typed in
    assert "--trust-remote-code" in errors and "only an Admin" in errors
    assert not Deployment.objects.filter(host=host, name="llama").exists()


def test_refusal_keeps_what_was_typed_and_shows_the_fit(client, operator, host):
    client.force_login(operator)
    response = client.post(
        reverse("hosts:deployment_new", args=[host.pk]), form(model=LLAMA_70B, name="big")
    )
    assert response.status_code == 200
    text = response.content.decode()
    assert "do not fit" in text and 'value="big"' in text and LLAMA_70B in text
    assert "--max-num-seqs 128" in text
    assert response.context["fit"].fits is False
    assert not Deployment.objects.filter(name="big").exists()


def test_bad_flag_is_an_error_on_the_flags_field(client, operator, host):
    client.force_login(operator)
    response = client.post(
        reverse("hosts:deployment_new", args=[host.pk]), form(flags="--max-num-seqs lots")
    )
    assert response.status_code == 200
    assert "flags" in response.context["form"].errors
    assert not Deployment.objects.exists()


def test_check_fit_only_checks(client, operator, host):
    client.force_login(operator)
    response = client.post(
        reverse("hosts:deployment_new", args=[host.pk]), {**form(), "check_fit": "1"}
    )
    assert response.status_code == 200 and response.context["fit"].fits is True
    assert "for the KV cache" in response.content.decode()
    assert not Deployment.objects.exists()


def test_viewer_is_forbidden(client, viewer, host):
    client.force_login(viewer)
    url = reverse("hosts:deployment_new", args=[host.pk])
    assert client.get(url).status_code == 403
    assert client.post(url, form()).status_code == 403
    assert not Deployment.objects.exists()


def test_form_is_csrf_protected(operator, host):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post(reverse("hosts:deployment_new", args=[host.pk]), form())
    assert response.status_code == 403
    assert not Deployment.objects.exists()


def test_host_page_offers_new_deployment_to_operators_only(client, operator, viewer, host):
    url = reverse("hosts:deployment_new", args=[host.pk])
    client.force_login(operator)
    page = client.get(host.get_absolute_url()).content.decode()
    assert "No deployments on this host" in page and url in page
    client.force_login(viewer)
    assert url not in client.get(host.get_absolute_url()).content.decode()


def test_sglang_deployment_uses_its_own_memory_fraction_and_tp_flag(host):
    deployment, fit = create_deployment(
        None, host, data(engine="sglang", engine_version="0.5.3", gpus=[0, 1], port=30000)
    )
    assert deployment.configs.get().settings["tp_size"] == 2
    # SGLang's own default (server_args): what is left after reserving activations, < 0.9.
    assert 0.8 < fit.facts["memory_fraction"] < 0.9
    print(fit.message)


# --- against a real host agent simulating its GPUs ---------------------------------------------
@pytest.mark.integration
def test_created_deployment_starts_on_a_simulated_agent_host(tmp_path, operator):
    """What the demo fleet does: the host's agent simulates two A100s, the inventory says so,
    the new deployment runs the simulator on the chosen GPU and becomes running once healthy."""
    from hosts.models import Gpu, HostCheck
    from hosts.services import checks, operations, telemetry
    from tests.conftest import free_port as free_tcp_port
    from tests.hosts.agent.conftest import AgentProcess

    agent = AgentProcess(tmp_path, "--simulate", "a100-80g:2").start()
    try:
        host = make_host(name="sim-agent", port=agent.port, agent_token=agent.token)
        checks.run_host_check(HostCheck.objects.create(host=host))
        host.refresh_from_db()
        assert host.telemetry_source == "simulator" and host.gpus.count() == 2
        deployment, fit = create_deployment(
            operator, host, data(gpus=[1], port=free_tcp_port(), model="qwen2.5-7b")
        )
        assert deployment.runner == "simulator" and fit.fits
        assert deployment.simulator["gpu"] == "a100-80g" and deployment.simulator["num_gpus"] == 1
        operation = deployment.operations.get()
        operations.run_operation(EngineOperation.objects.get(pk=operation.pk))
        operation.refresh_from_db()
        assert operation.outcome == "ready", (operation.error, operation.engine_log)
        deployment.refresh_from_db()
        assert deployment.status == "running"
        assert deployment.active_config == deployment.configs.get(version=1)
        # The engine runs on the GPU it was given: telemetry finds its memory there.
        telemetry.poll_telemetry()
        gpu1 = Gpu.objects.get(host=host, index=1)
        assert gpu1.last_sample["memory_used_bytes"] > 40 * 2**30
        assert list(deployment.gpus.all()) == [gpu1]
    finally:
        agent.stop()


def test_the_suggested_models_are_repositories_that_resolve_to_their_catalogue_entry():
    """The form suggests what a real engine loads (a Hugging Face repository) where one is
    known; each must mean the same catalogue entry, or the fit check would size another model."""
    from hosts.engines.catalog import HF_REPOS, MODELS, resolve_model
    from hosts.services.deployments import catalogue_models

    suggested = [name for name, _ in catalogue_models()]
    assert len(suggested) == len(MODELS)
    for key, repo in HF_REPOS.items():
        assert resolve_model(repo).key == key, repo
        assert repo in suggested
    assert "meta-llama/Llama-3.1-8B-Instruct" in suggested
