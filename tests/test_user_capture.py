"""README's door for your own torch code: a ChunkPolicy runs eager and unchecked; ``rollcap.check_capturable`` checks a
function of yours as rollcap checks its own before capture; ``from rollcap import Parts`` works as README writes it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rollcap


def _reads_the_host(x):
    return x * x.sum().item()  # a host sync: CUDA capture refuses it, a CPU trace freezes it


class ItemPolicy:
    """A ChunkPolicy (README's shape) whose torch code calls .item()."""

    chunk_shape = (4, 1)

    def reset(self):
        pass

    def start(self, obs, noise):
        self.chunk = np.full((4, 1), np.tanh(_reads_the_host(torch.as_tensor(obs, dtype=torch.float32))[0].item()))
        self.chunk = (self.chunk + 0.05 * noise).astype(np.float32)

    def result(self):
        return self.chunk

    def state_fingerprint(self):
        return {"policy": "ItemPolicy"}


def test_check_capturable_names_the_hazard_and_your_line():
    """rollcap.check_capturable(fn, *example) runs fn once under the guard: .item() is a CaptureHazard naming your line."""
    with pytest.raises(rollcap.CaptureHazard) as err:
        rollcap.check_capturable(_reads_the_host, torch.ones(1, 4), label="mine")
    msg = str(err.value)
    assert (
        msg.startswith("mine: cannot capture: ")
        and f"test_user_capture.py:{_reads_the_host.__code__.co_firstlineno + 1}" in msg
    )
    out = rollcap.check_capturable(lambda x: torch.where(x > 0, x, 0.0) * 2, torch.ones(1, 4))
    assert torch.equal(out, torch.full((1, 4), 2.0))


def test_a_chunk_policy_runs_eager_and_unchecked(tmp_path):
    """A ChunkPolicy object is called as it is (never captured, never guarded): its .item() runs, as README says."""
    result = rollcap.run(
        episodes=1, out=tmp_path / "r", env="InvertedPendulum-v5", policy=ItemPolicy(), progress=False, max_chunks=3
    )
    assert result.summary["episodes"] == 1


def test_parts_imports_from_rollcap():
    """README's `Parts(env_id=..., policy=...)` is importable from rollcap itself."""
    from rollcap import Parts
    from rollcap.rollout.spec import Parts as Built

    assert Parts is Built and "Parts" in dir(rollcap)
