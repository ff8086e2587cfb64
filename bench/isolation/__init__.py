"""Process isolation: each target runs in a worker process, optionally under another interpreter."""

from .process import IsolatedTarget, TargetCrashed, TargetStartError, WorkerDied

__all__ = ["IsolatedTarget", "TargetCrashed", "TargetStartError", "WorkerDied"]
