"""Example training jobs on the kplan runtime (run on CPU with gloo, or GPUs with NCCL)."""
