"""Sizing a reward pool before renting it: recorded or synthetic runs (``trace``), the engine's measured
profile (``profile``), the pool model that replays them (``pool_model``, the project's own autoscaling
decision inside), one pool's prediction (``replay``) and the plan over every candidate (``plan``)."""
