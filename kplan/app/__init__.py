"""Application functions: one per CLI command, between the CLI and the layers below."""
