"""Defaults shared by the commands and the jobs; stdlib only, so the CLI reads them at start-up
without importing pydantic or torch."""

DEFAULT_BATCH_PER_DEVICE = 32  # Jia et al. 2018 train with 32 images per GPU
DEFAULT_VERIFY_STEPS = 3  # float64 steps: momentum and weight decay act on every weight
DEFAULT_TIMEOUT_SECONDS = 120.0  # a collective's wait for the other ranks before a run fails
DEFAULT_CHECKPOINT_EVERY = 100  # steps between checkpoints; one is always written at the end
