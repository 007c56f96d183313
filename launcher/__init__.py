"""kplan.launcher."""
