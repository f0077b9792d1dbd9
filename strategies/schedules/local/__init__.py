"""Local parallelism (Laskin et al. 2020, docs/research.md: local parallelism): planner, engine,
execution type."""
