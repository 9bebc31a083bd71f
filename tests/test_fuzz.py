"""Fuzz the loaders: truncated, bit-flipped and zeroed recordings, checkpoints and capsules.

Every damaged file either loads as exactly the original (the damage hit slack
bytes) or raises one of the project's one-line errors naming the file; never
another exception type (MemoryError included), and the load leaves the file
and its directory as they were. A handful of damaged files also go through
the ``rollcap`` command: exit 2, one line, no traceback. Seeded; a few
seconds in all.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from rollcap.capsule import CapsuleMismatch, CorruptCapsule, load, save, snapshot
from rollcap.kernels.errors import BadInput, CheckpointMismatch
from rollcap.policies import load_policy, save_policy
from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording import EpisodeRecorder, read_h5, read_npz, records_equal, synthetic_record
from tests.helpers import tiny_policy

SEED = 10
ONE_LINE_ERRORS = (
    CorruptEpisode,
    CorruptCapsule,
    CapsuleMismatch,
    CheckpointMismatch,
    BadInput,
    ValueError,
    FileNotFoundError,
)
ENV_META = {"env_name": "PushBlock-v0", "type": 2, "env_kwargs": {}}


class _Sim:
    """A Stateful component: one torch and one numpy buffer."""

    def __init__(self):
        self.pos = torch.linspace(-1, 1, 24).reshape(4, 6)
        self.tick = np.arange(5, dtype=np.int64)

    def live_state(self) -> dict:
        return {"pos": self.pos, "tick": self.tick}

    def load_live_state(self, state) -> None:
        self.pos.copy_(state["pos"])
        self.tick[:] = state["tick"]

    def state_fingerprint(self) -> dict:
        return {"component": "sim", "backend": "numpy"}


def _same_records(a, b) -> bool:
    return len(a) == len(b) and all(records_equal(x, y) is None for x, y in zip(a, b))


def _same_model(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return (
        a.cfg == b.cfg
        and sa.keys() == sb.keys()
        and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)
    )


def _same_capsule(a, b) -> bool:
    if (a.boundary, a.digest, dict(a.fingerprints)) != (b.boundary, b.digest, dict(b.fingerprints)) or dict(
        a.specs
    ) != dict(b.specs):
        return False
    for comp, bufs in a.state.items():
        for name, x in bufs.items():
            y = b.state[comp][name]
            if type(x) is not type(y) or x.dtype != y.dtype or x.shape != y.shape:
                return False
            if not (torch.equal(x, y) if isinstance(x, torch.Tensor) else np.array_equal(x, y)):
                return False
    return True


@dataclass(frozen=True)
class Target:
    """One file to damage: how to load what holds it, how to compare, how many damages."""

    file: str
    """Path of the damaged file, relative to the originals' root."""
    named: str
    """Path (relative) the error message must name: the file, or a capsule's directory."""
    load: Callable[[Path], object]
    same: Callable[[object, object], bool]
    cases: int


TARGETS = {
    "npz": Target(
        "run/episodes/episode_00000.npz",
        "run/episodes/episode_00000.npz",
        lambda r: [read_npz(r / "run/episodes/episode_00000.npz")],
        _same_records,
        150,
    ),
    "hdf5": Target(
        "run/episodes.hdf5", "run/episodes.hdf5", lambda r: read_h5(r / "run/episodes.hdf5"), _same_records, 60
    ),
    "policy.json": Target("policy.json", "policy.json", lambda r: load_policy(r / "policy.json"), _same_model, 40),
    "policy.safetensors": Target(
        "policy.safetensors", "policy.safetensors", lambda r: load_policy(r / "policy.json"), _same_model, 50
    ),
    "capsule manifest": Target("cap/manifest.json", "cap", lambda r: load(r / "cap"), _same_capsule, 60),
    "capsule tensors": Target("cap/tensors.safetensors", "cap", lambda r: load(r / "cap"), _same_capsule, 80),
}


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> Path:
    """An npz + HDF5 recording of two episodes, a tiny policy checkpoint and a disk capsule."""
    root = tmp_path_factory.mktemp("originals")
    with EpisodeRecorder(root / "run", env_meta=ENV_META) as rec:
        rec.write(synthetic_record(0, 3, steps=10, image_size=16))
    save_policy(tiny_policy(1), root / "policy")
    save(snapshot({"sim": _Sim()}, "fuzz", tier="host", episode=0, chunk=2), root / "cap")
    return root


