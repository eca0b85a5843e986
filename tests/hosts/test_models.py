"""Rules that live on the fleet's models."""

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError

from hosts.forms import HostForm
from hosts.models import EngineConfig, Host
from tests.factories import make_config, make_deployment, make_gpu, make_host, ssh_private_key

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


@pytest.mark.parametrize("address", ["gpu01.lab.example", "10.0.0.7", "::1", "[fe80::1]"])
def test_valid_addresses(address):
    Host(name="h", address=address, port=22, transport="ssh").full_clean()


@pytest.mark.parametrize("address", ["gpu01; rm -rf /", "$(reboot)", "a b", "-oProxyCommand=x"])
def test_addresses_that_could_smuggle_commands_are_refused(address):
    with pytest.raises(ValidationError, match="not a host name or IP address"):
        Host(name="h", address=address, port=22, transport="ssh").full_clean()


def test_port_range_and_labels():
    with pytest.raises(ValidationError) as err:
        Host(
            name="h", address="h", port=70000, labels={"Bad Key": "x"}, agent_tls=True
        ).full_clean()
    assert set(err.value.message_dict) == {"port", "labels"}


def test_form_parses_labels_and_defaults_port_by_transport():
    form = HostForm(
        {
            "name": "n1",
            "address": "10.1.1.1",
            "transport": "ssh",
            "ssh_username": "ops",
            "ssh_private_key": ssh_private_key(),
            "labels": "zone=eu-1, rack=r7",
            "hourly_price": "3.10",
        }
    )
    assert form.is_valid(), form.errors
    host = form.save()
    assert host.port == 22 and host.labels == {"zone": "eu-1", "rack": "r7"}
    agent = HostForm(
        {
            "name": "n2",
            "address": "10.1.1.2",
            "transport": "agent",
            "agent_tls": "on",  # an agent on another machine is reached over TLS
            "agent_token": "t0ken",
            "labels": "",
            "hourly_price": "0",
        }
    )
    assert agent.is_valid() and agent.save().port == 9100


def test_form_reports_a_malformed_label():
    form = HostForm(
        {"name": "n", "address": "h", "transport": "ssh", "labels": "zone", "hourly_price": "1"}
    )
    assert not form.is_valid()
    assert "is not key=value" in str(form.errors["labels"])


def test_engine_configs_are_numbered_and_immutable():
    deployment = make_deployment()
    v1 = make_config(deployment, {"max_num_seqs": 256})
    v2 = make_config(deployment, {"max_num_seqs": 512, "gpu_memory_utilization": 0.9})
    assert (v1.version, v2.version) == (1, 2)
    assert v2.previous() == v1
    assert v2.diff(v1) == {"gpu_memory_utilization": (None, 0.9), "max_num_seqs": (256, 512)}
    v1.settings = {"max_num_seqs": 1}
    with pytest.raises(ValueError, match="immutable"):
        v1.save()
    assert EngineConfig.objects.get(pk=v1.pk).settings == {"max_num_seqs": 256}


def test_engine_config_versions_are_unique_per_deployment():
    deployment = make_deployment()
    make_config(deployment)
    with pytest.raises(IntegrityError):
        EngineConfig.objects.create(deployment=deployment, version=1, settings={})


def test_active_config_must_belong_to_the_deployment():
    a, b = make_deployment(), make_deployment()
    foreign = make_config(b)
    a.active_config = foreign
    with pytest.raises(ValidationError, match="another deployment"):
        a.clean()


def test_deleting_a_deployment_takes_its_configs_with_it():
    deployment = make_deployment()
    deployment.active_config = make_config(deployment)
    deployment.save()
    deployment.delete()
    assert not EngineConfig.objects.exists()


def test_gpu_index_unique_per_host():
    host = make_host()
    make_gpu(host, index=0)
    with pytest.raises(IntegrityError):
        make_gpu(host, index=0, uuid="GPU-other")
