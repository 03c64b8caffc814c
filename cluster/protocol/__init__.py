"""The protocol the client and the service speak, beneath both (as vLLM's ``protocol.py``).

* :mod:`cluster.protocol.schema` -- the wire models: members, groups, their results, demand
  announcements;
* :mod:`cluster.protocol.headers` -- the HTTP headers beyond HTTP's own (``Grrm-Attempts-Left``,
  ``Grrm-Sends``) and the bearer credential;
* :mod:`cluster.protocol.calls` -- the one retry loop (:class:`~cluster.protocol.calls.RetryLoop`),
  what one attempt raises, the seams it drives (``Attempts``, ``Transport``) and what a call ends
  with (``CallOutcome``);
* :mod:`cluster.protocol.retry` -- the loop's policy (:class:`~cluster.protocol.retry.RetryPolicy`);
* :mod:`cluster.protocol.members` -- a trainer's completion as a member request, a member's answer as
  its reward;
* :mod:`cluster.protocol.openrlhf` -- OpenRLHF's remote reward-model payload and response.

The client (``grrm_client``), the service (``deployments``) and the Serve edge both use
(``grrm_handles``) import it; it imports none of them, nor Ray or torch
(``tests/test_client_imports.py``).
"""
