"""The model: zoo, layer graph, fx helpers, per-tile ops, tile geometry, the configuration space."""
