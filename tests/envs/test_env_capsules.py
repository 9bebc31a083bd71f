"""Env capsules (their RNG is uint64) through the disk tier: load, restore, replay, `capsule inspect`."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rollcap.capsule import inspect_main, load, restore, save, snapshot
from rollcap.envs import ENV_ID, ExactStateWrapper
from rollcap.envs.compare import canonical_bytes

FACTORIES = {
    "pushblock": lambda: gym.make(ENV_ID, render_images=False),
    "Ant-v5": lambda: ExactStateWrapper(gym.make("Ant-v5")),
    "Reacher-v5": lambda: ExactStateWrapper(gym.make("Reacher-v5")),
}


def _play(env: gym.Env, actions: list) -> list[bytes]:
    return [canonical_bytes(env.step(a)) for a in actions]


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_env_capsule_through_disk(name, tmp_path, capsys):
    """A mid-episode env capsule is written, read back bit-exactly, restores into a fresh env, and inspects OK."""
    env = FACTORIES[name]()
    env.reset(seed=5)
    env.action_space.seed(6)
    for a in [env.action_space.sample() for _ in range(4)]:
        env.step(a)
    cap = snapshot({"env": env}, "mid-episode", tier="host", step=4)
    assert cap.specs["env"]["rng"].dtype == "uint64"
    actions = [env.action_space.sample() for _ in range(10)]
    reference = _play(env, actions)

    on_disk = save(cap, tmp_path / "cap")
    back = load(on_disk.path)
    assert back.digest == cap.digest
    assert {k: canonical_bytes(v) for k, v in back.state["env"].items()} == {
        k: canonical_bytes(v) for k, v in cap.state["env"].items()
    }

    fresh = FACTORIES[name]()
    fresh.reset(seed=99)
    restore(on_disk, {"env": fresh})
    assert _play(fresh, actions) == reference

    assert inspect_main([str(tmp_path / "cap")]) == 0
    out = capsys.readouterr()
    assert "digest    sha256:" in out.out and "OK" in out.out and "FAILED" not in out.out + out.err
    assert np.array_equal(back.state["env"]["rng"], cap.state["env"]["rng"])
