"""Files: atomic writes, and bounded reading of what a user hands in."""
