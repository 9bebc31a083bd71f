"""The capsule registry: named capsules across tiers, under an explicit policy.

This is the one piece of *policy* in ``capsule/``, and all of it is spelled
out in :class:`TierBudgets` and :class:`RegistryPolicy`:

- each tier has a byte budget; when one is exceeded, the least recently used
  unpinned capsule on it is demoted one tier (device -> host -> disk); past
  the disk budget it is dropped (or the registry raises, if so configured);
- ``get`` promotes a capsule back to ``promote_to`` (the device tier by
  default), as far up as it fits;
- a pinned capsule is never demoted or dropped, and pinning more than a tier
  holds raises :class:`RegistryFull`.

Not thread-safe: one registry per host loop (a Ray actor owns its own).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rollcap.capsule.capsule import TIERS, Capsule
from rollcap.capsule.errors import RegistryFull
from rollcap.capsule.protocol import Stateful
from rollcap.capsule.tiers import move
from rollcap.capsule.verbs import restore as _restore

_RANK = {t: i for i, t in enumerate(TIERS)}  # device 0 (fastest) ... disk 2


@dataclass(frozen=True)
class TierBudgets:
    """Byte budgets per tier; ``None`` means unbounded."""

    device: int | None = 256 * 2**20
    """Bytes of capsules kept beside the live buffers."""
    host: int | None = 2 * 2**30
    """Bytes of capsules kept in CPU memory."""
    disk: int | None = None
    """Bytes of capsules kept in the registry's directory (0 disables the disk tier)."""

    def __post_init__(self) -> None:
        for tier in TIERS:
            v = getattr(self, tier)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"TierBudgets.{tier} must be a byte count >= 0 or None, got {v!r}")

    def of(self, tier: str) -> int | None:
        return getattr(self, tier)


@dataclass(frozen=True)
class RegistryPolicy:
    """What the registry does when it must choose."""

    promote_to: str = "device"
    """The tier ``get`` brings a capsule back to (as far up as it fits)."""
    disk_full: str = "drop"
    """Past the disk budget: ``"drop"`` the least recently used unpinned capsule, or ``"raise"``."""
    disk_dir: str | None = None
    """Directory for demoted capsules; ``None``: a temporary one removed by ``close()``."""

    def __post_init__(self) -> None:
        if self.promote_to not in TIERS:
            raise ValueError(f"RegistryPolicy.promote_to must be one of {', '.join(TIERS)}, got {self.promote_to!r}")
        if self.disk_full not in ("drop", "raise"):
            raise ValueError(f"RegistryPolicy.disk_full must be 'drop' or 'raise', got {self.disk_full!r}")


@dataclass
class RegistryStats:
    """Counters since the registry was made, and what each tier holds now."""

    hits: int = 0
    misses: int = 0
    promotions: int = 0
    demotions: int = 0
    drops: int = 0
    """Capsules pushed off the last tier by the disk budget."""
    bytes: dict[str, int] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    pinned_bytes: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "promotions": self.promotions,
            "demotions": self.demotions,
            "drops": self.drops,
            "bytes": dict(self.bytes),
            "count": dict(self.count),
            "pinned_bytes": dict(self.pinned_bytes),
        }


@dataclass
class _Entry:
    capsule: Capsule
    pinned: bool = False
    owned_dir: Path | None = None  # a directory this registry wrote, deleted when no longer used


