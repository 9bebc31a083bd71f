"""Checkpoints: both files digested, the layout a config describes checked against the header before anything is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from rollcap.kernels.checkpoint import load_module, read_checkpoint_meta, save_checkpoint
from rollcap.kernels.errors import CheckpointMismatch

KIND = "test.Tiny"


class Tiny(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.lin = nn.Linear(n, n)


def _parse(data: dict, where: str) -> int:
    n = data.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{where}: n: expected a positive int, got {n!r}")
    return n


def _load(path: Path, builds: list | None = None) -> nn.Module:
    def build(n: int) -> nn.Module:
        m = Tiny(n)
        if builds is not None:
            builds.append(m.lin.weight.device.type)
        return m

    return load_module(path, KIND, _parse, build)


@pytest.fixture
def ckpt(tmp_path) -> Path:
    torch.manual_seed(0)
    return save_checkpoint(Tiny(4), {"n": 4}, tmp_path / "t", KIND)


def _edit(js: Path, fn, reseal: bool = False) -> None:
    meta = json.loads(js.read_text())
    fn(meta)
    if not reseal:
        meta.pop("meta_digest", None)  # as a checkpoint written before meta_digest
    js.write_text(json.dumps(meta))


def test_round_trip_carries_both_digests(ckpt):
    """The JSON holds weights_digest and meta_digest; a load gives the same tensors."""
    meta = read_checkpoint_meta(ckpt, KIND)
    assert meta["weights_digest"].startswith("sha256:") and meta["meta_digest"].startswith("sha256:")
    torch.manual_seed(0)
    saved = Tiny(4)
    loaded = _load(ckpt)
    assert torch.equal(loaded.lin.weight, saved.lin.weight) and torch.equal(loaded.lin.bias, saved.lin.bias)


def test_flipped_weight_bit_is_refused(ckpt):
    """One flipped bit in the tensor data: CheckpointMismatch naming the .safetensors file and weights_digest."""
    st = ckpt.with_suffix(".safetensors")
    raw = bytearray(st.read_bytes())
    raw[-5] ^= 0x01
    st.write_bytes(bytes(raw))
    with pytest.raises(
        CheckpointMismatch, match=rf"{st}: weights digest sha256:\w+ differs from the config's weights_digest"
    ) as info:
        _load(ckpt)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda m: m["config"].update(n=5), "meta_digest does not match"),
        (lambda m: m.update(weights_digest="sha256:" + "0" * 64), "meta_digest does not match"),
        (lambda m: m.update(extra=1), r"unknown fields \['extra'\]"),
        (lambda m: m.update(format=2), "checkpoint format 2, this rollcap reads format 1"),
        (lambda m: m.pop("weights_digest"), "no weights_digest"),
    ],
)
def test_edited_json_is_refused(ckpt, edit, match):
    """Any edit of the sealed JSON, an unknown field, another format or no weights digest: one line naming the .json."""
    _edit(ckpt, edit, reseal=True)
    with pytest.raises(CheckpointMismatch, match=rf"{ckpt}: {match}"):
        _load(ckpt)


def test_config_describing_more_than_the_weights_builds_nothing(ckpt):
    """n=10^6 (10^12 weights) in a config without meta_digest: refused from the header, after a meta-device build only."""
    _edit(ckpt, lambda m: m["config"].update(n=10**6))
    builds: list[str] = []
    with pytest.raises(
        CheckpointMismatch,
        match=r"t.safetensors: tensor 'lin.weight' is \(4, 4\) torch.float32, the config needs \(1000000, 1000000\)",
    ):
        _load(ckpt, builds)
    assert builds == ["meta"]


def test_damaged_or_oversized_json_is_one_line(ckpt):
    """Bytes that are not UTF-8 JSON, and a 'config' of 17 MiB, are refused naming the file."""
    ckpt.write_bytes(b'{"kind": "\xff\xfe"}')
    with pytest.raises(CheckpointMismatch, match=rf"{ckpt}: not valid JSON"):
        _load(ckpt)
    ckpt.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(CheckpointMismatch, match=rf"{ckpt}: not valid JSON"):
        _load(ckpt)
    ckpt.write_bytes(b" " * (17 << 20))
    with pytest.raises(CheckpointMismatch, match=rf"{ckpt}: \d+ bytes; a checkpoint config is at most"):
        _load(ckpt)


def test_missing_files_are_named(ckpt):
    """No weights file, or no config: CheckpointMismatch naming the missing file."""
    ckpt.with_suffix(".safetensors").unlink()
    with pytest.raises(CheckpointMismatch, match=r"t.safetensors: weights file not found"):
        _load(ckpt)
    ckpt.unlink()
    with pytest.raises(CheckpointMismatch, match=r"t.json: checkpoint config not found"):
        _load(ckpt)


def test_loading_and_capturing_the_shipped_checkpoints_never_imports_dynamo():
    """A second of every process's start-up: torch's meta ``normal_`` and its Python reference ops (the layout check
    on ``meta``) and a dispatch mode's default dynamo wrapper (the capture guard) each import ``torch._dynamo``."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from rollcap.policies.runner import PolicyRunner, load_policy\n"
        "from rollcap.critics.runner import CriticRunner, load_critic\n"
        "from rollcap.policies.sizes import SIZES, build, weight_floor\n"
        "from rollcap.policies import DEFAULT_CHECKPOINT as pol\n"
        "from rollcap.critics import DEFAULT_CHECKPOINT as cri\n"
        "PolicyRunner(load_policy(pol), backend='jit'); CriticRunner(load_critic(cri), backend='jit')\n"
        "weight_floor(SIZES['3b'])\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
