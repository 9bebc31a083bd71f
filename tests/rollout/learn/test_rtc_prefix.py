"""The trained hard-prefix RTC variant end to end: selected by --policy, recorded, replayed exactly in a fresh process;
its benchmark modes."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest
import torch

from rollcap.policies import FlowVLA, save_policy
from tests.rollout._tiny import ENV_KW, POLICY


def _prefix_ckpt(path, **kw):
    torch.manual_seed(3)
    return save_policy(FlowVLA(dataclasses.replace(POLICY, prefix_conditioning=True, **kw)).eval(), path)


@pytest.mark.slow
def test_prefix_rtc_episodes_replay_exactly_in_all_three_modes_in_a_fresh_process(tmp_path):
    """rollcap run --policy <prefix checkpoint> --chunking rtc records; rollcap replay in another process: 3 modes exact."""
    ckpt = _prefix_ckpt(tmp_path / "prefix")
    out = tmp_path / "run"
    flags = ["--policy", str(ckpt), "--critic", "none", "--env-kwargs", json.dumps(ENV_KW)]
    rtc = ["--chunking", "rtc", "--inference-delay", "2", "--execute-steps", "2", "--max-chunks", "12"]
    run = subprocess.run(
        ["rollcap", "run", "--episodes", "2", "--seed", "3", "--out", str(out), *rtc, *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rep = subprocess.run(
        ["rollcap", "replay", str(out / "episodes.hdf5"), "--policy", str(ckpt), "--critic", "none"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-2000:]
    assert "2 episode(s), 3 mode(s): 6 exact" in rep.stdout, rep.stdout
    from rollcap.rollout.recording import read_h5

    rec = read_h5(out / "episodes.hdf5")[0]
    assert (
        rec.fingerprints["policy"]["rtc_sampler"] == "prefix"
        and rec.fingerprints["policy"]["config"]["prefix_conditioning"]
    )
    assert rec.chunks["rtc_weights"][1][:2].tolist() == [1.0, 1.0]
    assert (rec.chunks["policy_chunk"][1][:2] == rec.chunks["rtc_carried"][1][:2]).all()  # the prefix is pinned exactly


@pytest.mark.slow
def test_bench_rtc_prefix_modes_smoke(tmp_path):
    """--modes rtc-prefix runs the prefix checkpoint's synchronous episodes too and adds the paired difference to them."""
    from rollcap.rollout.bench.rtc import main

    ckpt = _prefix_ckpt(tmp_path / "prefix", image_size=64, horizon=8)  # the shipped shape: s = 4 of H = 8
    out = tmp_path / "rtc.json"
    assert (
        main(
            [
                "--only",
                "success",
                "--episodes",
                "1",
                "--delays",
                "0,1",
                "--modes",
                "rtc-prefix",
                "--prefix-policy",
                str(ckpt),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())["success"]
    assert set(res) == {"sync/d0", "sync-prefix/d0", "rtc-prefix/d1"}
    assert (
        "minus_sync" in res["rtc-prefix/d1"]
        and "minus_sync_prefix" in res["rtc-prefix/d1"]
        and "minus_sync_prefix" not in res["sync-prefix/d0"]
    )


@pytest.mark.slow
def test_the_shipped_prefix_checkpoint_is_selectable_and_pins_its_prefix():
    """policies/weights/pushblock_policy_prefix loads as a prefix-conditioned policy; an RTC host picks hard inpainting."""
    from rollcap.policies.rtc import RTCPolicyRunner
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import make_env, make_runners
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost
    from rollcap.rollout.learn.train_prefix import PREFIX_CHECKPOINT

    policy, _ = make_runners(Parts(policy=PREFIX_CHECKPOINT, critic="none"), rtc=True)
    try:
        assert isinstance(policy, RTCPolicyRunner) and policy.sampler == "prefix" and policy.cfg.prefix_conditioning
        rec = (
            RolloutHost(make_env(), policy, None, HostConfig(seed=0, chunking="rtc", inference_delay=1, max_chunks=4))
            .run_episode(0)
            .record
        )
        carried, chunks = rec.chunks["rtc_carried"], rec.chunks["policy_chunk"]
        assert len(chunks) >= 3 and all(
            chunks[k][0].tobytes() == carried[k][0].tobytes() for k in range(1, len(chunks))
        )  # bit for bit
    finally:
        policy.close()
