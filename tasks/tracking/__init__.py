"""MLflow for the flows: runs and metrics, provenance, the model registry, figures, record owners
(helpers of the tasks, not tasks)."""
