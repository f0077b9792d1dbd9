"""layerwise's domain core, one subpackage per concept (docs/architecture.md has the map).

Imports torch, numpy, pydantic and PyYAML only (scipy in the search's integer program), so it
also runs on a bare GPU machine: no Prefect, MLflow or DVC.
"""
