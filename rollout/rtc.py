"""Real-time chunking on the host side: the schedule's checks and the simulated control clock.

The schedule (``HostConfig.chunking`` naive / rtc, delay ``d``, execution
horizon ``s``, chunk length ``H``), in env steps: chunk ``k`` is launched at
step ``k*s`` from that step's observation. While it is inferred, the ``d``
actions the policy carries from chunk ``k-1`` (its actions ``s .. s+d-1``, the
queue) execute; then chunk ``k``'s actions ``d .. s-1`` execute (chunk 0, which
has no queue before it, runs ``0 .. s-1``), and the next launch is due. Every
chunk therefore drives the env for ``s`` steps, its own actions ``d .. s+d-1``,
and ``d = 0`` is the synchronous schedule. Since ``d`` counts env steps, an
episode is a pure function of (seed, config, fingerprint) however long
inference really takes; on a real robot (or under :class:`ControlClock`) the
queue's steps are taken at the control rate while the lane computes.

The carried state (the queue and the guidance targets) is the policy's
(:class:`~rollcap.policies.rtc.RTCPolicyRunner`), so it is in the capsule.
"""

from __future__ import annotations

import time

from rollcap.rollout.errors import ConfigError


def configure_policy(policy, config) -> None:
    """Give ``policy`` the config's real-time schedule, or refuse a policy / schedule that cannot run it.

    Raises:
        ConfigError: naming ``chunking`` (the policy carries no prefix) or ``inference_delay`` (out of range).
    """
    if config.chunking == "sync":
        if callable(
            getattr(policy, "configure", None)
        ):  # a carrying policy run synchronously: nothing carried, no guidance
            policy.configure(0, config.execute_steps, "naive")
        return
    if not callable(getattr(policy, "configure", None)) or not callable(getattr(policy, "queue", None)):
        raise ConfigError(
            "chunking",
            f"{config.chunking} needs a policy that carries a prefix (RTCPolicyRunner: make_runners(..., rtc=True)); got {type(policy).__name__}",
        )
    if config.chunking == "rtc" and config.rtc_mask != "hard" and getattr(policy, "sampler", None) == "prefix":
        raise ConfigError(
            "rtc_mask",
            f"{config.rtc_mask}: the policy is a prefix-conditioned checkpoint, which pins its prefix (hard only)",
        )
    try:
        policy.configure(config.inference_delay, config.execute_steps, config.chunking, config.rtc_mask)
    except ValueError as err:
        raise ConfigError("inference_delay", str(err)) from err


class ControlClock:
    """A fixed control period: each env step waits for its tick; a step that comes late is stall.

    A tick is due one period after the previous step was taken. A late step is
    taken at once and the clock does not try to catch up (no bursts), as a real
    control loop that missed its deadline does. Single-threaded.

    Attributes:
        last_late_s: how late the last step was (0 when on time).
        late_s: the episode's total (since :meth:`reset`).
    """

    def __init__(self, period_s: float):
        if not period_s > 0:
            raise ValueError(f"control period: expected seconds > 0, got {period_s!r}")
        self.period_s = float(period_s)
        self.reset()

    def reset(self) -> None:
        """A new episode: the next step is due at once."""
        self._last: float | None = None
        self.last_late_s = 0.0
        self.late_s = 0.0

    def tick(self) -> float:
        """Wait for the next step's tick; returns how late it is (seconds, 0 when on time)."""
        now = time.perf_counter()
        if self._last is None:
            self._last, self.last_late_s = now, 0.0
            return 0.0
        due = self._last + self.period_s
        if now < due:
            while (now := time.perf_counter()) < due:  # sleep most of the wait, spin the last bit
                if due - now > 1e-3:
                    time.sleep(due - now - 5e-4)
            late = 0.0
        else:
            late = now - due
        self._last = max(now, due)
        self.last_late_s = late
        self.late_s += late
        return late
