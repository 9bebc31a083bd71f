"""``rollcap bench --only batch`` (opt-in): its quick run reports every configuration and formats."""

from __future__ import annotations

import pytest

from rollcap.rollout.bench.batch import bench_batch, format_batch
from rollcap.rollout.spec import Parts
from rollcap.rollout.errors import ConfigError


@pytest.mark.slow(seconds=90)
def test_bench_batch_quick():
    """The quick section runs envs 1 and 4, in process and on 2 env workers, with the shipped policy and a stand-in, then
    the host's per-slot work and the vector env against AsyncVectorEnv(2); every rate is positive, every share of wall in 0..1."""
    b = bench_batch(Parts(), 20, envs=(1, 4), workers=2, standin=4e-3)
    assert b["configs"] == [f"{p}_envs_{e}" for p in ("policy", "standin") for e in ("1", "4", "4_workers_2")]
    runs = [r for name in b["configs"] for r in b["runs"][name]]
    assert all(r["episodes_per_s"] > 0 and 0 < r["policy_busy_fraction"] < 1 and r["chunks"] > 0 for r in runs)
    assert all(r["worker_env_cpu_s"] > 0 and r["worker_write_cpu_s"] > 0 for r in b["runs"]["standin_envs_4_workers_2"])
    assert set(b["speedup"]) == {f"{p}_envs_{e}" for p in ("policy", "standin") for e in ("4", "4_workers_2")}
    assert b["model"]["predict_16_cores"]["envs_32"] > 0 and b["host_per_slot"]["host_us_per_slot_round"][0] > 0
    assert b["vector_chunks_per_s"] > 0 and b["async_2_chunks_per_s"] > 0
    rows = []
    format_batch(b, lambda name, val=None: rows.append(name))
    assert (
        any("workers_2" in r for r in rows)
        and any("host per slot" in r for r in rows)
        and any("AsyncVectorEnv" in r for r in rows)
    )


def test_bench_batch_refuses_another_env():
    """Another env or a named policy is refused in one line before anything runs."""
    with pytest.raises(ConfigError, match="section batch"):
        bench_batch(Parts(env_kwargs={"image_size": 32}), 20)
