"""TEST SUPPORT: verl 0.9.1's real trainer and the GRRM reward service on a CPU-only machine.

Not used on GPU clusters. See ``cpu_harness/README.md`` for what each part works around.
"""
