"""kplan.profiler."""
