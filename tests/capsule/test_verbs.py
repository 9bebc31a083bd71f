"""snapshot / restore / fork on live components (policy over a captured graph + numpy sim)."""

from __future__ import annotations

import dataclasses

import _capsule_components as comps
import numpy as np
import pytest
import torch

from rollcap.capsule import (
    Capsule,
    CapsuleError,
    CapsuleMismatch,
    CorruptCapsule,
    fork,
    restore,
    snapshot,
    to_device,
    to_host,
    validate,
)
from rollcap.kernels import capture_count, tensor_digest


def _without(capsule: Capsule, comp: str, buf: str) -> Capsule:
    state = {c: dict(v) for c, v in capsule.state.items()}
    specs = {c: dict(v) for c, v in capsule.specs.items()}
    del state[comp][buf], specs[comp][buf]
    return Capsule(capsule.boundary, specs, capsule.fingerprints, capsule.tier, state)


def test_byte_restore_every_buffer_equal(world):
    """After restore every live buffer equals the snapshot byte for byte."""
    before = comps.state_bytes(world)
    cap = snapshot(world, "b")
    comps.dirty(world)
    assert comps.state_bytes(world) != before
    restore(cap, world)
    assert comps.state_bytes(world) == before


@pytest.mark.parametrize("tier", ["device", "host"])
def test_state_complete_after_dirtying(world, tier):
    """Snapshot, overwrite every buffer with unrelated replays, restore: the next chunks match the clean path."""
    cap = snapshot(world, "k2", tier=tier, chunk=2)
    clean = [comps.run_chunk(world, k) for k in (2, 3, 4)]
    restore(cap, world)
    comps.dirty(world)  # overwrites every live buffer (test_dirty_overwrites_every_buffer)
    restore(cap, world)
    assert [comps.run_chunk(world, k) for k in (2, 3, 4)] == clean


def test_dirty_overwrites_every_buffer(backend):
    """The adversarial dirtying really changes every live buffer (else the completeness test proves little)."""
    w = comps.make_world(backend)
    comps.run_chunk(w, 0)
    before = comps.state_bytes(w)
    comps.dirty(w)
    after = comps.state_bytes(w)
    same = [f"{c}.{b}" for c in before for b in before[c] if before[c][b] == after[c][b]]
    assert same == []


def test_missing_buffer_caught_live_untouched(world):
    """A capsule lacking one buffer is refused before any copy; live buffers stay as they were."""
    cap = snapshot(world, "full")
    comps.dirty(world)
    live = comps.state_bytes(world)
    for comp, buf in (("policy", "in.h_prev"), ("sim", "qvel")):
        with pytest.raises((CapsuleMismatch, CorruptCapsule), match=buf.replace(".", r"\.")):
            restore(_without(cap, comp, buf), world)
        assert comps.state_bytes(world) == live


def test_capsule_with_state_not_matching_specs_is_corrupt(world):
    """A capsule whose values disagree with its own specs cannot be built."""
    cap = snapshot(world, "x")
    state = {c: dict(v) for c, v in cap.state.items()}
    del state["sim"]["tick"]
    with pytest.raises(CorruptCapsule, match="tick"):
        Capsule(cap.boundary, cap.specs, cap.fingerprints, cap.tier, state)


def test_fingerprint_mismatch_names_field(world, backend):
    """Restoring into a deployment with other weights raises CapsuleMismatch naming component, field, both values."""
    cap = snapshot(world, "w")
    other = comps.make_world(backend, seed=1)
    other["sim"] = world["sim"]
    live = comps.state_bytes(other)
    with pytest.raises(CapsuleMismatch) as info:
        restore(cap, other)
    err = info.value
    assert (err.component, err.field) == ("policy", "weights")
    assert err.expected == cap.fingerprints["policy"]["weights"] and err.got != err.expected
    assert "\n" not in str(err) and "policy" in str(err) and "weights" in str(err)
    assert comps.state_bytes(other) == live


