"""The capsule verbs: snapshot, validate, restore, fork.

Each is a copy of named buffers (or no copy at all, for fork): nothing here
captures, replays or rebuilds a graph. Components are :class:`Stateful`.
Single-threaded: call these between replays, never while a lane is running
over the components' buffers. Importing it imports no torch: snapshots and
restores of numpy state (an env worker's host counters, an env's exact state)
never need it.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Mapping
from typing import Any

from rollcap.capsule.capsule import (
    Boundary,
    BufferInfo,
    Capsule,
    _native_layout,
    carried_digest,
    frozen_json,
    json_normalize,
)
from rollcap.capsule.errors import CapsuleError, CapsuleMismatch
from rollcap.capsule.protocol import Stateful
from rollcap.capsule.tiers import clone_state, copy_state, from_disk

_ABSENT = object()


def _short(value: Any, limit: int = 96) -> str:
    text = "<absent>" if value is _ABSENT else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_STATEFUL_METHODS = ("live_state", "load_live_state", "state_fingerprint")


def _check_components(components: Mapping[str, Stateful]) -> None:
    if not components:
        raise ValueError("no components given; pass a dict of name -> Stateful")
    for name, comp in components.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"component names must be non-empty strings without '/', got {name!r}")
        if not all(callable(getattr(comp, m, None)) for m in _STATEFUL_METHODS):  # cheaper than a Protocol isinstance
            raise TypeError(
                f"component {name!r} ({type(comp).__name__}) does not implement Stateful (live_state, load_live_state, state_fingerprint)"
            )


_LAST_FP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""component -> its last frozen fingerprint (snapshot reuses it while the component's stays equal)."""


def _frozen_fingerprint(name: str, comp: Stateful):
    fp = comp.state_fingerprint()
    try:
        last = _LAST_FP.get(comp)
    except TypeError:  # not weak-referenceable: normalise every time
        last = None
    if last is not None and fp == last:
        return last
    frozen = frozen_json(fp, f"state_fingerprint() of component {name!r}")
    try:
        _LAST_FP[comp] = frozen
    except TypeError:
        pass
    return frozen


_LAST_SPECS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""component -> (its last specs, their (type, dtype, shape, device) per buffer)."""


def _specs_of(name: str, comp: Stateful, values: Mapping[str, Any]) -> dict[str, BufferInfo]:
    """:class:`BufferInfo` of each live value; the component's last specs when every value still fits them."""
    try:
        last = _LAST_SPECS.get(comp)
    except TypeError:
        last = None
    if last is not None and values.keys() == last[1].keys():
        for buf, (typ, dtype, shape, device) in last[1].items():
            v = values[buf]
            if not (
                isinstance(v, typ) and v.dtype == dtype and v.shape == shape and (device is None or v.device == device)
            ):
                break
        else:
            return last[0]
    specs = {}
    for buf, v in values.items():
        try:
            specs[buf] = BufferInfo.of(v)
        except TypeError as err:
            raise TypeError(f"component {name!r} buffer {buf!r}: {err}") from err
    checks = {b: (*_native_layout(i), None if i.kind == "numpy" else _device(i.device)) for b, i in specs.items()}
    try:
        _LAST_SPECS[comp] = (specs, checks)
    except TypeError:
        pass
    return specs


def _device(name: str):
    import torch  # a torch buffer's: torch is imported already

    return torch.device(name)


