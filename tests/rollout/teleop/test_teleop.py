"""Teleop keys: bindings, the controller's verbs, the terminal parser, scripted keys driving a real host."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from rollcap.rollout.config import HostConfig
from rollcap.rollout.episode import ACTOR_HUMAN, ACTOR_POLICY
from rollcap.rollout.events import EventBus
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import Subscriber
from rollcap.rollout.teleop.keys import KeyController, TeleopKeys
from rollcap.rollout.teleop.scripted import ScriptedSource, parse_script
from rollcap.rollout.teleop.keysource import SourceUnavailable
from rollcap.rollout.teleop.sources import open_key_source, parse_terminal
from tests.rollout._tiny import make_env


class StepTimes(Subscriber):
    def __init__(self):
        self.times = []

    def on_step(self, step):
        self.times.append(time.perf_counter())


def test_keys_validate_and_describe_themselves():
    """A key bound twice, a bare string or an unknown name is refused; the help line names every verb."""
    with pytest.raises(ValueError, match="already bound"):
        TeleopKeys(end=("w",))
    with pytest.raises(ValueError, match="tuple of key names"):
        TeleopKeys(end="x")
    with pytest.raises(ValueError, match="unknown key"):
        TeleopKeys(end=("F13",))
    line = TeleopKeys().help_line()
    assert (
        line
        == "e end · p/space pause · y success · n failure · r re-record · q quit · g/enter next episode · t take over · b rewind · arrows/wasd move"
    )
    assert "x end" in TeleopKeys(end=("X",)).help_line()  # names fold to lower case


def test_controller_sends_every_verb_to_the_bus():
    """Each bound key reaches its bus verb; an auto-repeated press repeats nothing."""
    bus = EventBus()
    ctl = KeyController()
    ctl.attach(bus)
    ctl.tap("e")
    assert bus.poll_stop() == "keyboard"
    ctl.tap("p")
    assert bus.paused
    ctl.press("space")
    ctl.press("space")  # auto-repeat: still one toggle
    assert not bus.paused
    ctl.release("space")
    ctl.tap("y")
    assert bus.take_label() is True
    ctl.tap("n")
    assert bus.take_label() is False
    ctl.tap("r")
    assert bus.take_discard() and bus.poll_stop() == "discarded"
    bus.expect_go()  # the go key counts while a reset awaits it
    ctl.tap("g")
    assert bus.wait_for_go(timeout=0) and not bus.quit_requested
    ctl.tap("q")
    assert bus.quit_requested


def test_a_go_key_counts_only_while_a_reset_awaits_it():
    """go() while an episode runs is forgotten (it would skip the next reset); from expect_go() until the wait is
    released it counts once; a new episode forgets a go that nobody waited for."""
    bus = EventBus()
    bus.go()
    assert not bus.wait_for_go(timeout=0)  # pressed before the reset: not kept
    assert bus.awaiting_go  # the wait went on awaiting it
    bus.go()
    assert bus.wait_for_go(timeout=0) and not bus.awaiting_go
    bus.go()
    assert not bus.wait_for_go(timeout=0)
    bus.expect_go()
    bus.go()
    bus.clear()  # the next episode starts (host.start)
    assert not bus.awaiting_go
    bus.go()
    assert not bus.wait_for_go(timeout=0)
    bus.quit()
    assert bus.wait_for_go(timeout=0) and bus.wait_for_go(timeout=0)  # quit releases every wait


def test_a_scripted_go_key_waits_until_a_reset_awaits_it():
    """A timed 'g' due while the episode still runs fires only once the reset hook awaits it, so it is not lost."""
    src = ScriptedSource(["0 g"])
    bus = EventBus()
    with src.start(bus):
        time.sleep(0.1)
        assert not src.finished  # due at once, but no reset awaits it
        bus.expect_go()
        assert src.wait_finished(timeout=5) and bus.wait_for_go(timeout=5)


def test_takeover_maps_held_keys_to_a_velocity_and_hands_back():
    """While taken over, held arrows/WASD set the pusher velocity (none held: zero); t again hands back."""
    bus = EventBus()
    ctl = KeyController()
    ctl.attach(bus)
    ctl.press("up")
    assert bus.intervention() is None  # not taken over: movement keys do nothing
    ctl.tap("t")
    np.testing.assert_array_equal(bus.intervention(), [0, 1])
    ctl.press("a")
    np.testing.assert_array_equal(bus.intervention(), [-1, 1])
    ctl.release("up")
    ctl.release("a")
    np.testing.assert_array_equal(bus.intervention(), [0, 0])
    ctl.tap("t")
    assert bus.intervention() is None and not ctl.intervening


def test_mapping_hook_serves_other_action_spaces():
    """action_of maps the held movement keys (extra ones included) to any action."""
    keys = TeleopKeys(extra_movement=("z",), action_of=lambda held: np.array([len(held), "z" in held, 0.5]))
    bus = EventBus()
    ctl = KeyController(keys)
    ctl.attach(bus)
    ctl.tap("t")
    ctl.press("z")
    np.testing.assert_array_equal(bus.intervention(), np.array([1, 1, 0.5], np.float32))


def test_terminal_bytes_parse_to_key_names():
    """Arrows (CSI and SS3), Enter, space, Esc and letters; other control bytes are skipped."""
    assert parse_terminal(b"\x1b[A\x1bOB\x1b[C\x1b[D") == ["up", "down", "right", "left"]
    assert parse_terminal(b"E \r\n\x1b\x01q") == ["e", "space", "enter", "enter", "esc", "q"]
    assert parse_terminal(b"\x1b[1;5A") == []  # Ctrl-arrow: not a binding


def test_script_lines_parse_or_name_the_bad_line(tmp_path):
    """WHEN KEY [down|up]; a bad line is named by file and number; a missing file is SourceUnavailable."""
    lines = parse_script(["# comment", "0.5 e", "step=3 up down", ""])
    assert [(x.delay_s, x.step, x.key, x.action) for x in lines] == [(0.5, None, "e", "tap"), (None, 3, "up", "down")]
    path = tmp_path / "keys.txt"
    path.write_text("0 e\nsoon q\n")
    with pytest.raises(ValueError, match=r"keys.txt line 2: 'soon q'"):
        open_key_source(f"scripted:{path}")
    with pytest.raises(SourceUnavailable, match="cannot read the key script"):
        open_key_source(f"scripted:{tmp_path / 'none.txt'}")
    with pytest.raises(ValueError, match="did you mean 'terminal'"):
        open_key_source("termnal")


def _host(runners, bus, subs, **cfg):
    return RolloutHost(make_env(), *runners, HostConfig(**{"seed": 3, "max_chunks": 4, **cfg}), subs, events=bus)


def test_scripted_takeover_end_and_hand_back_drive_a_host(runners):
    """step-triggered keys: take over at step 2 moving up, let go at 4, hand back at 5, end at 7 (exactly)."""
    bus = EventBus()
    src = ScriptedSource(["step=2 t", "0 up down", "step=4 up up", "step=5 t", "step=7 e"])
    host = _host(runners, bus, [src.controller, src])
    with src.start(bus):
        rec = host.run_episode(0).record
    assert rec.stop_reason == "keyboard" and rec.num_steps == 7
    assert list(rec.steps["actor"]) == [ACTOR_POLICY] * 2 + [ACTOR_HUMAN] * 3 + [ACTOR_POLICY] * 2
    np.testing.assert_array_equal(rec.steps["actions"][2:5], [[0, 1], [0, 1], [0, 0]])
    assert int(rec.chunks["chunk_start"][-1]) == 5  # the policy re-planned from the hand-back step


def test_scripted_pause_holds_and_discard_drops(runners):
    """A timed pause of 0.3 s holds the host between two steps; r drops the episode."""
    bus = EventBus()
    steps = StepTimes()
    src = ScriptedSource(["step=1 p", "0.3 p"])
    host = _host(runners, bus, [src, steps])
    with src.start(bus):
        end = host.run_episode(0)
    assert src.finished and end.stop_reason == "timeout_chunks"
    assert max(np.diff(steps.times)) >= 0.28
    src = ScriptedSource(["step=3 r"])
    with src.start(bus):
        end = _host(runners, bus, [src]).run_episode(0)
    assert end.dropped and end.stop_reason == "discarded" and end.num_steps == 3


class StopAtChunk(Subscriber):
    """Requests a stop right after chunk ``k`` is launched (as a key pressed during inference would)."""

    def __init__(self, bus, k):
        self.bus, self.k = bus, k

    def on_chunk(self, chunk):
        if chunk.chunk == self.k:
            self.bus.request_stop("keyboard")


@pytest.mark.parametrize("end", ["step=9 e", "during the boundary of chunk 2"])
def test_an_intervened_episode_replays_exactly_in_env_and_closed_loop(runners, end):
    """Take over at 1 (up+right), let go at 3, hand back at 5, end by key: env replay and closed-loop replay with
    the recorded inputs re-issued (ReplayInputs) reproduce it; closed-loop replay without them does not."""
    from rollcap.rollout.offline.replay import replay_closed, replay_env
    from rollcap.rollout.teleop.replay import ReplayInputs

    bus = EventBus()
    script = ["step=1 t", "0 w down", "0 d down", "step=3 w up", "step=4 d up", "step=5 t"]
    src = ScriptedSource(script + [end] if end.startswith("step=") else script)
    extra = [] if end.startswith("step=") else [StopAtChunk(bus, 2)]
    with src.start(bus):
        rec = _host(runners, bus, [src.controller, src, *extra], max_chunks=6).run_episode(0).record
    assert rec.stop_reason == "keyboard" and (rec.steps["actor"] == ACTOR_HUMAN).sum() == 4
    assert end.startswith("step=") or int(rec.chunks["chunk_start"][-1]) == rec.num_steps  # launched, none of it ran
    assert replay_env(rec, make_env()).exact
    bus2 = EventBus()
    again = _host(runners, bus2, [ReplayInputs(rec, bus2)], max_chunks=6)
    result = replay_closed(rec, again)
    assert result.exact, result.line()
    assert not replay_closed(rec, _host(runners, EventBus(), [], max_chunks=6)).exact


# ---------------------------------------------------------------- real keys under Xvfb


@pytest.fixture(scope="module")
def display():
    """An Xvfb server for this module (skipped without xvfb, xdotool or pynput)."""
    import importlib.util

    from rollcap.rollout.bench.teleop import XUnavailable, xvfb

    if importlib.util.find_spec("pynput") is None:
        pytest.skip("pynput is not installed (pip install 'rollcap[teleop]')")
    try:
        with xvfb() as name:
            yield name
    except XUnavailable as err:
        pytest.skip(str(err))


def _until(check, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError("timed out waiting for the key's effect")


def test_real_keys_reach_the_bus_through_pynput(display, monkeypatch):
    """xdotool key presses (XTEST, as a keyboard's) reach every bus verb through the pynput source; stop() ends the listener."""
    from rollcap.rollout.bench.teleop import xdotool
    from rollcap.rollout.teleop.sources import PynputSource

    monkeypatch.setenv("DISPLAY", display)
    bus = EventBus()
    threads = threading.active_count()
    with PynputSource().start(bus) as src:
        xdotool(display, "key", "e")
        assert _until(bus.poll_stop) == "keyboard"
        xdotool(display, "key", "p")
        _until(lambda: bus.paused)
        xdotool(display, "key", "space")
        _until(lambda: not bus.paused)
        xdotool(display, "key", "y")
        assert _until(lambda: bus.take_label() is not None) and src.controller.label is True
        xdotool(display, "key", "n")
        _until(lambda: src.controller.label is False)
        assert bus.take_label() is False
        xdotool(display, "key", "r")
        _until(bus.take_discard)
        bus.expect_go()
        xdotool(display, "key", "Return")
        assert bus.wait_for_go(timeout=3)
        xdotool(display, "key", "t", "keydown", "Up")
        _until(lambda: bus.intervention() is not None and bus.intervention().tolist() == [0, 1])
        xdotool(display, "keydown", "a", "keyup", "Up")
        _until(lambda: bus.intervention().tolist() == [-1, 0])
        xdotool(display, "keyup", "a", "key", "t")
        _until(lambda: bus.intervention() is None)
        xdotool(display, "key", "q")
        _until(lambda: bus.quit_requested)
    assert not src.started and threading.active_count() == threads  # the listener is gone, not waiting for a key


def test_end_key_stops_a_real_host_within_one_env_step(display, runners):
    """Paced by the host's clock: after a real 'p' or 'e' no env step begins (until the resume); a held 'w' reaches
    the env at the next step."""
    from rollcap.rollout.bench.teleop import measure, summary

    def make_host(wrap, bus, subscribers, reset_hook, control_period_s):
        config = HostConfig(seed=0, max_chunks=50, control_period_s=control_period_s)
        return RolloutHost(wrap(make_env()), *runners, config, subscribers, events=bus, reset_hook=reset_hook)

    res = summary(measure(make_host, display, presses=3, hz=50), 50)
    print(res)
    assert res["pause_steps_after"]["max"] == res["end_steps_after"]["max"] == 0
    assert (
        res["end_effect_ms"]["max"] < 250
    )  # one 20 ms env step; generous for a loaded machine (the step count is the contract)
    assert res["override_effect_ms"]["max"] < 250


class NotedBus(EventBus):
    """An event bus that notes when each pause, resume and stop took effect (``perf_counter``)."""

    def __init__(self):
        super().__init__()
        self.noted: list[tuple[str, float]] = []

    def pause(self, paused=None):
        state = super().pause(paused)
        self.noted.append(("pause" if state else "resume", time.perf_counter()))
        return state

    def request_stop(self, reason="event"):
        super().request_stop(reason)
        self.noted.append(("stop", time.perf_counter()))


class PressAfterStep(Subscriber):
    """Runs ``at[n]()`` on a thread right after env step ``n``: a key it presses lands while the host waits for the next tick."""

    def __init__(self, at):
        self.at, self.threads = dict(at), []

    def on_step(self, step):
        act = self.at.pop(step.step, None)
        if act is not None:
            self.threads.append(threading.Thread(target=act, daemon=True))
            self.threads[-1].start()

    def join(self):
        for thread in self.threads:
            thread.join(10)


def test_no_step_starts_after_a_pause_or_end_key_pressed_while_the_host_waits_for_the_tick(
    display, runners, monkeypatch
):
    """At 5 Hz, p (then p again) and e, each pressed right after a step: no env step begins while paused, nor
    after the end key reached the bus (the host checks the keys again after the control tick's wait)."""
    from rollcap.rollout.bench.teleop import StepLog, xdotool
    from rollcap.rollout.teleop.sources import PynputSource

    monkeypatch.setenv("DISPLAY", display)
    bus = NotedBus()

    def pause_then_resume():
        xdotool(display, "key", "p")
        _until(lambda: bus.paused)
        time.sleep(0.5)
        xdotool(display, "key", "p")

    press = PressAfterStep(
        {2: pause_then_resume, 6: lambda: xdotool(display, "key", "e")}
    )  # steps 3 and 7: inside a chunk
    env = StepLog(make_env())
    with PynputSource().start(bus) as src:
        host = RolloutHost(
            env, *runners, HostConfig(seed=0, max_chunks=8, control_period_s=0.2), [src.controller, press], events=bus
        )
        end = host.run_episode(0)
        press.join()
    steps, noted = [t for t, _ in env.log], dict(bus.noted)
    assert end.stop_reason == "keyboard" and [what for what, _ in bus.noted] == ["pause", "resume", "stop"]
    assert [
        round(t - noted["pause"], 3) for t in steps if noted["pause"] < t < noted["resume"]
    ] == []  # seconds after p
    assert [round(t - noted["stop"], 3) for t in steps if t > noted["stop"]] == []  # seconds after e


# ---------------------------------------------------------------- the terminal, through a pty

_CHILD = """
import json, sys, time
from rollcap.rollout.config import HostConfig
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import Subscriber
from rollcap.rollout.teleop.session import TeleopConfig, open_teleop
from tests.rollout._tiny import make_env, make_runners


def say(**kw):
    print(json.dumps(kw), flush=True)


class Tell(Subscriber):
    def on_step(self, s):
        say(episode=s.episode, step=s.step)
        time.sleep(0.02)


def reset_hook(host):
    tele.bus.expect_go()  # before saying so: an Enter sent on hearing it counts
    say(awaiting=True)
    tele.reset_hook(host)


p, c = make_runners()
with open_teleop(TeleopConfig(source="keyboard", view=False)) as tele:
    say(ready=tele.source.active.name)
    host = RolloutHost(make_env(), p, c, HostConfig(seed=0, max_chunks=60), [*tele.subscribers, Tell()],
                       events=tele.bus, reset_hook=reset_hook)
    index = 0
    while not tele.quit_requested:
        end = host.run_episode(index)
        human = 0 if end.record is None else int((end.record.steps["actor"] == 1).sum())
        say(end=end.index, reason=end.stop_reason, success=end.success, dropped=end.dropped, human=human)
        index += 0 if end.dropped else 1
say(quit=True)
"""


def _lines(proc, timeout=60.0):
    """Yield the child's JSON lines from its stdout as they come."""
    import json
    import select

    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        data = os.read(proc.stdout.fileno(), 4096)
        if not data:
            break
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield json.loads(line)
    raise AssertionError(
        f"the child stopped talking (exit {proc.poll()}): {proc.stderr.read().decode() if proc.poll() is not None else ''}"
    )


def _child(script, slave, **env):
    import subprocess
    import sys

    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )  # the repository root
    environ = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    environ.update(PYTHONPATH=root, **env)
    return subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environ,
        cwd=root,
    )


