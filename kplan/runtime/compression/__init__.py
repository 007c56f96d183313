"""Gradient compression inside the training job: the DDP communication hook (compressor.py)
and its parts (top-k pieces, the adaptive ratio, the start-up probes). The options and their
wire-cost model are kplan/core/compression_spec.py (no torch)."""
