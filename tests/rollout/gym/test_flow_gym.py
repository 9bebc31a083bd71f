"""The gym door of flow RL: with the sde sampler each chunk's log-probabilities and trace are in ``info``, and the
vector env takes new weights in place (no rebuild, no recapture); its example: tests/examples/test_flow_rl.py."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from rollcap.kernels.graph import capture_count
from rollcap.policies import FlowVLA, save_policy
from rollcap.rollout.gym.vector import NoiseSteeringVectorEnv, make_noise_steering_vector_env
from rollcap.rollout.spec import Parts
from tests.rollout._tiny import ENV_KW, POLICY

N = 2


def _checkpoint(path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    return save_policy(FlowVLA(POLICY).eval(), path)


def _venv(policy: Path) -> NoiseSteeringVectorEnv:
    parts = Parts(env_kwargs=ENV_KW, policy=policy, critic="none", sampler="sde")
    return make_noise_steering_vector_env(
        N, parts=parts, config={"max_chunks": 3}, autoreset_mode=AutoresetMode.SAME_STEP
    )


def _noise(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((N, POLICY.horizon, POLICY.action_dim)).astype(np.float32)


def test_info_holds_each_chunks_flow_and_new_weights_go_in_place(tmp_path):
    """Each step's info has the chunk's flow_logp [K], flow_trace [K+1, H, A] and flow_step_noise (an ended episode's
    in final_info); load_weights ends the running episodes (a step before reset is refused), captures nothing, and
    the next chunks are those of an env built with the new weights."""
    a, b = _checkpoint(tmp_path / "a", 0), _checkpoint(tmp_path / "b", 1)
    venv = _venv(a)
    try:
        venv.reset(seed=5)
        _, _, term, trunc, info = venv.step(_noise(0))
        assert info["flow_logp"].shape == (N, POLICY.num_steps)
        assert info["flow_trace"].shape == (N, POLICY.num_steps + 1, POLICY.horizon, POLICY.action_dim)
        assert np.array_equal(info["flow_trace"][:, -1], info["policy_chunk"])
        for k in range(1, 4):
            _, _, term, trunc, info = venv.step(_noise(k))
            if (term | trunc).any():
                assert "flow_logp" in info["final_info"]
                break
        before = capture_count()
        new = FlowVLA(POLICY).eval()
        new.load_state_dict(_state(b))
        digest = venv.load_weights(new.state_dict())
        with pytest.raises(gym.error.ResetNeeded):
            venv.step(_noise(9))
        venv.reset(seed=11)
        _, _, _, _, got = venv.step(_noise(1))
        assert capture_count() == before
    finally:
        venv.close()
    ref = _venv(b)
    try:
        ref.reset(seed=11)
        _, _, _, _, want = ref.step(_noise(1))
    finally:
        ref.close()
    assert digest.startswith("sha256:")
    for k in ("policy_chunk", "flow_logp", "flow_trace"):
        assert got[k].tobytes() == want[k].tobytes(), k


def _state(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path.with_suffix(".safetensors"))
