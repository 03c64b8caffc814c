"""The client of a GRRM reward service: what the trainer bridge and ``grrm score`` both use.

* :mod:`grrm_client.config` -- :class:`ClientConfig`: transport, application, deadline, retries;
* :mod:`grrm_client.transports` -- one attempt over a Ray Serve handle or HTTP;
* :mod:`grrm_client.reward_client` -- :class:`RewardClient`: deadlines, the one retry layer,
  re-joining incomplete groups; every call ends in a :class:`CallOutcome`;
* :mod:`grrm_client.adapters` -- every trainer's adapter (verl, TRL, slime, OpenRLHF's request
  mapping) over one member pipeline.

A handle transport sends through :mod:`grrm_handles` (one send over a Serve handle, the
deployment's availability), which the service's ingress and replicas use too; it imports Ray and
is imported only when a handle is used.

Failures are typed (``cluster/failures.py``); the retry policy is ``cluster/protocol/retry.py``. The client
stands alone: no module of it imports the service (``deployments``).
"""

from grrm_client.config import ClientConfig
from grrm_client.reward_client import RewardClient
from grrm_client.transports import HTTPTransport, make_transport

__all__ = ["ClientConfig", "HTTPTransport", "RewardClient", "make_transport"]
