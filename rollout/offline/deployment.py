"""The deployment a recording names, as the default for the tools that re-run it.

A recording's policy fingerprint holds where and how its chunks were computed:
the device (and the GPU's name), the graph backend, the precision, the model
kind and its weights digest, and the sampler (``"variant": "fused"`` in its
config, with the checkpoint's digest as ``fused_from``); the critic's likewise. ``replay`` and ``branch``
take each of these from the recording unless a flag names it, so a CUDA bf16
recording replays on CUDA in bf16 and a run made with the shipped hard-prefix
checkpoint replays with it, without the user knowing which flags it took.

What this machine cannot provide is one line, never a traceback: a CUDA
recording on a machine without CUDA is replayed on the CPU (its episodes are
then "not comparable", exit 1 unless ``--accept-not-comparable``), and a
policy or critic that no shipped checkpoint has (a LeRobot directory, a
checkpoint of your own) names the flag to pass. A run made with a Python
policy object (``rollcap.run(policy=obj)``, a ``ChunkEnv`` over your own
``ChunkPolicy``) names none, since no flag rebuilds an object: one line says
so and names the doors, ``--mode env`` and replay from Python with the same
object. A runner rollcap captured is told apart by its fingerprint's
``component``.

A resumed run (``rollcap run --resume``) is the same question asked the other
way: :func:`check_same_run` refuses to append episodes made with another
deployment to a run, by the one table :data:`SAME_ON_RESUME`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path

from rollcap.rollout.spec import named_policy, byte_fields
from rollcap.rollout.errors import ConfigError

AS_RECORDED = ("device", "backend", "precision", "sampler", "noise_level", "policy", "critic")
"""The :class:`~rollcap.rollout.spec.Parts` fields that default to the recording's (None on the command line: not given)."""


