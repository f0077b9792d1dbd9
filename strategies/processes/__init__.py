"""Process-level settings every process layerwise starts shares: huge pages for large CPU
tensors, and dying with the process that started it."""
