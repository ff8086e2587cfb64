"""Confidence intervals for rates (drop rates): the Wilson score interval.

Wilson rather than the normal approximation because drop rates sit near 0: the normal
interval there goes below zero and is far too narrow with a handful of drops, while Wilson
stays in [0, 1] and keeps close to its nominal coverage down to 0 of n.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import numpy.typing as npt


def wilson(successes: npt.ArrayLike, trials: npt.ArrayLike,
           confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of the Wilson score interval for `successes` of `trials` (elementwise).

    Assumes independent trials: when one fault drops several trajectories at once (a crashed
    batch), the true uncertainty is wider than this.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    k, n = np.asarray(successes, dtype=float), np.asarray(trials, dtype=float)
    if np.any(n <= 0) or np.any(k < 0) or np.any(k > n):
        raise ValueError("need 0 <= successes <= trials and trials > 0")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    share = k / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(share * (1 - share) / n + z * z / (4 * n * n))
    low = np.where(k == 0, 0.0, np.clip(centre - half, 0.0, 1.0))  # exact at the ends, not 1e-17 off
    high = np.where(k == n, 1.0, np.clip(centre + half, 0.0, 1.0))
    return low, high
