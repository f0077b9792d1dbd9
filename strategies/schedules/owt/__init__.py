"""OWT, "One weird trick" (Krizhevsky 2014, DESIGN 3.2): planner, engine, execution type."""
