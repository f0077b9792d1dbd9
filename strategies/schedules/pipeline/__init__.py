"""Layer-wise partitioning into a 1F1B pipeline (Akintoye et al. 2023, DESIGN 3.5): planner,
engine, execution type."""
