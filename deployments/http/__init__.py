"""The HTTP layer's parts, one job each; the routes are ``deployments/ingress.py``.

* :mod:`deployments.http.models` -- request and error bodies;
* :mod:`deployments.http.errors` -- error answers from failure kinds, the app's error handlers;
* :mod:`deployments.http.guard` -- token, body size and limits, before a route runs.
"""
