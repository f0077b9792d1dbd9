"""Prefect tasks: thin adapters from the domain core (`strategies`) to the pipeline."""