@pytest.mark.slow
def test_keyboard_without_a_display_falls_back_to_the_terminal_through_a_pty():
    """No DISPLAY: 'keyboard' says so once and reads the pty in raw mode: take over with an arrow, label, end,
    go with Enter, discard, quit; the terminal's mode is restored when the child exits."""
    import pty
    import termios

    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    proc = _child(_CHILD, slave)
    try:
        lines = _lines(proc)
        ends = []
        assert next(lines) == {"ready": "terminal"}
        raw = termios.tcgetattr(slave)
        assert not raw[3] & (termios.ICANON | termios.ECHO)
        sent = set()
        for msg in lines:
            if "quit" in msg:
                break
            if "end" in msg:
                ends.append(msg)
            elif "awaiting" in msg:
                if not ends:
                    os.write(master, b"\r")  # Enter starts the next episode (once the reset awaits it)
            elif msg["episode"] == 0 and msg["step"] == 2 and "t" not in sent:
                sent.add("t")
                os.write(master, b"t\x1b[A")  # take over, hold up (a terminal hold: 0.5 s)
            elif msg["episode"] == 0 and msg["step"] == 10 and "e" not in sent:
                sent.add("e")
                os.write(master, b"ye")  # label success, end
            elif msg["episode"] == 1 and msg["step"] == 2 and "r" not in sent:
                sent.add("r")
                os.write(master, b"rq")  # discard (re-record), quit after it
        proc.wait(30)
        err = proc.stderr.read().decode()
        after = termios.tcgetattr(slave)
    finally:
        proc.kill()
        os.close(master)
        os.close(slave)
    assert proc.returncode == 0, err
    assert err.count("teleop: no X display ($DISPLAY unset); reading keys from the terminal") == 1, err
    assert ends[0]["reason"] == "keyboard" and ends[0]["success"] and ends[0]["human"] >= 5
    assert ends[1]["end"] == 1 and ends[1]["dropped"] and ends[1]["reason"] == "discarded"
    assert after == before


