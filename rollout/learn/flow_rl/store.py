"""What a flow-RL run keeps on disk, without pickle: the weights each recorded episode names, and the state a resume
goes on from.

::

    out/weights/<digest16>.json + .safetensors   a policy checkpoint per weights digest an episode ran with
    out/state/state.json                          counters, curve, held-in points, config (canonical JSON)
    out/state/tensors.safetensors                 the learner's weights, Adam's moments, the value head, the kept weights

:func:`find_weights` maps a recorded episode's ``weights_digest`` to its checkpoint (``rollcap replay EPISODE --policy
PATH``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rollcap.kernels.checkpoint import read_checkpoint_meta
from rollcap.kernels.files import atomic_write, canonical_json
from rollcap.policies.runner import KIND, save_policy

WEIGHTS_DIR, STATE_DIR = "weights", "state"
STATE_VERSION = 1


def weights_path(out: Path, digest: str) -> Path:
    """Where the checkpoint of the weights with ``digest`` lives in run ``out`` (the json's path)."""
    return Path(out) / WEIGHTS_DIR / f"{digest.removeprefix('sha256:')[:16]}.json"


def save_weights(model, out: Path, digest: str) -> Path:
    """``model``'s checkpoint under its ``digest`` (written once; the checkpoint's own digest must be ``digest``)."""
    path = weights_path(out, digest)
    if not path.exists():
        save_policy(model, path)
    meta = read_checkpoint_meta(path, KIND)
    if meta["weights_digest"] != digest:
        raise ValueError(f"{path}: holds weights {meta['weights_digest']}, not {digest}")
    return path


def find_weights(out: Path, digest: str) -> Path | None:
    """The checkpoint in run ``out`` whose weights have ``digest`` (None: not kept)."""
    path = weights_path(out, digest)
    if not path.exists():
        return None
    return path if read_checkpoint_meta(path, KIND)["weights_digest"] == digest else None


def _flat_optimizer(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors, steps = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"opt.{pid}.{k}"] = v.detach().clone().contiguous()
            else:
                steps[f"{pid}.{k}"] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": steps}


def _unflat_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict = {}
    for name, t in tensors.items():
        if name.startswith("opt."):
            _, pid, k = name.split(".", 2)
            state.setdefault(int(pid), {})[k] = t
    for name, v in meta["scalars"].items():
        pid, k = name.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_state(out: Path, modules: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer],
               extra: dict[str, dict[str, torch.Tensor]], meta: dict) -> None:  # fmt: skip
    """Everything a resume needs: the modules' weights, the optimisers' state, ``extra`` tensor sets (the kept
    weights), and ``meta`` (JSON). The tensors first, then the JSON that names them: a crash leaves the old state."""
    folder = Path(out) / STATE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    tensors, opt_meta = {}, {}
    for name, m in modules.items():
        tensors.update({f"{name}/{k}": v.detach().clone().contiguous() for k, v in m.state_dict().items()})
    for name, opt in optimizers.items():
        t, om = _flat_optimizer(opt)
        tensors.update({f"{name}/{k}": v for k, v in t.items()})
        opt_meta[name] = om
    for name, sd in extra.items():
        tensors.update({f"{name}/{k}": v.detach().clone().contiguous() for k, v in sd.items()})
    atomic_write(folder / "tensors.safetensors", lambda p: save_file(tensors, p))
    body = {"version": STATE_VERSION, "meta": meta, "optimizers": opt_meta, "extra": sorted(extra)}
    atomic_write(folder / "state.json", lambda p: Path(p).write_text(canonical_json(body, indent=1)))


def load_state(
    out: Path, modules: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer]
) -> tuple[dict, dict]:
    """Load what :func:`save_state` wrote into ``modules`` and ``optimizers``; returns ``(meta, extra tensor sets)``.

    Raises:
        ValueError: one line naming the file: missing, damaged or of another version.
    """
    folder = Path(out) / STATE_DIR
    js, st = folder / "state.json", folder / "tensors.safetensors"
    try:
        body = json.loads(js.read_text())
        tensors = load_file(st)
    except (OSError, ValueError) as err:
        raise ValueError(f"{folder}: no readable training state to resume ({err})") from None
    if not isinstance(body, dict) or body.get("version") != STATE_VERSION:
        raise ValueError(f"{js}: a training state of version {body.get('version') if isinstance(body, dict) else '?'}, this rollcap reads {STATE_VERSION}")  # fmt: skip
    for name, m in modules.items():
        m.load_state_dict({k[len(name) + 1 :]: v for k, v in tensors.items() if k.startswith(f"{name}/")})
    for name, opt in optimizers.items():
        sub = {k[len(name) + 1 :]: v for k, v in tensors.items() if k.startswith(f"{name}/")}
        _unflat_optimizer(opt, sub, body["optimizers"][name])
    extra = {
        name: {k[len(name) + 1 :]: v for k, v in tensors.items() if k.startswith(f"{name}/")} for name in body["extra"]
    }
    return body["meta"], extra
