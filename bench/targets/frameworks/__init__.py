"""Adapters for real rollout frameworks: one folder each, holding its adapter, patch, plug-ins, environment
spec (`env.txt`, every pin in `env.lock`, built by `make targets`) and known findings (`known_findings.toml`)."""

from __future__ import annotations

from pathlib import Path

FRAMEWORKS_DIR = Path(__file__).resolve().parent
KNOWN_FINDINGS = "known_findings.toml"


def shipped_known_findings() -> dict[str, Path]:
    """Each framework's shipped known-findings file, by framework name (`--known miles`)."""
    return {path.parent.name: path for path in sorted(FRAMEWORKS_DIR.glob(f"*/{KNOWN_FINDINGS}"))}
