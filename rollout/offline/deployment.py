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
checkpoint of your own) names the flag to pass.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from rollcap.rollout.build import named_policy
from rollcap.kernels.graph import CPU_PLANS, CUDA_PLANS
from rollcap.rollout.errors import ConfigError

AS_RECORDED = ("device", "backend", "precision", "sampler", "noise_level", "policy", "critic")
"""The :class:`~rollcap.rollout.build.Parts` fields that default to the recording's (None on the command line: not given)."""


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
    config = fp.get("config") if isinstance(fp.get("config"), dict) else {}
    if config.get("variant") in ("fused", "lean") and isinstance(config.get("fused_from"), str):
        digest = config[
            "fused_from"
        ]  # a fused sampler's weights are re-parameterised: the checkpoint it was fused from
    if isinstance(digest, str) and digest in shipped_checkpoints():
        return shipped_checkpoints()[digest], None
    if not kind and not isinstance(digest, str):  # not a model rollcap builds (a Python policy of your own): as before
        return None, None
    if not isinstance(digest, str):  # a policy of the user's own, with no weights (a scripted controller)
        return None, (
            f"a {component} of its own ({kind}, no weights), which no flag rebuilds: replay its actions on the env "
            f"with --mode env, or replay the {component} from Python (rollcap.rollout.offline.replay)"
            + (", or pass --critic none" if component == "critic" else "")
        )
    if kind.startswith("lerobot."):
        return (
            None,
            f"a LeRobot policy ({kind}, weights {_short(str(digest))}): pass --{component} lerobot:DIR, its save_pretrained directory",
        )
    what = f"a {kind or 'model'} whose weights ({_short(str(digest))}) no shipped checkpoint has"
    return None, f"{what}: pass --{component} PATH, the checkpoint it was recorded with" + (
        " (or --critic none)" if component == "critic" else ""
    )


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
        device = "cpu"
        if pol.get("device_kind") == "cuda":
            name = pol.get("cuda_device", "a GPU")
            if _cuda_here():
                device = "cuda"
                said.append(f"{source}: recorded on cuda ({name}): replaying on cuda")
            else:
                said.append(
                    f"{source}: recorded on cuda ({name}, backend {pol.get('backend', '?')}); this machine has no CUDA device, so it "
                    "runs on cpu, where its episodes are compared but not proven exact (exit 1 unless --accept-not-comparable)"
                )
        out["device"] = device
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
