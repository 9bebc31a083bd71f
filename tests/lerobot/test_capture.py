"""LeRobotPolicy's captured path: ``predict_action_chunk`` through rollcap's GraphRunner (jit on CPU, cuda on GPU)
against eager, the fallback to eager where nothing can be captured (DDPM), and `rollcap run --backend jit` replayed
in a fresh process. Run in LeRobot's venv:

    bash scripts/lerobot_env.sh && HF_HUB_OFFLINE=1 .venv-lerobot/bin/python -m pytest -q -m lerobot tests/lerobot
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip(
    "lerobot", reason="lerobot is not installed here; it lives in its own venv (bash scripts/lerobot_env.sh)"
)

import torch
from rollcap.policies.lerobot import LeRobotPolicy
from rollcap.rollout.offline.deployment import fingerprint_diff
from rollcap.rollout.recording import load_any

from tests.lerobot import _tiny

pytestmark = pytest.mark.lerobot
torch.set_num_threads(1)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
TRACED = pytest.mark.filterwarnings("ignore:lerobot\\.[a-z]+. the (jit|cuda) plan was traced through:RuntimeWarning")
"""The one summary of the tracer's warnings a capture gives (its content is checked in test_tracer_warnings_are_one_summary)."""


def rollcap(*args, timeout=600) -> subprocess.CompletedProcess:
    """``rollcap ARGS`` in a fresh process of this venv."""
    return subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        check=False,
    )


@pytest.fixture(scope="module")
def act_dir(tmp_path_factory):
    """A tiny ACT reading the state and the front image (ResNet-18 backbone, random weights)."""
    return _tiny.act(tmp_path_factory.mktemp("act"))


@pytest.fixture(scope="module")
def ddim_dir(tmp_path_factory):
    return _tiny.diffusion(tmp_path_factory.mktemp("ddim"), "DDIM")


