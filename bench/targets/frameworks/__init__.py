"""Adapters for real rollout frameworks: one folder each, holding its adapter, patch, plug-ins, environment
spec (`env.txt`, every pin in `env.lock`, built by `make targets`) and known findings (`known_findings.toml`)."""

from __future__ import annotations

from pathlib import Path

FRAMEWORKS_DIR = Path(__file__).resolve().parent
KNOWN_FINDINGS = "known_findings.toml"  # each framework folder's triaged findings (`--known <framework>`)