def test_component_set_and_shape_mismatch(world):
    """Missing components and a differently shaped buffer are refused with one-line messages."""
    cap = snapshot(world, "s")
    with pytest.raises(CapsuleMismatch, match="missing \\['sim'\\]"):
        restore(cap, {"policy": world["policy"]})
    sim = comps.ToySim()
    sim.qpos = np.zeros(6)
    live = comps.state_bytes({"sim": sim})
    with pytest.raises(CapsuleMismatch, match=r"sim\.qpos: capsule holds float64\[7\]") as info:
        validate(cap, {"policy": world["policy"], "sim": sim})
    assert info.value.field == "qpos"
    assert comps.state_bytes({"sim": sim}) == live


def test_restore_never_recaptures(world):
    """Restore (any tier, fork branches too) leaves the process capture counter unchanged."""
    cap = snapshot(world, "c")
    host = to_host(cap)
    n = capture_count()
    for c in (cap, host, to_device(host), *fork(cap, 2)):
        restore(c, world)
        comps.run_chunk(world, 5)
    assert capture_count() == n


def test_fork_branches(world):
    """Forks with the same noise give identical outputs, with different noise different ones; the source is unchanged."""
    src = snapshot(world, "root", chunk=2)
    digest = src.digest
    a, b, c = fork(src, 3)
    assert [x.boundary.branch for x in (a, b, c)] == [0, 1, 2]
    outs = []
    for cap, noise in ((a, None), (b, None), (c, 1)):
        restore(cap, world)
        outs.append([comps.run_chunk(world, k, branch_noise=noise) for k in (2, 3)])
    assert outs[0] == outs[1]
    assert outs[0][0] != outs[2][0]
    src.check_untouched()
    src._cache.clear()
    assert src.digest == digest


def test_fork_copy_on_write(world):
    """Default forks share values; with_buffers copies only what it changes; copy=True copies everything."""
    src = snapshot(world, "root")
    a, b = fork(src, 2)
    assert a.state["policy"]["in.x"] is src.state["policy"]["in.x"]
    new_noise = torch.full((comps.B, comps.D), 0.25)
    b2 = b.with_buffers("policy", {"in.noise": new_noise})
    assert b2.state["policy"]["in.noise"] is not b.state["policy"]["in.noise"]
    assert b2.state["policy"]["in.x"] is b.state["policy"]["in.x"]
    assert torch.equal(b2.state["policy"]["in.noise"], new_noise) and not torch.equal(
        src.state["policy"]["in.noise"], new_noise
    )
    assert b2.digest != src.digest == a.digest
    (deep,) = fork(src, 1, copy=True)
    assert deep.state["policy"]["in.x"] is not src.state["policy"]["in.x"] and deep.digest == src.digest
    with pytest.raises(CapsuleMismatch, match="float32\\[4, 8\\]"):
        b.with_buffers("policy", {"in.noise": torch.zeros(3)})


def test_in_place_write_to_capsule_is_caught(world):
    """Writing a capsule tensor in place (it may be shared by forks) is caught at restore; numpy values are read-only."""
    cap = snapshot(world, "guard")
    with pytest.raises(ValueError):
        cap.state["sim"]["qpos"][0] = 1.0
    live = comps.state_bytes(world)
    cap.state["policy"]["in.x"].add_(1.0)
    with pytest.raises(CorruptCapsule, match="in place"):
        restore(cap, world)
    assert comps.state_bytes(world) == live


def test_atomic_restore_puts_back_on_late_refusal(world):
    """If a component refuses after validation, atomic=True puts every component back."""

    class Refuses:
        def __init__(self, inner):
            self.inner = inner

        def live_state(self):
            return self.inner.live_state()

        def load_live_state(self, state):
            raise RuntimeError("hardware interlock")

        def state_fingerprint(self):
            return self.inner.state_fingerprint()

    cap = snapshot(world, "a")
    comps.dirty(world)
    live = comps.state_bytes(world)
    comps_ = {"policy": world["policy"], "sim": Refuses(world["sim"])}
    with pytest.raises(CapsuleError, match="put back"):
        restore(cap, comps_, atomic=True)
    assert comps.state_bytes(world) == live
    with pytest.raises(CapsuleError, match=r"already restored: \['policy'\]"):
        restore(cap, comps_)


