"""Local parallelism (Laskin et al. 2020, DESIGN 3.4): planner, engine, execution type."""