def observations(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield {
            "state": rng.standard_normal(_tiny.STATE_DIM).astype(np.float32),
            "image_front": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
            "instruction": "push the red block",
        }


def chunks(policy, n: int = 6) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    out = []
    for obs in observations(n):
        policy.start(obs, rng.standard_normal(policy.chunk_shape).astype(np.float32))
        out.append(policy.result())
    return out


@TRACED
def test_jit_chunk_is_eagers_bit_for_bit(act_dir):
    """The jit plan's chunk equals eager's byte for byte on six random observations; the fingerprints
    differ by ``backend`` only (eager's has none, as before capture existed)."""
    eager, jit = LeRobotPolicy.load(act_dir), LeRobotPolicy.load(act_dir, backend="jit")
    assert (eager.backend, jit.backend, jit.capture_max_abs_diff) == ("eager", "jit", 0.0)
    assert jit._graph is not None and jit._graph.graph.phase == "captured"
    for a, b in zip(chunks(eager), chunks(jit), strict=True):
        assert a.tobytes() == b.tobytes()
    assert "backend" not in eager.state_fingerprint() and jit.state_fingerprint()["backend"] == "jit"
    assert fingerprint_diff(eager.state_fingerprint(), jit.state_fingerprint()) == ["backend"]
    jit.close()


def test_ddim_is_refused_by_the_capture_guard_and_runs_eager(ddim_dir):
    """DDIM's scheduler builds its timesteps from numpy inside predict_action_chunk (a host-to-device copy that CUDA graph
    capture refuses): asked for jit it runs eager, and the warning names the scheduler's line; its chunks stay eager's."""
    with pytest.warns(
        RuntimeWarning,
        match=r"lerobot\.diffusion: backend 'jit' not possible, it runs eager: .*CaptureHazard.*aten\.lift_fresh.*scheduling_ddim\.py:\d+ in set_timesteps",
    ):
        jit = LeRobotPolicy.load(ddim_dir, backend="jit")
    assert jit._graph is None and jit.backend.startswith("eager (jit capture failed: CaptureHazard")
    eager = LeRobotPolicy.load(ddim_dir)
    for a, b in zip(chunks(eager), chunks(jit), strict=True):
        assert a.tobytes() == b.tobytes()


def test_tracer_warnings_are_one_summary(act_dir):
    """The tracer's shape warnings come back as one RuntimeWarning naming where they came from and the probe check."""
    with pytest.warns(
        RuntimeWarning,
        match=r"lerobot\.act: the jit plan was traced through \d+ TracerWarning\(s\) at .*modeling_act\.py:\d+.*\(max \|diff\| 0\)",
    ) as seen:
        policy = LeRobotPolicy.load(act_dir, backend="jit")
    assert not [w for w in seen if issubclass(w.category, torch.jit.TracerWarning)]
    assert policy.trace_warnings and all(":" in w for w in policy.trace_warnings)


def test_ddpm_falls_back_to_eager_and_says_so(tmp_path):
    """DDPM draws the global RNG at every step: asked for jit it runs eager, warns, and says why in backend and fingerprint."""
    directory = _tiny.diffusion(tmp_path / "ddpm", "DDPM")
    with pytest.warns(RuntimeWarning, match="backend 'jit' not possible, it runs eager: DDPM draws torch's global RNG"):
        policy = LeRobotPolicy.load(directory, backend="jit")
    assert (
        policy.backend.startswith("eager (DDPM draws") and policy._graph is None and policy.capture_max_abs_diff is None
    )
    fp = policy.state_fingerprint()
    assert fp["backend"] == policy.backend and fp["noise"] == "not injected"
    assert len(chunks(policy, 2)) == 2


def test_bad_backends_are_one_line(act_dir):
    """A backend a LeRobot policy does not take, or one for another device: a ValueError naming backend."""
    with pytest.raises(ValueError, match=r"^backend: a LeRobot policy runs eager, jit, cuda; got 'aoti'$"):
        LeRobotPolicy.load(act_dir, backend="aoti")
    with pytest.raises(ValueError, match=r"^backend: 'cuda' does not run on cpu \(use 'jit' or 'eager'\)$"):
        LeRobotPolicy.load(act_dir, backend="cuda")


def test_cli_jit_run_replays_exact_in_a_fresh_process(act_dir, tmp_path):
    """`rollcap run --policy lerobot:DIR --backend jit` records backend jit; `rollcap replay --backend jit` in a new
    process: all exact; `--backend cuda` on CPU is one line naming --backend, and nothing is created."""
    kw = json.dumps({"max_steps": 12})
    out = tmp_path / "run"
    res = rollcap(
        "run",
        "--policy",
        f"lerobot:{act_dir}",
        "--backend",
        "jit",
        "--critic",
        "none",
        "--episodes",
        2,
        "--env-kwargs",
        kw,
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert [r.fingerprints["policy"]["backend"] for r in load_any(out)] == ["jit", "jit"]
    res = rollcap("replay", out, "--policy", f"lerobot:{act_dir}", "--backend", "jit", "--critic", "none")
    assert res.returncode == 0 and "6 exact" in res.stdout.splitlines()[-1], res.stdout[-2000:] + res.stderr[-2000:]
    if not torch.cuda.is_available():
        res = rollcap(
            "run", "--policy", f"lerobot:{act_dir}", "--backend", "cuda", "--episodes", 1, "--out", tmp_path / "no"
        )
        assert res.returncode == 2 and res.stderr.strip().splitlines() == [
            f"rollcap run: error: --backend: 'cuda': a LeRobot policy on cpu runs 'eager' or 'jit' (lerobot:{act_dir})"
        ], res.stderr
        assert not (tmp_path / "no").exists()


@TRACED
@pytest.mark.cuda
@pytest.mark.parametrize("which", ["act", "ddim"])
def test_cuda_graph_chunk_against_eager_on_the_gpu(which, act_dir, ddim_dir):
    """On a GPU: the CUDA graph around predict_action_chunk against eager on the same GPU (bit-equal or within
    the probe check's tolerance, and the fingerprint says cuda either way)."""
    directory = act_dir if which == "act" else ddim_dir
    eager, graph = (
        LeRobotPolicy.load(directory, device="cuda"),
        LeRobotPolicy.load(directory, device="cuda", backend="cuda"),
    )
    assert graph.backend == "cuda" and graph.state_fingerprint()["backend"] == "cuda"
    for a, b in zip(chunks(eager), chunks(graph), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    graph.close()
