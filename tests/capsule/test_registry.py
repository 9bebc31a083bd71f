"""CapsuleRegistry: byte budgets, LRU demotion, promotion on get, pinning, stats."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollcap.capsule import CapsuleRegistry, RegistryFull, RegistryPolicy, TierBudgets, restore, snapshot


class Blob:
    """One uint8 buffer of a given size: capsules of exactly known bytes."""

    def __init__(self, nbytes: int, fill: int = 0):
        self.buf = torch.full((nbytes,), fill, dtype=torch.uint8)

    def live_state(self):
        return {"buf": self.buf}

    def load_live_state(self, state):
        self.buf.copy_(state["buf"])

    def state_fingerprint(self):
        return {"blob": int(self.buf.numel())}


def _cap(fill: int, nbytes: int = 100):
    return snapshot({"blob": Blob(nbytes, fill)}, f"blob{fill}")


def _tiers(reg: CapsuleRegistry) -> dict[str, str]:
    return {n: reg.tier_of(n) for n in reg.names()}


@pytest.fixture
def reg(tmp_path):
    with CapsuleRegistry(
        TierBudgets(device=300, host=300, disk=None), RegistryPolicy(disk_dir=str(tmp_path / "reg"))
    ) as r:
        yield r


def test_lru_demotion_order(reg):
    """Over budget, the least recently used unpinned capsule goes down one tier: device -> host -> disk."""
    for i, n in enumerate("abc"):
        reg.put(n, _cap(i))
    assert set(_tiers(reg).values()) == {"device"}
    reg.put("d", _cap(3))
    assert _tiers(reg) == {"a": "host", "b": "device", "c": "device", "d": "device"}
    reg.get("b", tier="device")  # b becomes most recently used
    reg.put("e", _cap(4))
    assert reg.tier_of("c") == "host" and reg.tier_of("b") == "device"
    reg.put("f", _cap(5))
    reg.put("g", _cap(6))
    assert _tiers(reg) == {
        "a": "disk",
        "c": "host",
        "d": "host",
        "b": "host",
        "e": "device",
        "f": "device",
        "g": "device",
    }
    s = reg.stats()
    assert s.demotions == 5 and s.bytes == {"device": 300, "host": 300, "disk": 100} and s.count["disk"] == 1


def test_promotion_on_get_keeps_bytes(reg):
    """get brings a disk capsule back to the device tier, bytes intact, demoting LRU ones to make room."""
    for i, n in enumerate("abcdefg"):
        reg.put(n, _cap(i))
    assert reg.tier_of("a") == "disk"
    cap = reg.get("a")
    assert cap.tier == "device" and reg.tier_of("a") == "device"
    blob = Blob(100, fill=99)
    restore(cap, {"blob": blob})
    assert torch.equal(blob.buf, torch.zeros(100, dtype=torch.uint8))
    s = reg.stats()
    assert s.promotions == 1 and s.hits == 1 and s.bytes["device"] == 300
    assert reg.get("a", tier="host").tier == "device"  # never demoted by get


def test_restore_through_registry_from_disk(reg):
    """registry.restore promotes a demoted capsule and restores it."""
    reg.put("init", _cap(42))
    for i in range(6):
        reg.put(f"x{i}", _cap(i))
    assert reg.tier_of("init") == "disk"
    blob = Blob(100)
    reg.restore("init", {"blob": blob})
    assert int(blob.buf[0]) == 42 and reg.tier_of("init") == "device"
    with pytest.raises(KeyError, match="nope"):
        reg.restore("nope", {"blob": blob})


def test_pinned_never_evicted(reg):
    """A pinned capsule stays on its tier however many others arrive; unpinning makes it evictable."""
    reg.put("init", _cap(1), pin=True)
    for i in range(10):
        reg.put(f"x{i}", _cap(i + 10))
    assert reg.tier_of("init") == "device" and reg.is_pinned("init")
    reg.unpin("init")
    for i in range(3):
        reg.put(f"y{i}", _cap(i + 30))
    assert reg.tier_of("init") != "device"


def test_over_pin_raises_and_moves_nothing(reg):
    """Pinning more than a tier's budget raises RegistryFull saying so; nothing moves."""
    reg.put("a", _cap(1, nbytes=200), pin=True)
    reg.put("b", _cap(2, nbytes=200))
    before = _tiers(reg)
    with pytest.raises(
        RegistryFull, match=r"cannot pin 'b' \(200 bytes\) on the device tier: .* 400 bytes, the budget is 300"
    ):
        reg.pin("b")
    assert _tiers(reg) == before and not reg.is_pinned("b")
    with pytest.raises(RegistryFull, match="budget"):
        reg.put("c", _cap(3, nbytes=400), pin=True)
    assert "c" not in reg
    reg.pin("b", tier="host")
    assert reg.tier_of("b") == "host" and reg.is_pinned("b")


