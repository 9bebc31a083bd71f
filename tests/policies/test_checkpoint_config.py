"""Checkpoint configs: each bad field is refused in one line naming the checkpoint file and the field."""

from __future__ import annotations

import json

import pytest

from rollcap.critics.runner import load_critic, save_critic
from rollcap.kernels.errors import CheckpointMismatch
from rollcap.policies import FlowVLAConfig, load_policy, save_policy
from tests.helpers import TINY_POLICY, tiny_critic, tiny_policy

BAD_FIELDS = [
    ("cfg_beta", float("nan"), "a finite number"),
    ("width", 10**15, r"an int in 1..65536"),
    ("horizon", 10**12, r"an int in 1..4096"),
    ("depth", "three", r"an int in 1..256, got 'three'"),
    ("depth", True, r"an int in 1..256, got True"),
    ("heads", 3, "a divisor of width 32"),
    ("image_size", 40, "a divisor of image_size 40"),
    ("width", 33, "a divisor of width 33"),
    ("image_keys", ["state"], "up to 16 distinct non-empty names other than"),
    ("adv_dropout", "0.3", "a finite number"),
    ("execute_steps", 9, r"an int in 1..4"),
    ("state_group", 2, "0 or a divisor of state_dim 5"),
]


@pytest.mark.parametrize("field,value,expected", BAD_FIELDS, ids=[f"{f}={v!r}" for f, v, _ in BAD_FIELDS])
def test_bad_config_field_names_file_and_field(tmp_path, field, value, expected):
    """A config field no FlowVLA can have: CheckpointMismatch '<file>.json: FlowVLAConfig.<field>: expected ...'."""
    js = save_policy(tiny_policy(), tmp_path / "p")
    meta = json.loads(js.read_text())
    meta["config"][field] = value
    del meta["meta_digest"]  # as a checkpoint written before meta_digest, so the config itself is what is checked
    js.write_text(json.dumps(meta))
    with pytest.raises(CheckpointMismatch, match=rf"^{js}: FlowVLAConfig\.\w+: expected {expected}") as info:
        load_policy(js)
    assert "\n" not in str(info.value) and field in str(info.value)


def test_config_within_bounds_but_not_these_weights(tmp_path):
    """depth 2 where the weights hold one block: refused from the header, naming a missing tensor."""
    js = save_policy(tiny_policy(), tmp_path / "p")
    meta = json.loads(js.read_text())
    meta["config"]["depth"] = 2
    del meta["meta_digest"]
    js.write_text(json.dumps(meta))
    with pytest.raises(
        CheckpointMismatch, match=r"p.safetensors: tensors do not match the config: missing \['encoder.blocks.1"
    ):
        load_policy(js)


def test_critic_config_fields_are_checked(tmp_path):
    """The critic's n_bins is bounded and named the same way."""
    js = save_critic(tiny_critic(), tmp_path / "c")
    meta = json.loads(js.read_text())
    meta["config"]["n_bins"] = 10**9
    del meta["meta_digest"]
    js.write_text(json.dumps(meta))
    with pytest.raises(CheckpointMismatch, match=rf"^{js}: ValueCriticConfig\.n_bins: expected an int in 2..65536"):
        load_critic(js)


def test_config_constructor_names_the_field():
    """Building a config in code gives the same messages (no file to name)."""
    with pytest.raises(ValueError, match=r"^FlowVLAConfig\.heads: expected a divisor of width 32, got 3$"):
        FlowVLAConfig(**{**TINY_POLICY.to_json(), "image_keys": ("image_front",), "heads": 3})
