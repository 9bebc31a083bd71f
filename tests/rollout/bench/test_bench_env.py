"""`rollcap bench --env`: the env section measures the env named (MetaWorld: step and image cost); parts a section cannot measure are refused first."""

from __future__ import annotations

import os

import pytest

from rollcap.rollout.bench.report import check_parts
from rollcap.rollout.spec import Parts
from rollcap.rollout.errors import ConfigError


def test_env_section_measures_the_named_env():
    """MetaWorld push-v3: ms per step without images, and the images' cost when a headless GL is set (else why not)."""
    pytest.importorskip("metaworld")
    from rollcap.rollout.bench.env import bench_named_env

    r = bench_named_env("rollcap/MetaWorld-push-v3", {}, steps=30, image_steps=3)
    assert r["env_id"] == "rollcap/MetaWorld-push-v3" and r["no_images_step_ms_median"] > 0
    if os.environ.get("MUJOCO_GL") in ("egl", "osmesa"):
        assert r["image_ms_per_obs"] > 0 and r["images_step_ms_median"] > r["no_images_step_ms_median"]
    else:
        assert "MUJOCO_GL" in r["images_skipped"] and "image_ms_per_obs" not in r
    plain = bench_named_env("Pendulum-v1", {}, steps=30, image_steps=3)  # no render_images option: as configured
    assert plain["step_ms_median"] > 0 and "render_images" in plain["images_skipped"]


def test_sections_refuse_what_they_cannot_measure():
    """The expert or no critic has no captured graph (models, capsule, peer); an env the shipped policy cannot read is refused
    for the sections that run it there, before any section runs; the env section alone takes any env."""
    with pytest.raises(ConfigError, match="expert: section.s. models,peer measure a checkpoint") as err:
        check_parts(Parts(policy="expert", critic="none"), ("env", "models", "host", "peer"))
    assert err.value.field == "policy"
    with pytest.raises(ConfigError) as err:
        check_parts(Parts(critic="none"), ("capsule",))
    assert err.value.field == "critic"
    check_parts(Parts(policy="expert", critic="none"), ("env", "host", "gym", "branch", "recording"))
    check_parts(Parts(env_id="Pendulum-v1"), ("env",))
    with pytest.raises(ConfigError, match="Pendulum-v1 observations are a Box space; the policy reads") as err:
        check_parts(Parts(env_id="Pendulum-v1"), ("env", "host"))
    assert err.value.field == "policy"  # the env has no kwargs to blame: the model that cannot read it is named
