"""``rollcap bench``'s options for section batch (light: the parser imports it for every command)."""

from __future__ import annotations

from rollcap.rollout.errors import ConfigError


def add_batch_arguments(p) -> None:
    """``--batch-envs LIST``, ``--batch-workers W``, ``--batch-standin MS`` on ``p``."""
    p.add_argument("--batch-envs", default=None, metavar="LIST", help="section batch: the envs counts, a comma list (default 1,8 on CPU, 1,32 on CUDA)")  # fmt: skip
    p.add_argument("--batch-workers", type=int, default=None, metavar="W", help="section batch: env workers of each envs > 1 run (default: one a core, leaving one to this process past 2 cores)")  # fmt: skip
    p.add_argument("--batch-standin", type=float, default=None, metavar="MS", help="section batch: also run a stand-in policy whose replay takes MS (default 4 on CPU, none on CUDA; 0: none)")  # fmt: skip


def batch_options(envs: str | None, workers: int | None, standin_ms: float | None) -> dict:
    """The section's keyword arguments; a bad value is a ConfigError naming its option (the CLI: one line, exit 2)."""
    try:
        counts = tuple(int(e) for e in envs.split(",")) if envs else None
    except ValueError:
        raise ConfigError("batch_envs", f"expected a comma list of integers, got {envs!r}") from None
    if counts is not None and not all(1 <= e <= 1024 for e in counts):
        raise ConfigError("batch_envs", f"each in 1..1024, got {envs}")
    if workers is not None and workers < 1:
        raise ConfigError("batch_workers", f"expected an integer >= 1, got {workers}")
    if standin_ms is not None and not 0 <= standin_ms < float("inf"):
        raise ConfigError("batch_standin", f"expected milliseconds >= 0, got {standin_ms}")
    return {"envs": counts, "workers": workers, "standin": None if standin_ms is None else standin_ms / 1e3}
