"""Engine operations: one at a time per deployment, refused with a reason, recorded."""

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse

from controlpanel.models import AuditEntry
from hosts.models import EngineOperation
from hosts.services import operations
from tests.factories import make_config, make_deployment

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_one_operation_at_a_time_per_deployment(operator):
    deployment = make_deployment()
    v1 = make_config(deployment)
    first = operations.request_operation(operator, deployment, "apply", v1)
    assert first.status == "queued" and first.previous_config is None
    with pytest.raises(operations.OperationRefused, match=f"#{first.pk} by {operator}"):
        operations.request_operation(operator, deployment, "restart")
    # Another deployment is not blocked.
    other = make_deployment(deployment.host)
    operations.request_operation(operator, other, "apply", make_config(other))
    assert AuditEntry.objects.filter(action="deployment.apply").count() == 2


def test_the_database_itself_refuses_a_second_active_operation():
    deployment = make_deployment()
    config = make_config(deployment)
    EngineOperation.objects.create(deployment=deployment, kind="apply", config=config)
    with pytest.raises(IntegrityError), transaction.atomic():
        EngineOperation.objects.create(
            deployment=deployment, kind="restart", config=config, status="running"
        )
    # Finished ones do not count.
    EngineOperation.objects.filter(deployment=deployment).update(status="failed")
    EngineOperation.objects.create(deployment=deployment, kind="restart", config=config)


def test_operations_need_something_to_run(operator):
    deployment = make_deployment()
    with pytest.raises(operations.OperationRefused, match="no config to restart"):
        operations.request_operation(operator, deployment, "restart")
    foreign = make_config(make_deployment())
    with pytest.raises(operations.OperationRefused, match="config version of this deployment"):
        operations.request_operation(operator, deployment, "apply", foreign)
    assert not EngineOperation.objects.exists()


def test_restart_button_reports_a_refusal(client, operator):
    deployment = make_deployment()
    client.force_login(operator)
    response = client.post(reverse("hosts:restart", args=[deployment.pk]), follow=True)
    assert "no config to restart" in response.content.decode()


def test_an_invalid_config_fails_before_the_host_is_contacted(monkeypatch, operator):
    deployment = make_deployment()
    config = make_config(deployment, {"max_num_seqs": 256}, env={"LD_PRELOAD": "/evil.so"})
    operation = operations.request_operation(operator, deployment, "apply", config)
    monkeypatch.setattr(
        operations, "transport_for", lambda host: pytest.fail("the host must not be contacted")
    )
    operations.run_operation(operation)
    operation.refresh_from_db()
    assert operation.status == "failed" and operation.outcome == "failed"
    assert "LD_PRELOAD" in operation.error and "refused before contacting" in operation.log
    deployment.refresh_from_db()
    assert deployment.active_config is None  # nothing changed
