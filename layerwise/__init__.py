"""layerwise: per-layer parallelization of CNN training (Jia et al., ICML 2018).

The distribution installs this one import namespace. Its parts are the repository's top-level
folders, mapped under it by the build (setup.py): `layerwise.strategies` (the domain core:
torch, numpy, pydantic), `layerwise.tasks` (Prefect tasks) and `layerwise.flows` (Prefect flows
and the `layerwise` command).
"""