def test_dtypes_round_trip_through_tiers():
    """float32, int64, uint8, bool torch and float64/int64/bool/uint8 numpy keep kind, dtype, shape and bytes."""

    class Bag:
        def __init__(self):
            self.s = {
                "f32": torch.linspace(-1, 1, 6).reshape(2, 3),
                "i64": torch.arange(5, dtype=torch.int64) - 2,
                "u8": torch.arange(7, dtype=torch.uint8) * 37,
                "b": torch.tensor([True, False, True]),
                "scalar": torch.tensor(3.5),
                "empty": torch.zeros(0, 4),
                "np_f64": np.linspace(0, 1, 5),
                "np_i64": np.array([-(2**40), 0, 2**40], dtype=np.int64),
                "np_b": np.array([[True, False]]),
                "np_u8": np.arange(10, dtype=np.uint8),
                "np_scalar": np.array(2.25),
            }

        def live_state(self):
            return self.s

        def load_live_state(self, state):
            for k, v in state.items():
                if isinstance(v, np.ndarray):
                    np.copyto(self.s[k], v)
                else:
                    self.s[k].copy_(v)

        def state_fingerprint(self):
            return {"bag": 1}

    bag = Bag()
    ref = comps.state_bytes({"bag": bag})
    cap = snapshot({"bag": bag}, "dtypes")
    for c in (cap, to_host(cap), to_device(to_host(cap))):
        for k, v in c.state["bag"].items():
            assert type(v) is type(bag.s[k]) and v.dtype == bag.s[k].dtype and tuple(v.shape) == tuple(bag.s[k].shape)
    for v in bag.s.values():
        v.fill(0) if isinstance(v, np.ndarray) else v.zero_()
    restore(cap, {"bag": bag})
    assert comps.state_bytes({"bag": bag}) == ref
    assert cap.buffer_digests()["bag"]["f32"] == tensor_digest({"f32": bag.s["f32"]})
    assert cap.specs["bag"]["np_f64"].kind == "numpy" and cap.specs["bag"]["np_f64"].dtype == "float64"


def test_snapshot_refuses_what_it_cannot_hold():
    """Object arrays and non-array values are refused at snapshot with the component and buffer named."""

    class Odd:
        def __init__(self, value):
            self.value = value

        def live_state(self):
            return {"v": self.value}

        def load_live_state(self, state):
            pass

        def state_fingerprint(self):
            return {}

    with pytest.raises(TypeError, match="'odd' buffer 'v'.*no pickling"):
        snapshot({"odd": Odd(np.array([object()]))})
    with pytest.raises(TypeError, match="torch.Tensor or numpy.ndarray"):
        snapshot({"odd": Odd([1, 2])})
    with pytest.raises(TypeError, match="does not implement Stateful"):
        snapshot({"odd": object()})
    with pytest.raises(ValueError, match="tier"):
        snapshot({"odd": Odd(np.zeros(2))}, tier="disk")


def test_boundary_metadata_kept(world):
    """Label, episode, chunk, step, wall time and extra are kept; fork keeps them and sets branch."""
    cap = snapshot(world, "ep-start", episode=3, chunk=0, step=0, extra={"seed": 7})
    b = cap.boundary
    assert (b.label, b.episode, b.chunk, b.step, b.branch, dict(b.extra)) == ("ep-start", 3, 0, 0, None, {"seed": 7})
    assert b.wall_time > 1e9
    assert dataclasses.replace(fork(cap, 1)[0].boundary, branch=None) == b
    with pytest.raises(TypeError, match="JSON"):
        snapshot(world, "bad", extra={"x": object()})
