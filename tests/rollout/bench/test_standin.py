"""The bench's GPU-speed stand-in: the real runners' host work, a chunk ready a fixed time after start."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rollcap.critics import CriticRunner
from rollcap.kernels import BadInput
from rollcap.policies import PolicyRunner
from rollcap.rollout.bench.standin import FixedLatency
from tests.helpers import make_obs, tiny_critic, tiny_policy


def test_stand_in_waits_its_latency_and_copies_out_what_the_runner_holds():
    """result() comes no sooner than ``seconds`` after start(); the chunk is a copy of the runner's output
    buffer, the value its float; a bad observation is refused by the runner's own check."""
    policy, critic = PolicyRunner(tiny_policy(), backend="eager"), CriticRunner(tiny_critic(), backend="eager")
    try:
        p, c = FixedLatency(policy, 0.004), FixedLatency(critic, 0.004)
        assert p.chunk_shape == policy.chunk_shape and p.execute_steps == policy.execute_steps
        policy.outputs["actions"].copy_(policy.outputs["actions"] + 0.5)
        obs, noise = make_obs(1), np.zeros(policy.chunk_shape, np.float32)
        t0 = time.perf_counter()
        p.start(obs, noise)
        c.start(obs)
        chunk, value = p.result(), c.result()
        assert time.perf_counter() - t0 >= 0.004
        assert np.array_equal(chunk, policy.outputs["actions"][0].numpy()) and chunk.dtype == np.float32
        chunk += 1  # a copy: the buffer is untouched
        assert not np.array_equal(chunk, policy.outputs["actions"][0].numpy())
        assert value == float(critic.outputs["value"][0])
        assert np.array_equal(policy.inputs["state"][0].numpy(), obs["state"])  # the inputs were written
        with pytest.raises(RuntimeError, match="without start"):
            p.result()
        obs["image_front"] = obs["image_front"][:, :, :2]
        with pytest.raises(BadInput, match="image_front"):
            p.start(obs, noise)
    finally:
        policy.close()
        critic.close()
