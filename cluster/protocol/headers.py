"""The HTTP headers of the protocol, written by the client and read by the ingress (and back).

The HTTP ingress re-routes a call whose replica died within the caller's attempts: the caller says
how many sends its attempt may take (:data:`ATTEMPTS_LEFT_HEADER`), and an error answer says how many
it took (:data:`SENDS_HEADER`; a 200 answer says so in its body's ``sends``). The client's one retry
loop counts them as its attempts (``cluster/protocol/calls.py``). A caller's token goes as a bearer
credential (:func:`authorization`).
"""

from __future__ import annotations

__all__ = ["ATTEMPTS_LEFT_HEADER", "SENDS_HEADER", "authorization"]

ATTEMPTS_LEFT_HEADER = "Grrm-Attempts-Left"
SENDS_HEADER = "Grrm-Sends"


def authorization(token: str | None) -> dict[str, str]:
    """The header that carries ``token`` (``Authorization: Bearer <token>``); none for no token."""
    return {"Authorization": f"Bearer {token}"} if token else {}
