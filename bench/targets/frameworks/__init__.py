"""Adapters for real rollout frameworks: one folder each, with its patch, plug-ins, environment and known findings."""
