"""Versioned catalog data (CSV with a source column) and its validating loader."""
