"""RECAP: one iteration of learning from rollcap's own recordings (``rollcap recap``).

Five stages, each a module and a function testable alone:

1. :func:`~rollcap.rollout.learn.recap.collect.collect` -- the runs' episodes and the shipped demonstrations;
2. :mod:`~rollcap.rollout.learn.recap.value` -- value targets (censored episodes bootstrapped), the critic refit, its calibration;
3. :mod:`~rollcap.rollout.learn.recap.advantage` -- N-step advantages, binarised per task at a percentile;
4. :mod:`~rollcap.rollout.learn.recap.improve` -- the advantage-conditioned fine-tune and the guidance weight;
5. :mod:`~rollcap.rollout.learn.recap.evaluate` -- before vs after on held-out seeds, paired.

:func:`recap` runs them all and writes the checkpoints and a manifest.

Imports point downward: this package knows ``inspect``, ``branch``,
``calibrate``, ``training``, ``host``, ``build`` and the models. Names are
imported on first use: ``rollcap recap --help`` reads :class:`RecapConfig`
without importing torch.
"""

from __future__ import annotations

from rollcap.kernels.lazy import lazy_names

_NAMES = {"MANIFEST": "pipeline", "RecapConfig": "config", "recap": "pipeline"}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
