"""Defaults shared by the commands and the jobs; stdlib only, so the CLI reads them at start-up
without importing pydantic or torch."""

DEFAULT_BATCH_PER_DEVICE = 32  # Jia et al. 2018 train with 32 images per GPU