_LEAVE_RAW = """
import sys
from rollcap.rollout.events import EventBus
from rollcap.rollout.teleop.sources import TerminalSource
TerminalSource().start(EventBus())
print("raw", flush=True)
sys.stdin.read(1) if sys.argv[-1] == "wait" else None
raise SystemExit(3)  # never stopped: atexit restores the terminal
"""


def test_terminal_mode_is_restored_on_errors_and_at_exit():
    """An exception inside `with source.start(bus)` and an interpreter exit without stop() both restore the tty."""
    import pty
    import termios

    from rollcap.rollout.teleop.sources import TerminalSource

    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    with pytest.raises(RuntimeError, match="boom"):
        with TerminalSource(fd=slave).start(EventBus()):
            assert termios.tcgetattr(slave) != before
            raise RuntimeError("boom")
    assert termios.tcgetattr(slave) == before
    proc = _child(_LEAVE_RAW, slave)
    assert proc.stdout.readline() == b"raw\n"
    assert proc.wait(30) == 3
    assert termios.tcgetattr(slave) == before
    os.close(master)
    os.close(slave)


def test_session_status_follows_the_keys_and_the_reset_hook_waits_for_go(runners, tmp_path):
    """A scripted session: the status prints each state once as it changes; the reset hook holds until 'g'."""
    import io

    from rollcap.rollout.teleop.session import TeleopConfig, open_teleop

    script = tmp_path / "keys.txt"
    script.write_text("step=1 t\nstep=3 t\nstep=4 p\n0.2 p\nstep=6 y\nstep=7 e\n0.3 g\n")
    out = io.StringIO()
    with open_teleop(TeleopConfig(source=f"scripted:{script}", view=False), stream=out) as tele:
        host = RolloutHost(
            make_env(),
            *runners,
            HostConfig(seed=2, max_chunks=8),
            tele.subscribers,
            events=tele.bus,
            reset_hook=tele.reset_hook,
        )
        t0 = time.perf_counter()
        end = host.run_episode(0)
        waited = time.perf_counter() - t0
    assert end.stop_reason == "keyboard" and end.success and end.num_steps == 7
    assert waited >= 0.5  # the 0.2 s pause, then the 0.3 s until go
    lines = out.getvalue().splitlines()
    assert lines[0] == "teleop keys: " + TeleopKeys().help_line()
    assert lines[1:] == [
        f"teleop: {s}"
        for s in ("running", "intervening", "running", "paused", "running", "awaiting reset", "between episodes")
    ]
    assert tele.status.line().startswith(
        "between episodes | episode 0 step 7 | marked success | last stop keyboard | e end"
    )
