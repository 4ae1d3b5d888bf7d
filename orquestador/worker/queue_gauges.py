"""The queue gauges kept current: the maintenance leader samples them every few seconds.

A maintenance pass runs every MAINTENANCE_INTERVAL_SECONDS (60 by default) and may spend
long on retention; gauges sampled only there would be up to a minute behind the queue
they describe. This loop samples them every GAUGE_SECONDS between the passes, on the
leader only, so the fleet still exposes one value (the others report 0).
"""

from __future__ import annotations

from orquestador.loop import Loop
from orquestador.worker.maintenance import MaintenanceLoop

# The most a queue gauge lags behind the database, plus one sample's own time.
GAUGE_SECONDS = 5.0


class QueueGauges(Loop):
    """Every GAUGE_SECONDS: the leader's gauges sampled again; nothing on other workers."""

    def __init__(self, maintenance: MaintenanceLoop, interval_seconds: float = GAUGE_SECONDS):
        super().__init__("queue-gauges", interval_seconds)
        self.maintenance = maintenance

    def run_once(self) -> bool:
        self.maintenance.sample_gauges_if_leader()
        return False
