"""Prefect flows and the `layerwise` command line."""
