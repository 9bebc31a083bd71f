"""Resume: where an episode that starts mid-way (a branch, a retry) begins.

:meth:`RolloutHost.start(index, seed, at=Resume(...)) <rollcap.rollout.host.RolloutHost.start>`
resets the env from the episode seed as usual, then puts the env's exact state
of a chunk boundary of another episode (the *parent*) in place and continues
from there. The new episode is recorded like any other, with its own steps and
chunks counted from 0, the boundary's state as its initial state, and
:attr:`Resume.origin` as its lineage (``EpisodeRecord.origin``), so it replays
on its own: :func:`resume_of` rebuilds the ``Resume`` from the record alone.

What a boundary's future depends on, and where each part comes from:

- the env's exact state (physics, RNG, task, step counters): ``env_state``;
- the observation the boundary sees: ``obs`` (the env has no "observe" call);
- the stop predicates' counters (a timeout counted in chunks, the critic's
  patience): the parent's chunk and step counts (``chunk``, ``step``) and the
  critic values of its earlier chunks (``prior_values``), replayed into the
  predicates;
- the policy's and critic's carried state: the episode-initial capsule, which
  is exact for runners that carry nothing from one chunk to the next (a
  real-time-chunking runner carries its last chunk: not supported yet).

A resumed *run* (``rollcap run --resume``) is the other meaning of the word:
:func:`check_same_run` refuses to append episodes made with another
deployment to a run, by the one table :data:`SAME_ON_RESUME`.

Imports point downward: this module knows ``protocols`` only (and ``replay``'s observation helper).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rollcap.rollout.spec import byte_fields
from rollcap.rollout.protocols import Observation


@dataclass(frozen=True)
class Resume:
    """A chunk boundary of a parent episode to start a new episode at (see the module docstring)."""

    env_state: Mapping[str, np.ndarray]
    """The env's exact state at the boundary (``get_state()`` layout)."""
    obs: Observation
    """The observation the boundary sees (instruction included for dict observations)."""
    chunk: int
    """Chunk boundaries passed before this one (``K``), counted from the root episode (a parent that
    itself began mid-way adds where it began)."""
    step: int
    """Env steps executed before this boundary, counted the same way."""
    origin: dict
    """Lineage, recorded with the new episode (JSON-able): parent file, episode, chunk, branch, noise, ..."""
    noise: np.ndarray | None = None
    """``[C, H, A]`` float32 noise for the new episode's first ``C`` chunks (the control branch: the
    parent's own); later chunks, and all of them when None, are derived from the episode seed."""
    prior_values: tuple[float, ...] = ()
    """The critic values at chunks ``0 .. K-1`` (same count), replayed into the stop predicates."""

    def __post_init__(self):
        if self.chunk < 0 or self.step < 0:
            raise ValueError(f"Resume: chunk and step must be >= 0, got {self.chunk} and {self.step}")
        if len(self.prior_values) != self.chunk:
            raise ValueError(
                f"Resume: prior_values holds {len(self.prior_values)} values, expected one per earlier chunk ({self.chunk})"
            )


ORIGIN_KEYS = ("parent", "episode", "chunk", "step", "branch", "noise", "prior_values", "offset")
"""What :attr:`Resume.origin` holds for a branch (see :mod:`rollcap.rollout.offline.branch`): ``chunk`` and ``step``
count in the parent's own episode; ``offset`` (only when the parent itself began mid-way) is where the
parent began, so the new episode's predicates count from ``offset + (chunk, step)``."""


@dataclass(frozen=True)
class Offset:
    """Where an episode began in its root episode's counts, and the root's critic values before that."""

    chunk: int = 0
    step: int = 0
    prior_values: tuple[float, ...] = ()


def offset_of(record) -> Offset:
    """Where ``record`` began (zero for an ordinary episode), from its ``origin``."""
    origin = record.origin
    if origin is None:
        return Offset()
    k0, t0 = origin.get("offset", (0, 0))
    return Offset(
        int(k0) + int(origin["chunk"]),
        int(t0) + int(origin["step"]),
        tuple(float(v) for v in origin.get("prior_values", ())),
    )


def resume_of(record) -> Resume | None:
    """The :class:`Resume` that re-runs a recorded resumed episode from its record alone (None: an ordinary episode).

    The boundary state is the record's initial state, its observation the
    record's first one; a control branch (``origin["noise"] == "parent"``) gets
    its recorded noise back, any other derives its noise from its seed again,
    so a replay checks that derivation too.
    """
    origin = record.origin
    if origin is None:
        return None
    from rollcap.rollout.protocols import observation_at

    noise = record.chunks["noise"] if origin.get("noise") == "parent" else None
    at = offset_of(record)
    return Resume(
        dict(record.initial_state),
        observation_at(record, 0),
        at.chunk,
        at.step,
        dict(origin),
        noise=noise,
        prior_values=at.prior_values,
    )


