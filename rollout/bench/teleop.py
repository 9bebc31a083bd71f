"""Key-to-effect latency through a real X server: xdotool -> Xvfb -> pynput -> EventBus -> the host -> the env.

``python3 -m rollcap.rollout.bench.teleop [--presses 20] [--hz 50]`` starts
its own Xvfb (Debian ``xvfb`` and ``xdotool``), runs the default policy and
env paced by the host's own control clock (``HostConfig.control_period_s`` =
1 / ``--hz``: the pacing ``rollcap run --control-period-s`` uses), and presses
real keys with ``xdotool`` (XTEST: the same path as a physical keyboard) while
episodes run, each at a random moment within a control period, as a person's
would be:

- ``pause``: ``p`` during step 5, ``p`` again 0.3 s later; how many env steps
  began after the first key reached pynput and before the second did;
- ``end``: ``e`` during step 10 of the same episode; the time until the host
  sees the stop (its reset hook runs), and how many env steps began after the
  key reached pynput;
- ``override``: ``t`` (take over) during step 3, then ``w`` held down during step 8;
  the time until the env receives the human's ``[0, 1]``.

Each figure is split into X delivery (xdotool launched -> pynput's callback;
includes starting the xdotool process) and rollcap's part (callback -> effect).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import gymnasium as gym
import numpy as np

from rollcap.rollout.events import EventBus
from rollcap.rollout.protocols import StepEvent, Subscriber
from rollcap.rollout.teleop.sources import PynputSource


class XUnavailable(RuntimeError):
    """Xvfb or xdotool is missing, or the server did not start."""


@contextlib.contextmanager
def xvfb(screen: str = "800x600x24", timeout_s: float = 10.0) -> Iterator[str]:
    """Run an Xvfb server on a free display number; yields its name (``":N"``); killed on exit."""
    missing = [tool for tool in ("Xvfb", "xdotool") if shutil.which(tool) is None]
    if missing:
        raise XUnavailable(f"{' and '.join(missing)} not installed (Debian: apt-get install xvfb xdotool)")
    read, write = os.pipe()
    proc = subprocess.Popen(  # -noreset: by default the server re-initialises whenever its last client leaves
        ["Xvfb", "-displayfd", str(write), "-screen", "0", screen, "-nolisten", "tcp", "-noreset"],
        pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    os.close(write)
    try:
        number = b""
        deadline = time.monotonic() + timeout_s
        while not number.endswith(b"\n"):
            ready, _, _ = select.select([read], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(read, 16) if ready else b""
            if not chunk:
                raise XUnavailable(f"Xvfb did not report a display within {timeout_s:g} s (exit code {proc.poll()})")
            number += chunk
        yield f":{int(number)}"
    finally:
        os.close(read)
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def xdotool(display: str, *args: str) -> float:
    """Run ``xdotool ARGS`` on ``display``; returns the ``perf_counter`` time just before it was launched."""
    t = time.perf_counter()
    subprocess.run(["xdotool", *args], env={**os.environ, "DISPLAY": display}, check=True, timeout=10)
    return t


class StepLog(gym.Wrapper):
    """Notes when each ``env.step`` began and with which action (the env's side of an override)."""

    def __init__(self, env):
        super().__init__(env)
        self.log: list[tuple[float, np.ndarray]] = []

    def step(self, action):
        self.log.append((time.perf_counter(), np.array(action, np.float32)))
        return self.env.step(action)


class Script(Subscriber):
    """Runs ``actions[step]`` on a thread after env step ``step``, as a person's hand would: at a random
    moment (seeded) within the control period that follows, so a key lands anywhere in a step. It paces
    nothing: the host's control clock does."""

    def __init__(self, period_s: float, actions: dict[int, Callable[[], None]], seed: int = 0):
        self.period, self.actions = period_s, actions
        self._rng = np.random.default_rng(seed)
        self.threads: list[threading.Thread] = []

    def on_step(self, step: StepEvent) -> None:
        act = self.actions.get(step.step)
        if act is not None:
            delay = float(self._rng.uniform(0, self.period))
            thread = threading.Thread(target=lambda: (time.sleep(delay), act()), daemon=True)
            thread.start()
            self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(10)


def _pynput_on(display: str, bus: EventBus) -> PynputSource:
    """A started :class:`PynputSource` listening on X ``display`` (``DISPLAY`` set while it starts, then put back)."""
    old = os.environ.get("DISPLAY")
    os.environ["DISPLAY"] = display
    try:
        return PynputSource().start(bus)
    finally:
        if old is None:
            os.environ.pop("DISPLAY")
        else:
            os.environ["DISPLAY"] = old


def measure(make_host: Callable, display: str, presses: int = 10, hz: float = 50.0) -> dict:
    """Key-to-effect latencies on ``display`` (seconds per press; see the module docstring).

    Args:
        make_host: ``(env_wrapper, bus, subscribers, reset_hook, control_period_s) -> RolloutHost``; the
            host must run its env through ``env_wrapper`` (a :class:`StepLog`) to be measured, and pace
            its steps with ``HostConfig(control_period_s=control_period_s)``.
        presses: trials of each kind (two episodes each: pause and end, override).
        hz: env steps per second (a real arm's control rate; the host's clock paces the sim to it).
    """
    kinds = (
        "pause_steps_after",
        "end_deliver_s",
        "end_effect_s",
        "end_total_s",
        "end_steps_after",
        "override_deliver_s",
        "override_effect_s",
        "override_total_s",
    )
    out: dict[str, list] = {k: [] for k in kinds}
    bus = EventBus()
    source = _pynput_on(display, bus)
    ctl, period = source.controller, 1.0 / hz
    pressed: list[tuple[str, float]] = []  # every key pressed (not auto-repeats), with the time pynput delivered it
    ctl.on_change = lambda: pressed.append(ctl.last_press)
    logs: list[StepLog] = []

    def wrap(env):
        logs.append(StepLog(env))
        return logs[-1]

    def delivered(key: str, sent: float) -> float:
        return next(t for k, t in pressed if k == key and t >= sent)

    def began(after: float, before: float = float("inf")) -> int:
        return sum(after < t < before for t, _ in logs[-1].log)

    try:
        for i in range(presses):
            sent: dict[str, float] = {}
            seen: list[float] = []

            def pause_and_resume():
                sent["pause"] = xdotool(display, "key", "p")
                time.sleep(0.3)
                sent["resume"] = xdotool(display, "key", "p")

            def press_end():
                sent["e"] = xdotool(display, "key", "e")

            script = Script(period, {5: pause_and_resume, 10: press_end}, seed=i)
            host = make_host(wrap, bus, [ctl, script], lambda h: seen.append(time.perf_counter()), period)
            end = host.run_episode(2 * i)
            script.join()
            if end.stop_reason != "keyboard":
                raise RuntimeError(f"end trial {i}: the episode ended with {end.stop_reason!r}, not by the key")
            out["pause_steps_after"].append(began(delivered("p", sent["pause"]), delivered("p", sent["resume"])))
            t_cb = delivered("e", sent["e"])
            out["end_deliver_s"].append(t_cb - sent["e"])
            out["end_effect_s"].append(seen[0] - t_cb)
            out["end_total_s"].append(seen[0] - sent["e"])
            out["end_steps_after"].append(began(t_cb))

            def take_over():
                xdotool(display, "key", "t")

            def hold_up():
                sent["w"] = xdotool(display, "keydown", "w")

            def let_go():
                xdotool(display, "keyup", "w")
                xdotool(display, "key", "t", "e")

            script = Script(period, {3: take_over, 8: hold_up, 16: let_go}, seed=i)
            host = make_host(wrap, bus, [ctl, script], lambda h: None, period)
            end = host.run_episode(2 * i + 1)
            script.join()
            first = next((t for t, a in logs[-1].log if t > sent["w"] and a.tolist() == [0.0, 1.0]), None)
            if first is None:
                raise RuntimeError(
                    f"override trial {i}: the env never received the human's [0, 1] (stop {end.stop_reason!r})"
                )
            t_cb = delivered("w", sent["w"])
            out["override_deliver_s"].append(t_cb - sent["w"])
            out["override_effect_s"].append(first - t_cb)
            out["override_total_s"].append(first - sent["w"])
    finally:
        source.stop()
    return out


def summary(samples: dict, hz: float) -> dict:
    """Median and max in milliseconds of each latency; for the pause and end keys, how many presses had an
    env step begin after the key reached pynput (``presses_with_any``) and the most steps after one press."""
    res: dict = {"hz": hz, "presses": len(samples["end_total_s"])}
    for key, xs in samples.items():
        if key.endswith("_steps_after"):
            res[key] = {"presses_with_any": int(sum(x > 0 for x in xs)), "max": int(max(xs))}
        else:
            res[key.replace("_s", "_ms")] = {
                "median": round(float(np.median(xs)) * 1e3, 2),
                "max": round(float(np.max(xs)) * 1e3, 2),
            }
    return res


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presses", type=int, default=20, help="trials of each kind")
    parser.add_argument("--hz", type=float, default=50.0, help="env steps per second")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import make_env, make_runners
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost

    parts = Parts()
    policy, critic = make_runners(parts)

    def make_host(wrap, bus, subscribers, reset_hook, control_period_s):
        env = wrap(make_env(parts.env_id, parts.env_kwargs))
        config = HostConfig(seed=0, max_chunks=50, control_period_s=control_period_s)
        return RolloutHost(env, policy, critic, config, subscribers, events=bus, reset_hook=reset_hook, records=False)

    with xvfb() as display:
        res = summary(measure(make_host, display, args.presses, args.hz), args.hz)
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