def damages(data: bytes, n: int, rng: np.random.Generator) -> Iterator[tuple[str, bytes]]:
    """``n`` damaged copies of ``data``: truncations (to 0 and 1 short included), bit flips, byte changes, zeroed runs."""
    yield "truncated to 0 bytes", b""
    yield f"truncated to {len(data) - 1} bytes", data[:-1]
    for _ in range(n - 2):
        kind, pos = int(rng.integers(4)), int(rng.integers(len(data)))
        out = bytearray(data)
        if kind == 0:
            yield f"truncated to {pos} bytes", bytes(out[:pos])
            continue
        if kind == 1:
            bit = int(rng.integers(8))
            out[pos] ^= 1 << bit
            label = f"bit {bit} of byte {pos} flipped"
        elif kind == 2:
            out[pos] ^= int(rng.integers(1, 256))
            label = f"byte {pos} changed"
        else:
            out[pos : pos + 16] = bytes(len(out[pos : pos + 16]))
            label = f"bytes {pos}..{pos + 15} zeroed"
        yield label, bytes(out)


def _listing(directory: Path) -> dict[str, bytes | None]:
    """Name -> bytes of every entry of ``directory`` (``None`` for a subdirectory)."""
    return {p.name: p.read_bytes() if p.is_file() else None for p in directory.iterdir()}


def _problem(target: Target, root: Path, original: object) -> str | None:
    """Load ``target`` under ``root`` once; ``None`` if the contract held, else what broke it."""
    path, named = root / target.file, str(root / target.named)
    before = _listing(path.parent)
    try:
        got = target.load(root)
    except ONE_LINE_ERRORS as err:
        msg = str(err)
        if "\n" in msg or named not in msg:
            return f"{type(err).__name__} not one line naming {named}: {msg!r}"
    except Exception as err:  # noqa: BLE001 - any other type breaks the contract
        return f"{type(err).__name__}: {err}"[:300]
    else:
        if not target.same(got, original):
            return "loaded without error but the data differs from the original"
    if _listing(path.parent) != before:
        return "the load changed the damaged file or its directory"
    return None


@pytest.mark.parametrize("name", list(TARGETS))
def test_damaged_files_load_identically_or_fail_in_one_named_line(originals, tmp_path, name):
    """Each damage of each file: identical data or a one-line project error naming the file; the file untouched."""
    target = TARGETS[name]
    root = tmp_path / "work"
    shutil.copytree(originals, root)
    original = target.load(root)
    path = root / target.file
    clean = path.read_bytes()
    rng = np.random.default_rng([SEED, list(TARGETS).index(name)])
    problems = []
    for label, data in damages(clean, target.cases, rng):
        path.write_bytes(data)
        problem = _problem(target, root, original)
        if problem is not None:
            problems.append(f"{name}, {label}: {problem}")
    path.write_bytes(clean)
    assert not problems, f"{len(problems)} of {target.cases} damaged files broke the contract:\n" + "\n".join(
        problems[:10]
    )


CLI_SAMPLES = [
    ("npz", "inspect"),
    ("hdf5", "inspect"),
    ("capsule manifest", "capsule inspect"),
    ("capsule tensors", "capsule inspect"),
]


@pytest.mark.slow
def test_cli_on_damaged_files_exits_2_in_one_line(originals, tmp_path):
    """``rollcap inspect FILE`` / ``rollcap capsule inspect DIR`` on damaged files: exit 2, one stderr line naming it, no traceback."""
    rng = np.random.default_rng([SEED, 99])
    runs = []
    for i, (name, command) in enumerate(CLI_SAMPLES):
        target = TARGETS[name]
        root = tmp_path / f"s{i}"
        shutil.copytree(originals, root)
        clean = (root / target.file).read_bytes()
        for _label, data in damages(clean, 400, rng):  # the first damage the loader refuses
            (root / target.file).write_bytes(data)
            try:
                target.load(root)
            except ONE_LINE_ERRORS:
                break
        else:
            pytest.fail(f"no damage of {name} was refused")
        arg = root / target.named
        cmd = [sys.executable, "-m", "rollcap.rollout.cli", *command.split(), str(arg)]
        runs.append(
            (
                arg,
                root / target.file,
                data,
                subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            )
        )
    for arg, damaged, data, proc in runs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and str(arg) in err, err
        assert damaged.read_bytes() == data
