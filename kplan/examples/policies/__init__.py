"""Example adaptation policies (docs/policies.md): load one with KPLAN_POLICIES=file.py:Class."""
