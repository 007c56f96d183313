"""Providers by name. Each module imports its cloud SDK inside its functions."""
