"""The search: Algorithm 1's elimination, config bounds, the integer-program fallback, the
baselines."""
