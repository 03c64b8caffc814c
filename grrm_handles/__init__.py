"""Ray Serve handle plumbing shared by both sides of the service: one send over a deployment handle.

Used alike by the client's handle transport (:class:`grrm_client.transports.HandleTransport`), the
HTTP ingress and the replicas' hand-offs (``deployments/client.py``), and part of neither: the
client imports nothing from the service, and neither side owns what both call.

* :mod:`grrm_handles.send` -- :class:`~grrm_handles.send.HandleSender`: one send through a Serve
  handle, and what its unanswered errors mean (``UNANSWERED_ERRORS``, ``REPLICA_GONE_ERRORS``,
  ``unanswered_code``);
* :mod:`grrm_handles.availability` -- whether a deployment can serve at all (its running replicas
  and, when none can be placed, the missing resources: ``ReplicasUnschedulableError``);
* :mod:`grrm_handles.ready` -- handles whose router is set up before their first call.

The modules import Ray Serve; this package's own import does not (the client imports them lazily,
only when it is given or first uses a handle). It imports neither ``grrm_client`` nor
``deployments`` (``tests/test_client_imports.py``).
"""
