"""kplan.profiler: measure a training job for the planner (``kplan profile``).

``run.resolve`` validates what to run, ``run.run_profile`` runs it (``job``: workers, metrics
stream, timeouts, cleanup; ``device``: fp32 and bandwidth benchmarks), ``analyze`` turns the
metrics into measurements and fits, and ``output`` writes the Profile JSON and measurements CSV.
"""
