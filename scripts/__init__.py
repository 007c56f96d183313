"""Offline scripts (fitting shipped models); run as ``python -m scripts.<name>``."""
