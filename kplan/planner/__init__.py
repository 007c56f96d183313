"""The planner: pure functions over plain data (no I/O, no network, no printing).

It fits the performance model to measurements and searches every configuration of the catalog
for predicted step time, time to train and expected cost, returning a Plan. Files are read
above it: the catalog, the spot model and spot traces by ``kplan.catalogs``, profiles and plans
by ``kplan.app`` and the CLI; the planner takes the parsed records.
"""
