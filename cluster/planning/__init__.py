"""Sizing a reward pool before renting it: recorded or synthetic runs (``trace``), the pool model that
replays them (``pool_model``, the project's own autoscaling decision inside), and the plan (``plan``)."""
