"""Live events of one benchmark run: a point every second, and its status changes."""

from benchmarks.models import BenchmarkRun
from controlpanel.consumers import ObjectConsumer


class RunConsumer(ObjectConsumer):
    model = BenchmarkRun
    group_kind = "run"
    permission = "benchmarks.view_benchmarkrun"

    async def run_point(self, message):
        await self.forward(message)

    async def run_status(self, message):
        await self.forward(message)
