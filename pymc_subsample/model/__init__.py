"""The model layer: row-local per-observation terms of a PyMC model, read from its graph."""