class CapsuleRegistry:
    """Named capsules with pinning, LRU demotion across tiers and promotion on use.

    Args:
        budgets: byte budget per tier.
        policy: promotion target, disk overflow behaviour, disk directory.

    Use as a context manager, or call :meth:`close`, to remove a temporary
    disk directory.
    """

    def __init__(self, budgets: TierBudgets | None = None, policy: RegistryPolicy | None = None):
        self.budgets = budgets or TierBudgets()
        self.policy = policy or RegistryPolicy()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._stats = RegistryStats()
        self._dir: Path | None = Path(self.policy.disk_dir) if self.policy.disk_dir else None
        self._own_tmp = False
        self._seq = 0

    # -- accounting ------------------------------------------------------------
    def _bytes(self, tier: str, pinned_only: bool = False) -> int:
        return sum(
            e.capsule.nbytes for e in self._entries.values() if e.capsule.tier == tier and (e.pinned or not pinned_only)
        )

    def _fits(self, tier: str, nbytes: int, pinned_only: bool = False) -> bool:
        budget = self.budgets.of(tier)
        return budget is None or self._bytes(tier, pinned_only) + nbytes <= budget

    def stats(self) -> RegistryStats:
        """A copy of the counters, with bytes, counts and pinned bytes per tier now."""
        s = RegistryStats(
            self._stats.hits, self._stats.misses, self._stats.promotions, self._stats.demotions, self._stats.drops
        )
        for tier in TIERS:
            s.bytes[tier] = self._bytes(tier)
            s.pinned_bytes[tier] = self._bytes(tier, pinned_only=True)
            s.count[tier] = sum(1 for e in self._entries.values() if e.capsule.tier == tier)
        return s

    def names(self, tier: str | None = None) -> list[str]:
        """Names held (on ``tier`` if given), least recently used first."""
        return [n for n, e in self._entries.items() if tier is None or e.capsule.tier == tier]

    def tier_of(self, name: str) -> str:
        return self._entry(name).capsule.tier

    def is_pinned(self, name: str) -> bool:
        return self._entry(name).pinned

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no capsule named {name!r} in the registry; it holds {list(self._entries)}") from None

    # -- moving ------------------------------------------------------------------
    def _disk_path(self, name: str) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="rollcap-capsules-"))
            self._own_tmp = True
        self._seq += 1
        return self._dir / f"{re.sub(r'[^A-Za-z0-9._-]', '_', name)[:80]}-{self._seq}"

    def _place(self, entry: _Entry, name: str, tier: str) -> None:
        """Move one entry's capsule to ``tier`` (counts nothing)."""
        old_dir = entry.owned_dir
        if tier == "disk":
            path = self._disk_path(name)
            entry.capsule = move(entry.capsule, "disk", path)
            entry.owned_dir = path
        else:
            entry.capsule = move(entry.capsule, tier)
            entry.owned_dir = None
        if old_dir is not None and old_dir != entry.owned_dir:
            shutil.rmtree(old_dir, ignore_errors=True)

    def _discard(self, name: str) -> None:
        entry = self._entries.pop(name)
        if entry.owned_dir is not None:
            shutil.rmtree(entry.owned_dir, ignore_errors=True)

    def _enforce(self) -> None:
        """Demote LRU unpinned capsules until every tier is within budget."""
        for tier, lower in (("device", "host"), ("host", "disk")):
            budget = self.budgets.of(tier)
            while budget is not None and self._bytes(tier) > budget:
                victim = next((n for n, e in self._entries.items() if e.capsule.tier == tier and not e.pinned), None)
                if victim is None:  # pin() and put() check first; kept as a guard
                    raise RegistryFull(
                        f"{tier} tier holds {self._bytes(tier)} bytes of pinned capsules, budget is {budget}; unpin some or raise TierBudgets.{tier}"
                    )
                if lower == "disk" and self.budgets.disk == 0:  # no disk tier: off the end
                    if self.policy.disk_full == "raise":
                        raise RegistryFull(
                            f"host tier is over its budget of {budget} bytes and the disk tier is disabled (TierBudgets.disk=0); drop capsules or raise a budget"
                        )
                    self._discard(victim)
                    self._stats.drops += 1
                    continue
                self._place(self._entries[victim], victim, lower)
                self._stats.demotions += 1
        budget = self.budgets.disk
        while budget is not None and self._bytes("disk") > budget:
            victim = next((n for n, e in self._entries.items() if e.capsule.tier == "disk" and not e.pinned), None)
            if victim is None or self.policy.disk_full == "raise":
                raise RegistryFull(
                    f"disk tier holds {self._bytes('disk')} bytes, budget is {budget}; drop capsules or raise TierBudgets.disk"
                )
            self._discard(victim)
            self._stats.drops += 1

    def _check_pin_room(self, name: str, capsule: Capsule, tier: str) -> None:
        budget = self.budgets.of(tier)
        others = sum(
            e.capsule.nbytes for n, e in self._entries.items() if n != name and e.pinned and e.capsule.tier == tier
        )
        if budget is not None and others + capsule.nbytes > budget:
            raise RegistryFull(
                f"cannot pin {name!r} ({capsule.nbytes} bytes) on the {tier} tier: pinned capsules would hold "
                f"{others + capsule.nbytes} bytes, the budget is {budget}; unpin others or raise TierBudgets.{tier}"
            )

    # -- verbs -------------------------------------------------------------------
    def put(self, name: str, capsule: Capsule, *, pin: bool = False) -> None:
        """Keep ``capsule`` under ``name`` (replacing any old one) on its current tier.

        A disk capsule put here stays where it is and is never deleted by the
        registry. ``pin=True`` pins it on ``policy.promote_to`` (see :meth:`pin`).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"capsule names must be non-empty strings, got {name!r}")
        if pin:
            self._check_pin_room(name, capsule, self.policy.promote_to)
        if name in self._entries:
            self._discard(name)
        entry = _Entry(capsule)
        self._entries[name] = entry
        if pin:
            self._place(entry, name, self.policy.promote_to)
            entry.pinned = True
        self._enforce()

    def get(self, name: str, tier: str | None = None) -> Capsule | None:
        """The capsule named ``name``, promoted toward ``tier`` (default ``policy.promote_to``); ``None`` on a miss.

        It goes to the fastest tier at or below ``tier`` where it fits beside
        the pinned capsules; pinned capsules stay where they are pinned.
        """
        entry = self._entries.get(name)
        if entry is None:
            self._stats.misses += 1
            return None
        self._stats.hits += 1
        self._entries.move_to_end(name)
        target = tier or self.policy.promote_to
        if target not in TIERS:
            raise ValueError(f"unknown tier {target!r}; choose device, host or disk")
        if not entry.pinned and _RANK[target] < _RANK[entry.capsule.tier]:
            for t in TIERS[_RANK[target] : _RANK[entry.capsule.tier]]:
                if self._fits(t, entry.capsule.nbytes, pinned_only=True):
                    self._place(entry, name, t)
                    self._stats.promotions += 1
                    self._enforce()
                    break
        return entry.capsule

    def restore(self, name: str, components: Mapping[str, Stateful], *, atomic: bool = False) -> Capsule:
        """``get`` (promoting) then :func:`rollcap.capsule.restore`; returns the capsule."""
        capsule = self.get(name)
        if capsule is None:
            raise KeyError(f"no capsule named {name!r} in the registry; it holds {list(self._entries)}")
        _restore(capsule, components, atomic=atomic)
        return capsule

    def pin(self, name: str, tier: str | None = None) -> Capsule:
        """Pin a capsule on ``tier`` (default ``policy.promote_to``), moving it there; it is never evicted.

        Raises:
            RegistryFull: pinned capsules on that tier would exceed its budget
                (nothing is moved).
        """
        entry = self._entry(name)
        tier = tier or self.policy.promote_to
        self._check_pin_room(name, entry.capsule, tier)
        if entry.capsule.tier != tier:
            promoted = _RANK[tier] < _RANK[entry.capsule.tier]
            self._place(entry, name, tier)
            if promoted:
                self._stats.promotions += 1
            else:
                self._stats.demotions += 1
        entry.pinned = True
        self._entries.move_to_end(name)
        self._enforce()
        return entry.capsule

    def unpin(self, name: str) -> None:
        """Make a capsule evictable again (it may be demoted at once if its tier is over budget)."""
        self._entry(name).pinned = False
        self._enforce()

    def drop(self, name: str) -> None:
        """Forget a capsule (a directory the registry wrote for it is deleted)."""
        self._entry(name)
        self._discard(name)

    def close(self) -> None:
        """Drop everything and remove the registry's temporary disk directory."""
        for name in list(self._entries):
            self._discard(name)
        if self._own_tmp and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir, self._own_tmp = None, False

    def __enter__(self) -> CapsuleRegistry:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
