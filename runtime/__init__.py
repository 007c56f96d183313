"""kplan.runtime."""
