"""Live events of one benchmark run (a point every second, and its status changes) and of one
quality probe run (its progress and status)."""

from benchmarks.models import BenchmarkRun
from benchmarks.models_quality import ProbeRun
from controlpanel.consumers import ObjectConsumer


class RunConsumer(ObjectConsumer):
    model = BenchmarkRun
    group_kind = "run"
    permission = "benchmarks.view_benchmarkrun"

    async def run_point(self, message):
        await self.forward(message)

    async def run_status(self, message):
        await self.forward(message)


class ProbeConsumer(ObjectConsumer):
    model = ProbeRun
    group_kind = "probe"
    permission = "benchmarks.view_proberun"

    async def probe_updated(self, message):
        await self.forward(message)
