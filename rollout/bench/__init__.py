"""``rollcap bench`` and the standalone benchmarks, one module per section.

:mod:`.report` runs the sections and formats the report; the sections beside it
(``backends``, ``branch``, ``gym``, ``peer``, ``recording``, ``ray``) and the
standalone ones (``growth``, ``rtc``, ``teleop``: ``python3 -m
rollcap.rollout.bench.<name>``) each measure one thing side by side.
"""
