"""Benchmarks behind `make bench`: performance claims measured as ratios in one run, never in unit tests.

Not part of the wheel: run from a checkout (`python -m benchmarks.server_throughput`, `make bench`).
"""
