"""OWT, "One weird trick" (Krizhevsky 2014, docs/research.md: OWT): planner, engine, execution
type."""
