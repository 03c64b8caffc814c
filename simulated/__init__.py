"""Simulations, labelled as such: nothing here is a model or a product feature that scores for real.

* :mod:`simulated.scripted_engine` -- the deterministic scripted engine (``engine.kind: scripted``):
  an :class:`~cluster.engines.base.Engine` whose answers and latencies follow a script, for tests
  of routing, assembly, scheduling and reliability, and for benchmarks that say "simulated".
"""