@functools.lru_cache(maxsize=1)
def shipped_checkpoints() -> dict[str, Path]:
    """Weights digest -> the shipped checkpoint (policies and critics) that has it."""
    from rollcap.critics import DEFAULT_CHECKPOINT as CRITIC
    from rollcap.policies import DEFAULT_CHECKPOINT as POLICY

    found = {}
    for folder in (Path(POLICY).parent, Path(CRITIC).parent):
        for js in sorted(folder.glob("*.json")):
            try:
                meta = json.loads(js.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(meta, dict) and isinstance(meta.get("weights_digest"), str):
                found.setdefault(meta["weights_digest"], js)
    return found


def _cuda_here() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _short(digest: str) -> str:
    return digest[:19] + "..." if len(digest) > 22 else digest


def _model_flag(fp: dict, component: str) -> tuple[object, str | None]:
    """(the value of ``--policy`` / ``--critic`` that rebuilds ``fp``, or None; why not, when None and it matters)."""
    kind = str(fp.get("kind") or fp.get("model") or "")
    if kind == "rollcap.expert":
        std = fp.get("std")
        return ("expert" if not std else f"expert:{std}"), None
    digest = fp.get("weights_digest")
    if kind.startswith("lerobot."):
        return (
            None,
            f"a LeRobot policy ({kind}, weights {_short(str(digest))}): pass --{component} lerobot:DIR, its save_pretrained directory",
        )
    if "component" not in fp:  # every runner rollcap captures names its component: this ran as a Python object
        what = ", ".join(x for x in (kind, f"weights {_short(digest)}" if isinstance(digest, str) else "") if x)
        return None, (
            f"a {component} object of your own{f' ({what})' if what else ''}, which rollcap cannot rebuild: replay "
            f"its actions on the env with --mode env, or replay it from Python with the same object "
            f"(rollcap.rollout.offline.replay.replay_{'policy(record, policy, critic)' if component == 'critic' else 'policy(record, policy)'})"
            + (", or pass --critic none" if component == "critic" else "")
        )
    config = fp.get("config") if isinstance(fp.get("config"), dict) else {}
    if config.get("variant") in ("fused", "lean") and isinstance(config.get("fused_from"), str):
        digest = config[
            "fused_from"
        ]  # a fused sampler's weights are re-parameterised: the checkpoint it was fused from
    if isinstance(digest, str) and digest in shipped_checkpoints():
        return shipped_checkpoints()[digest], None
    if not isinstance(digest, str):  # a runner that names no weights: the default checkpoint, as before
        return None, None
    what = f"a {kind or 'model'} whose weights ({_short(str(digest))}) no shipped checkpoint has"
    return None, f"{what}: pass --{component} PATH, the checkpoint it was recorded with" + (
        " (or --critic none)" if component == "critic" else ""
    )


def _device_as_recorded(pol: dict, source, said: list[str]) -> str:
    """The device to replay on: cuda where the policy ran on cuda and this machine has one, else cpu (said why)."""
    if pol.get("device_kind") != "cuda":
        return "cpu"
    name = pol.get("cuda_device", "a GPU")
    if _cuda_here():
        said.append(f"{source}: recorded on cuda ({name}): replaying on cuda")
        return "cuda"
    said.append(
        f"{source}: recorded on cuda ({name}, backend {pol.get('backend', '?')}); this machine has no CUDA device, so it "
        "runs on cpu, where its episodes are compared but not proven exact (exit 1 unless --accept-not-comparable)"
    )
    return "cpu"


def _sampler_as_recorded(given: dict, pol: dict, source, out: dict, said: list[str]) -> None:
    """``out``'s sampler (and an SDE's noise level) as the policy was recorded with; plain for a named policy."""
    config = pol.get("config") if isinstance(pol.get("config"), dict) else {}
    named = (
        given.get("policy") is not None and named_policy(given["policy"]) is not None
    )  # --policy lerobot:DIR / expert: no fused variant
    sampler = config.get("variant") if config.get("variant") in ("fused", "lean") and not named else "plain"
    if pol.get("sampler") == "sde" and not named:
        sampler = "sde"
        if given.get("noise_level") is None:
            out["noise_level"] = pol.get("noise_level")
    if sampler != "plain":
        said.append(f"{source}: recorded with the {sampler} sampler: replaying with it")
    out["sampler"] = sampler


def recorded_parts(given: dict, rec, source, needs_models: bool = True) -> tuple[dict, list[str]]:
    """``given`` (Parts fields; None in :data:`AS_RECORDED` means not given) completed from ``rec``'s fingerprints.

    Returns the Parts keyword arguments and the lines to say (what was taken from the recording where it is
    not the plain default, and what this machine lacks).

    Raises:
        ConfigError: the recording's policy or critic is not a shipped checkpoint and no flag names it, and
            ``needs_models`` (a mode that runs them was asked for); the message says which flag to pass.
    """
    out = {k: v for k, v in given.items() if not (k in AS_RECORDED and v is None)}
    fps = getattr(rec, "fingerprints", None) or {}
    pol = fps.get("policy") or {}
    said: list[str] = []
    if given.get("device") is None:
        out["device"] = _device_as_recorded(pol, source, said)
    from rollcap.kernels.graph import CPU_PLANS, CUDA_PLANS  # (torch): replay and branch need it; --help does not

    on_gpu = str(out["device"]).startswith("cuda")
    if given.get("backend") is None and pol.get("backend") in ("eager", *(CUDA_PLANS if on_gpu else CPU_PLANS)):
        if pol["backend"] not in ("jit", "cuda"):  # the device defaults need no word
            said.append(f"{source}: recorded with backend {pol['backend']}: replaying with it")
        out["backend"] = pol["backend"]
    if given.get("precision") is None:
        precision = pol.get("precision", "fp32")
        if precision == "tf32" and not on_gpu:
            precision = "fp32"  # a CUDA mode: the device line above already says the episodes are not comparable
        elif precision == "fp8" and not on_gpu:
            precision = "bf16"  # likewise: float8 GEMMs are a CUDA mode; the rest of the model ran bf16
        elif precision != "fp32":
            said.append(f"{source}: recorded at precision {precision}: replaying at it")
        out["precision"] = precision
    if given.get("sampler") is None:
        _sampler_as_recorded(given, pol, source, out, said)
    for component in ("policy", "critic"):
        if given.get(component) is not None:
            continue
        fp = fps.get(component)
        if not fp:
            if component == "critic" and pol:  # fingerprints, and none of a critic: it ran without one
                out["critic"] = None
            continue
        value, why = _model_flag(fp, component)
        if value is not None:
            out[component] = value
        elif needs_models and why:
            raise ConfigError(component, f"{source} was recorded with {why}")
    return out, said


# ------------------------------------------------- a resumed run (rollcap run --resume)
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
