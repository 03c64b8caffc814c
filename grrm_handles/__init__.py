"""The Ray Serve edge both sides of the service share: one handle sender, and a deployment's availability.

Used alike by the client (its handle transport is :class:`~grrm_handles.send.HandleSender`), the
HTTP ingress and the replicas' hand-offs (``deployments/client.py``), and part of neither: the
client imports nothing from the service, the service nothing from the client, and neither side owns
what both call. Beneath it is the protocol both speak (``cluster/protocol/``).

* :mod:`grrm_handles.send` -- :class:`~grrm_handles.send.HandleSender`: one send through a Serve
  handle, the protocol's attempts over it, and what its unanswered errors mean
  (``UNANSWERED_ERRORS``, ``REPLICA_GONE_ERRORS``, ``unanswered_code``);
* :mod:`grrm_handles.availability` -- whether a deployment can serve at all (its running replicas
  and, when none can be placed, the missing resources: ``ReplicasUnschedulableError``);
* :mod:`grrm_handles.ready` -- handles whose router is set up before their first call.

The modules import Ray Serve; this package's own import does not (the client imports them lazily,
only when it makes a handle transport). It imports neither ``grrm_client`` nor ``deployments``
(``tests/test_client_imports.py``).
"""
