"""Layer-wise partitioning into a 1F1B pipeline (Akintoye et al. 2023, docs/research.md: pipeline):
planner, engine, execution type."""
