"""``grrm``: the command line of GRRM Cluster (``grrm serve``, ``grrm score``, ``grrm eval``).

A thin layer over what the project already has: the Serve application and its local demo
(:mod:`deployments.local_demo`), :class:`cluster.scorer.GroupScorer` and the engines (in-process
scoring), the client :class:`grrm_client.RewardClient` (HTTP and Serve
handle, with retries and backoff), and :func:`cluster.gqm.ranking_accuracy`. One module per
command (:mod:`grrm_cli.serve`, :mod:`grrm_cli.score`, :mod:`grrm_cli.evaluate`); the dataset
side (columns, streaming files, resumption, Ray Data) has a module per job.
"""
