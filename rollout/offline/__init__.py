"""Offline tools over recorded episodes: replay, inspect, branch, calibrate, early stop.

Each reads recordings through :mod:`rollcap.rollout.recording` and drives the
episode core; none is imported by the core. Calls point one way:
``replay`` <- ``branch`` <- ``calibrate``; ``inspect`` stands alone.
"""
