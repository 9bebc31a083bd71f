"""``rollcap bench --only batch`` (opt-in): its quick run reports every configuration and formats."""

from __future__ import annotations

import pytest

from rollcap.rollout.bench.batch import bench_batch, format_batch
from rollcap.rollout.build import Parts
from rollcap.rollout.errors import ConfigError


@pytest.mark.slow(seconds=60)
def test_bench_batch_quick():
    """The quick section runs envs 1, 8 and 8 on graphs, and the vector env against AsyncVectorEnv(2); every figure is a positive rate."""
    b = bench_batch(Parts(), 20)
    assert b["configs"] == ["envs_1", "envs_8", f"envs_8_graphs_{b['graphs']}"]
    rates = [x for name in b["configs"] for x in b[f"{name}_episodes_per_s"] + b[f"{name}_episodes_per_cpu_s"]]
    assert rates and all(x > 0 for x in rates)
    assert b["vector_chunks_per_s"] > 0 and b["async_2_chunks_per_s"] > 0 and b["vector_graphs_chunks_per_s"] > 0
    rows = []
    format_batch(b, lambda name, val=None: rows.append(name))
    assert any("envs_8" in r for r in rows) and any("AsyncVectorEnv" in r for r in rows)


def test_bench_batch_refuses_another_env():
    """Another env or a named policy is refused in one line before anything runs."""
    with pytest.raises(ConfigError, match="section batch"):
        bench_batch(Parts(env_kwargs={"image_size": 32}), 20)