def snapshot(
    components: Mapping[str, Stateful],
    label: str = "",
    *,
    tier: str = "device",
    episode: int | None = None,
    chunk: int | None = None,
    step: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Capsule:
    """Copy every component's live state into a new capsule.

    Args:
        components: name -> component; all of them are captured.
        label: a short name for the boundary.
        tier: ``"device"`` (beside the live buffers) or ``"host"`` (CPU memory);
            for disk, ``save(snapshot(...), path)``.
        episode / chunk / step / extra: boundary metadata (``extra`` JSON-able).

    Returns:
        A capsule whose values are independent copies; its digest is computed
        on first use, so a device snapshot is only the copy.
    """
    if tier not in ("device", "host"):
        raise ValueError(
            f"snapshot tier must be 'device' or 'host', got {tier!r}; for disk use save(snapshot(...), path)"
        )
    _check_components(components)
    specs: dict[str, dict[str, BufferInfo]] = {}
    fps: dict[str, dict] = {}
    live: dict[str, dict] = {}
    for name, comp in components.items():
        fps[name] = _frozen_fingerprint(name, comp)
        values = dict(comp.live_state())
        specs[name] = _specs_of(name, comp, values)
        live[name] = values
    boundary = Boundary(label, episode, chunk, step, time.time(), extra=dict(extra or {}))
    return Capsule(boundary, specs, fps, tier, copy_state(live, tier))


def _compare_fingerprint(comp: str, expected: Mapping[str, Any], got: Mapping[str, Any]) -> None:
    fields = sorted(set(expected) | set(got))
    diffs = [f for f in fields if expected.get(f, _ABSENT) != got.get(f, _ABSENT)]
    if not diffs:
        return
    f = diffs[0]
    more = f" (also differ: {', '.join(diffs[1:])})" if len(diffs) > 1 else ""
    exp, now = expected.get(f, _ABSENT), got.get(f, _ABSENT)
    raise CapsuleMismatch(
        f"{comp}: fingerprint field {f!r} differs: capsule has {_short(exp)}, live component has {_short(now)}{more}; "
        "restore into the deployment that took the capsule, or take a new capsule",
        component=comp,
        field=f,
        expected=None if exp is _ABSENT else exp,
        got=None if now is _ABSENT else now,
    )


def validate(capsule: Capsule, components: Mapping[str, Stateful]) -> None:
    """Check that ``capsule`` fits ``components`` exactly; copies nothing.

    Checks the component names, then per component the buffer names, kinds,
    shapes and dtypes, then every fingerprint field.

    Raises:
        CapsuleMismatch: the first difference found, named.
        CorruptCapsule: the capsule's own tensors were written in place.
    """
    _validate(capsule, components)


def _validate(capsule: Capsule, components: Mapping[str, Stateful]) -> dict[str, list]:
    """:func:`validate`; returns per component its live values in the capsule's buffer order (the copy targets)."""
    _check_components(components)
    capsule.check_untouched()
    if capsule.specs.keys() != components.keys():
        want, have = set(capsule.specs), set(components)
        missing, extra = sorted(want - have), sorted(have - want)
        raise CapsuleMismatch(
            f"capsule {capsule.label!r} holds components {sorted(want)}, restore was given {sorted(have)} "
            f"(missing {missing}, extra {extra}); pass exactly the components the capsule was taken from",
            expected=sorted(want),
            got=sorted(have),
        )
    layouts = capsule.layouts()
    targets: dict[str, list] = {}
    for name, comp in components.items():
        specs = capsule.specs[name]
        live = comp.live_state()
        fitting = _fitting(live, layouts[name])  # one pass over precomputed (type, dtype, shape); else explain below
        if fitting is not None:
            _check_fingerprint(name, comp, capsule)
            targets[name] = fitting
            continue
        missing, extra = sorted(set(specs) - set(live)), sorted(set(live) - set(specs))
        if missing or extra:
            field = (extra or missing)[0]
            raise CapsuleMismatch(
                f"{name}: live buffers {sorted(live)} differ from the capsule's {sorted(specs)} "
                f"(not in capsule: {extra}, not live: {missing}); take a new capsule of this component",
                component=name,
                field=field,
                expected=sorted(specs),
                got=sorted(live),
            )
        for buf, info in specs.items():
            try:
                now = BufferInfo.of(live[buf])
            except TypeError as err:
                raise CapsuleMismatch(
                    f"{name}.{buf}: live value is not restorable: {err}", component=name, field=buf
                ) from err
            if not info.same_layout(now):
                raise CapsuleMismatch(
                    f"{name}.{buf}: capsule holds {info.describe()}, live buffer is {now.describe()}; "
                    "the component's buffers changed since the snapshot, take a new capsule",
                    component=name,
                    field=buf,
                    expected=info.describe(),
                    got=now.describe(),
                )
        _check_fingerprint(name, comp, capsule)
        targets[name] = [live[buf] for buf in specs]
    return targets


def _fitting(live: Mapping[str, Any], layout: Mapping[str, tuple]) -> list | None:
    """The live values in ``layout``'s order when every one is of the capsule's kind, dtype and shape and no name is missing or extra; else None."""
    if live.keys() != layout.keys():
        return None
    out = []
    for buf, (typ, dtype, shape) in layout.items():
        v = live[buf]
        if not (isinstance(v, typ) and v.dtype == dtype and v.shape == shape):
            return None
        out.append(v)
    return out


def _check_fingerprint(name: str, comp: Stateful, capsule: Capsule) -> None:
    fp = comp.state_fingerprint()
    if fp != capsule.fingerprints[name]:  # the common case is equal as-is; normalise only to compare/explain
        _compare_fingerprint(name, capsule.fingerprints[name], json_normalize(fp, f"state_fingerprint() of {name!r}"))


def restore(capsule: Capsule, components: Mapping[str, Stateful], *, atomic: bool = False) -> None:
    """Validate everything, then copy the capsule back into the live buffers.

    A disk-tier capsule is read (and its digests checked) first. Nothing is
    copied until every component, buffer and fingerprint has been checked, so
    a refused restore leaves every live buffer untouched. No graph is captured.

    Args:
        capsule: what to restore.
        components: name -> component, exactly the capsule's components.
        atomic: also guard against a component refusing *after* validation
            passed (its own ``load_live_state`` raising): take a backup first
            and put already-restored components back. Costs one extra copy.

    Components whose ``loads_by_copy`` is true (their ``load_live_state`` only
    copies each value into the tensor ``live_state()`` gave for it, e.g. a
    :class:`~rollcap.kernels.runner.GraphRunner`) are restored together with
    one ``_foreach_copy_`` into the targets validation checked; the others
    through ``load_live_state``.

    Raises:
        CapsuleMismatch: the capsule does not fit (nothing copied).
        CorruptCapsule: its bytes or manifest are damaged (nothing copied).
    """
    if capsule.tier == "disk":
        capsule = from_disk(capsule)
    targets = _validate(capsule, components)
    backup = snapshot(components, "restore-backup") if atomic else None
    done: list[str] = []
    batch = [n for n, c in components.items() if getattr(c, "loads_by_copy", False) is True and capsule.all_tensors(n)]
    if batch:
        import torch  # the components' buffers are tensors

        try:
            torch._foreach_copy_(
                [v for n in batch for v in targets[n]], [v for n in batch for v in capsule.ordered_values(n)]
            )
        except Exception as err:
            if backup is not None:
                for prev in batch:
                    components[prev].load_live_state(dict(backup.state[prev]))
            raise CapsuleError(
                f"components {batch} could not be copied after validation passed ({type(err).__name__}: {err}); "
                + (
                    "they were put back"
                    if backup is not None
                    else "they may be partly restored (pass atomic=True to have them put back)"
                )
            ) from err
        done += batch
    for name, comp in components.items():
        if name in batch:
            continue
        try:
            comp.load_live_state(dict(capsule.state[name]))
        except Exception as err:
            if backup is not None:
                for prev in done:
                    components[prev].load_live_state(dict(backup.state[prev]))
                state = f"the components restored before it ({done or 'none'}) were put back"
            else:
                state = f"already restored: {done or 'none'} (pass atomic=True to have them put back)"
            raise CapsuleError(
                f"component {name!r} refused the capsule after validation passed ({type(err).__name__}: {err}); {state}"
            ) from err
        done.append(name)


def fork(capsule: Capsule, n: int, *, copy: bool = False) -> list[Capsule]:
    """``n`` independently restorable capsules of one boundary (``boundary.branch`` = 0..n-1).

    Args:
        capsule: the source; it is not changed.
        n: how many branches.
        copy: give each branch its own copy of every value. By default the
            branches share the (immutable) values copy-on-write: restores only
            read them, and :meth:`Capsule.with_buffers` copies what it changes.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"fork needs n >= 1 branches, got {n!r}")
    if capsule.tier == "disk":
        capsule = from_disk(capsule)
    capsule.check_untouched()
    digest = carried_digest(capsule)
    out = []
    for i in range(n):
        state = clone_state(capsule) if copy else capsule.state
        boundary = dataclasses.replace(capsule.boundary, branch=i)
        out.append(Capsule(boundary, capsule.specs, capsule.fingerprints, capsule.tier, state, known_digest=digest))
    return out