RECORDED_AS = {"env_id": "env", "envs": "batch"}
"""A setting's name in what an episode records, where it is not the option's (the batch is ``envs`` / ``graphs``)."""
SAME_ON_RESUME = tuple((RECORDED_AS.get(name, name), name) for name, _ in byte_fields() if name != "graphs")
"""What ``resume=True`` compares, in order (the first difference is named): ``(setting, option)`` for every spec field an
episode's bytes depend on (:func:`rollcap.rollout.spec.byte_fields`, one list; ``graphs`` counts through the batch). Anything else in the fingerprints (a
torch version, a CPU capability) is refused as well, naming ``resume`` and the fingerprint field. Not here, because
the bytes do not depend on them: ``graphs`` at one batch, ``actors``, ``writers``, ``env_workers``, ``threads``."""


def deployment(config: Mapping, fingerprints: Mapping, env_id: str, env_kwargs: Mapping) -> dict:
    """The :data:`SAME_ON_RESUME` settings of one episode, from what its record holds (or what a host would record)."""
    pol = fingerprints.get("policy") or {}
    crit = fingerprints.get("critic")
    pcfg = pol.get("config") if isinstance(pol.get("config"), Mapping) else {}
    variant = pcfg.get("variant") or "plain"  # fused, lean: re-parameterised, their weights are the checkpoint's
    fused = variant != "plain"
    out = {
        "env": env_id,
        "env_kwargs": dict(env_kwargs),
        "device": pol.get("device_kind", "cpu"),  # the GPU's name is the machine's (the fingerprint check below)
        "backend": pol.get("backend"),
        "precision": pol.get("precision", "fp32"),
        "sampler": pol.get("sampler") or variant,  # sde: its own sampler, the checkpoint's weights
        "noise_level": pol.get("noise_level"),
        "policy": _weights(pol, pcfg.get("fused_from") if fused else None),
        "critic": None if crit is None else _weights(crit),
        "batch": pol.get("batch", 1),
    }
    out.update({name: config.get(name) for name, _ in SAME_ON_RESUME if name not in out})
    return out


def _weights(fp: Mapping, digest: str | None = None) -> str | None:
    what = fp.get("weights_digest") if digest is None else digest
    kind = fp.get("model") or fp.get("kind")
    return f"{kind} {what}" if kind and what else (what or kind)


def check_same_run(
    recorded, config: Mapping, fingerprints: Mapping, env_id: str, env_kwargs: Mapping, graphs=1, elsewhere=False
):
    """Refuse to resume a run whose episode ``recorded`` was made with another deployment than this one.

    ``config`` (the host config as JSON), ``fingerprints``, ``env_id`` and ``env_kwargs`` are what this run would
    record; ``graphs`` the graphs this run splits its envs over (the batch is envs / graphs). ``elsewhere``: the
    episodes run on other machines (Ray actors), whose versions and CPU this process cannot speak for, so only the
    table's settings are compared.

    Raises:
        ConfigError: the first :data:`SAME_ON_RESUME` setting that differs (naming its option, both values), else
            any other fingerprint field that differs (naming ``resume``).
    """
    from rollcap.rollout.errors import ConfigError

    was = deployment(recorded.config, recorded.fingerprints, recorded.env_id, recorded.env_kwargs)
    now = deployment(config, fingerprints, env_id, env_kwargs)
    for setting, option in SAME_ON_RESUME:
        if _json(was[setting]) != _json(now[setting]):
            was_, got = _show(was[setting]), _show(now[setting])
            recorded_with = {"policy": "policy weights", "critic": "critic weights"}.get(setting, setting)
            if setting == "batch":  # the bytes depend on the batch of each graph: envs / graphs
                got += f" (`envs={now[setting] * graphs}` over `graphs={graphs}`)"
                raise ConfigError(
                    option, f"this run was recorded at batch {was_} (envs / graphs); `resume=True` needs it, got {got}"
                )
            raise ConfigError(
                option, f"this run was recorded with {recorded_with} {was_}; `resume=True` needs the same, got {got}"
            )
    rest = [] if elsewhere else fingerprint_diff(_plain(recorded.fingerprints), _plain(fingerprints))
    if rest:
        name = rest[0]
        raise ConfigError(
            "resume",
            f"this run was recorded with {name} {_show(_at(recorded.fingerprints, name))}, this process has "
            f"{_show(_at(fingerprints, name))}; resume it where it was recorded, or start a new run",
        )


def fingerprint_diff(recorded: dict, current: dict, prefix: str = "") -> list[str]:
    """Names of fields that differ between two fingerprints (nested dicts flattened)."""
    out = []
    for k in sorted(set(recorded) | set(current)):
        a, b = recorded.get(k), current.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += fingerprint_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}")
    return out


def _at(fp: Mapping, dotted: str):
    for key in dotted.split("."):
        fp = fp.get(key) if isinstance(fp, Mapping) else None
    return fp


def _json(v) -> str:
    return json.dumps(v, sort_keys=True, default=lambda o: list(o) if isinstance(o, tuple) else str(o))


def _plain(v):
    return json.loads(_json(v))


def _show(v) -> str:
    if v is None:
        return "none"
    return _json(v) if isinstance(v, (dict, list, tuple)) else str(v)
