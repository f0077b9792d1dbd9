"""Where layerwise reads and writes: the project's data folders and the names of the files in a
run folder and a prepared dataset, each named once here for every writer and reader (the
torchrun worker, the launcher, the Prefect tasks, the data stage); and the one rule that turns
user text into a file name."""

from __future__ import annotations

import re
from pathlib import Path

PREPARED_DIR = Path("data") / "prepared"  # the data stage's datasets, one folder each
PROFILE_DIR = Path("data") / "profiles"  # measured profiles and calibrated clusters

# A prepared dataset's folder
META_FILE = "meta.json"  # image size, channels, classes, source
TRAIN_FILE = "train.npz"
VAL_FILE = "val.npz"

# A run folder (`layerwise train --out`, the benchmark flow's runs)
STRATEGY_FILE = "strategy.json"  # the strategy as run, with its prediction
SETTINGS_FILE = "train.json"  # TrainSettings
GRAPH_FILE = "graph.json"  # the layer graph the strategy was checked against
MODEL_FILE = "model.pt"  # the trained weights as the plain module's state_dict
CHECKPOINT_FILE = "checkpoint.pt"  # the latest checkpoint (the previous one beside it)
RESULT_FILE = "result.json"  # RunResult, written by rank 0
DIVERGENCE_FILE = "divergence.json"  # where a verify run left the reference
REFERENCE_FILE = "reference.pt"  # the plain module's run while a verify trains the strategies
ERRORS_DIR = "errors"  # errors/rank{R}.json, one per failing rank
LOG_FILE = "torchrun.log"  # torchrun's and the workers' output
LOCK_FILE = "run.lock"  # flocked by the process that runs in the folder


def safe_name(text: str, limit: int = 48) -> str:
    """Lower-case file-name-safe text: runs of anything but letters, digits, '.', '_' -> '-'."""
    cleaned = re.sub(r"[^a-z0-9._]+", "-", text.lower()).strip("-.")
    return cleaned[:limit].rstrip("-.") or "unknown"
