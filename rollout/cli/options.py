"""Moved to :mod:`rollcap.rollout.options` (below the training scripts, which derive their flags from it too).

This name stays for one year (examples and scripts import it): import from ``rollcap.rollout.options``.
"""

from rollcap.rollout.options import Options, UserError, field_docs, json_object, parse_config

__all__ = ["Options", "UserError", "field_docs", "json_object", "parse_config"]
