"""The IMDS simulator (`se-bridge simulate`, bridge.simulator.command): a fleet of simulated VMs,
each with its own Scheduled Events document, served over HTTP with faults and a control API,
for tests and the demo.

In-process use (tests, the demo):

    from bridge.simulator.fleet import Fleet
    from bridge.simulator.vms import demo_vms
    from bridge.simulator import Simulator, SimulatorServer

    sim = Simulator(Fleet(demo_vms(seed=0), time_scale=60))
    with SimulatorServer(sim) as server:            # 127.0.0.1 on a free port
        imds_url = server.vm_url("web_0")           # an agent's --imds-url
        [event_id] = sim.run_scenario("user-reboot", vms=["web_0"])
        ...
        sim.approvals()                             # every StartRequests POST received

Addressing on the main port: the control API under /control (bridge.simulator.control), each VM
under /vm/<name> (append /metadata/scheduledevents, /metadata/instance, ...), and the bare
/metadata paths as the first VM. With --per-vm-ports each VM also listens on its own port
at the root paths, like the real 169.254.169.254. Fleet files: bridge.simulator.vms. Faults:
bridge.simulator.faults. Scenarios: bridge.simulator.scenarios.
"""

from bridge.simulator.core import Approval, Simulator
from bridge.simulator.server import SimulatorServer

__all__ = ["Approval", "Simulator", "SimulatorServer"]
