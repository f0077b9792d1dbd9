"""Defaults shared by the commands and the jobs; stdlib only, so the CLI reads them at start-up
without importing pydantic or torch."""

DEFAULT_BATCH_PER_DEVICE = 32  # Jia et al. 2018 train with 32 images per GPU
DEFAULT_VERIFY_STEPS = 3  # float64 steps: momentum and weight decay act on every weight
DEFAULT_TIMEOUT_SECONDS = 120.0  # a collective's wait for the other ranks before a run fails
# The longest timeout or deadline layerwise takes: a week. gloo holds a collective's timeout in
# a C int of milliseconds (24.8 days at most) and Python's timers overflow near 1e10 s; 1e300
# failed inside the workers or a thread instead of at the command line.
MAX_WAIT_SECONDS = 7 * 24 * 3600.0
DEFAULT_CHECKPOINT_EVERY = 100  # steps between checkpoints; one is always written at the end