def test_stats_hits_misses_bytes(reg):
    """Hits, misses and bytes per tier are counted."""
    reg.put("a", _cap(1))
    assert reg.get("a") is not None and reg.get("zzz") is None and reg.get("a") is not None
    s = reg.stats()
    assert (s.hits, s.misses, s.promotions) == (2, 1, 0)
    assert s.to_json()["bytes"] == {"device": 100, "host": 0, "disk": 0}
    reg.drop("a")
    assert len(reg) == 0 and reg.stats().bytes["device"] == 0


def test_disk_budget_drops_or_raises(tmp_path):
    """Past the disk budget the LRU unpinned capsule is dropped (default) or the registry raises."""
    budgets = TierBudgets(device=100, host=0, disk=200)
    with CapsuleRegistry(budgets) as reg:
        for i in range(5):
            reg.put(f"c{i}", _cap(i))
        assert reg.names() == ["c2", "c3", "c4"] and reg.stats().drops == 2
        disk_dir = reg._dir
        assert disk_dir is not None and len(list(disk_dir.iterdir())) == 2
    assert not disk_dir.exists()  # the temporary directory is removed by close()
    with CapsuleRegistry(budgets, RegistryPolicy(disk_full="raise", disk_dir=str(tmp_path / "r"))) as reg:
        for i in range(3):
            reg.put(f"c{i}", _cap(i))
        with pytest.raises(RegistryFull, match="disk tier"):
            reg.put("c3", _cap(3))


def test_no_disk_tier(tmp_path):
    """With TierBudgets.disk=0 nothing is written to disk; capsules past the host budget are dropped."""
    with CapsuleRegistry(
        TierBudgets(device=100, host=100, disk=0), RegistryPolicy(disk_dir=str(tmp_path / "r"))
    ) as reg:
        for i in range(3):
            reg.put(f"c{i}", _cap(i))
        assert _tiers(reg) == {"c1": "host", "c2": "device"} and not (tmp_path / "r").exists()


def test_numpy_capsules_survive_demotion(tmp_path):
    """Numpy state demoted to disk comes back as numpy with its dtype."""

    class Sim:
        def __init__(self):
            self.q = np.arange(8, dtype=np.float64)

        def live_state(self):
            return {"q": self.q}

        def load_live_state(self, state):
            np.copyto(self.q, state["q"])

        def state_fingerprint(self):
            return {}

    with CapsuleRegistry(TierBudgets(device=0, host=0), RegistryPolicy(disk_dir=str(tmp_path / "r"))) as reg:
        reg.put("s", snapshot({"sim": Sim()}))
        assert reg.tier_of("s") == "disk"
        cap = reg.get("s")
        assert cap.tier == "disk"  # fits nowhere above: stays, and still restores
        sim = Sim()
        sim.q[:] = 0
        restore(cap, {"sim": sim})
        assert sim.q.dtype == np.float64 and sim.q.tolist() == list(range(8))


def test_policy_dataclasses_validate():
    """Budgets and policy reject nonsense with the field named."""
    with pytest.raises(ValueError, match="TierBudgets.host"):
        TierBudgets(host=-1)
    with pytest.raises(ValueError, match="promote_to"):
        RegistryPolicy(promote_to="gpu")
    with pytest.raises(ValueError, match="disk_full"):
        RegistryPolicy(disk_full="maybe")
