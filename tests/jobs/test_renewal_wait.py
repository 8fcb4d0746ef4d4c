"""The worst lease renewal wait of the last hour (issue #22) has one source, the lease
keeper's gauge: `gateway_status` shows the gauge, and each heartbeat writes it into the
instance row that `agent-cli-gateway instances` shows. A real gateway, a real store."""

from __future__ import annotations

import pytest

from gateway.model import InstanceRow
from tests.jobs.conftest import MakeSettings, StartGateway
from tests.waiting import wait_for

pytestmark = pytest.mark.anyio

WAIT_S = 30.0  # a few heartbeats of FAST_LEASE, with a loaded box's slack


async def test_each_heartbeat_writes_the_gauges_worst_renewal_wait_into_the_instance_row(
    make_settings: MakeSettings, start_gateway: StartGateway
) -> None:
    gateway = await start_gateway(make_settings())
    manager = await gateway.manager()
    assert gateway.leases is not None

    async def own_row_with_a_wait() -> InstanceRow | None:
        for row in await manager.store.list_instances():
            if row.instance_id == manager.instance_id and row.renewal_wait_ms_max_1h is not None:
                return row
        return None

    row = await wait_for(own_row_with_a_wait, WAIT_S)
    worst = gateway.leases.renewal_pending_ms.worst()
    # The row holds the worst wait as of its heartbeat; the gauge may have grown since.
    assert worst is not None and 0 <= row.renewal_wait_ms_max_1h <= worst
    # gateway_status reads the same gauge (a heartbeat in between can only raise it).
    reported = gateway.connection_report()["renewal_pending_ms_max_1h"]
    assert isinstance(reported, float | int) and reported >= round(worst, 1)
