"""Sweeps: many runs over a grid of targets, plans, rates and seeds, and their table."""
