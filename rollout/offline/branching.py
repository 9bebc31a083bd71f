"""``rollcap.branch``'s work: a recorded episode's deployment rebuilt, its branches run and recorded.

:func:`branch_recorded` is what ``rollcap branch`` and ``rollcap.branch`` do
(:func:`rollcap.rollout.api.branch_episode` adds only the Ray pool for
``actors``, which lives above this layer): find the parent episode, rebuild
its deployment (:class:`RecordedDeployment`: the recording's env, its runners
at its batch through the one build, a host with its config), put it at the
boundary, run the control and the branches (:mod:`rollcap.rollout.offline.branch`),
record them as a new run and write ``branch.json``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from rollcap.kernels.files import cannot_create_dir, write_report
from rollcap.rollout.batch import recorded_batch, row_views
from rollcap.rollout.build import make_env, make_runners, named_env
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.offline.branch import boundaries, run_branches
from rollcap.rollout.offline.deployment import recorded_parts
from rollcap.rollout.recording import EpisodeRecorder, episodes_of
from rollcap.rollout.spec import Parts


def parent_episode(path: Path, episode: int | None):
    """``(source, record)`` of episode ``episode`` of the recording at ``path`` (None: its first)."""
    items = episodes_of(path)
    for source, rec in items:
        if isinstance(rec, Exception):
            if episode is None or f"demo_{episode}" in source or f"episode_{episode:05d}" in source:
                raise rec
            continue
        if episode is None or rec.index == episode:
            return source, rec
    have = sorted(r.index for _, r in items if not isinstance(r, Exception))
    raise ConfigError("episode", f"{path}: no episode {episode} (it holds {have})")


def branch_recorded(  # noqa: PLR0913 - the branch door's documented options
    file,
    episode: int | None = None,
    chunk: int = 0,
    n: int = 8,
    *,
    seed: int | None = None,
    control: bool = True,
    out=None,
    formats=("npz", "h5"),
    actors: int = 0,
    parts=None,
    address: str | None = None,
    env: str | None = None,
    pool_for=None,
):
    """Branch episode ``episode`` of the recording ``file`` at ``chunk``: the control and ``n`` seeded branches.

    What ``rollcap branch`` does, without argparse (``rollcap.branch``): every branch is recorded in
    ``out`` (default ``runs/branch-<episode>-<chunk>``, a new or empty directory) with ``branch.json``.
    ``parts``: a :class:`~rollcap.rollout.spec.Parts` naming the checkpoints
    (its env is replaced by the recording's), or a dict of some of its fields (None or absent: the
    recording's device, backend, precision, policy and critic; the default). ``actors``: run the branches on
    that many Ray actors, on a new local Ray or the cluster at ``address``
    (the boundary is computed here; recordings land in ``out`` on this machine).
    ``env``: the recording's env id as you name it (see :func:`~rollcap.rollout.build.named_env`):
    needed for an env a module registers, which is never imported because a file names it.
    ``pool_for(parts, host)``: with ``actors``, starts the Ray pool the branches run on (``rollcap.branch``
    gives it: :func:`rollcap.rollout.api.branch_episode`). Returns ``(BranchResult, summary dict)``.

    Raises:
        ConfigError: a bad count, chunk, episode, ``out`` or env (one line naming the field), before anything is written.
    """
    for name, value, low in (("n", n, 0), ("chunk", chunk, 0), ("actors", actors, 0)):
        if value < low:
            raise ConfigError(name, f"expected an integer >= {low}, got {value}")
    check_address(address, actors)
    if n == 0 and not control:
        raise ConfigError("n", "0 branches without the control runs nothing")
    if not formats or set(formats) - {"npz", "h5"}:
        raise ConfigError("formats", f"expected a comma list of npz,h5, got {','.join(formats)!r}")
    source, rec = parent_episode(Path(file), episode)
    if chunk >= rec.num_chunks:
        raise ConfigError("chunk", f"{chunk}: episode {rec.index} of {source} has chunks 0..{rec.num_chunks - 1}")
    out = Path(out) if out is not None else Path("runs") / f"branch-{rec.index}-{chunk}"
    check_new_dir(out)
    with RecordedDeployment(parts or {}, rec, source, actors, env, pool_for) as (host, pool):
        at = boundaries(rec, host.env, [chunk], parent=str(source))[chunk]
        result = run_branches(host, rec, chunk, n, control=control, parent=str(source), at=at, pool=pool, seed=seed)
    with EpisodeRecorder(out, formats) as recorder:  # nothing is written before every branch has run
        for record in result.records:
            recorder.write(record)
    summary = {
        "parent": str(source),
        "episode": rec.index,
        "chunk": chunk,
        "step": at.origin["step"],
        "out": str(out),
        **result.summary(),
    }
    write_report(out / "branch.json", summary)
    return result, summary


def check_new_dir(out: Path) -> None:
    """Branches are a new run of their own: ``out`` must be absent or an empty directory (there is nothing to resume)."""
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"{out} exists and is not a directory")
    if why := cannot_create_dir(out):
        raise ConfigError("out", why)
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(
            "out",
            f"{out}: directory is not empty; branches are recorded as a new run, which cannot resume another: choose another `out` or remove it",
        )


def check_address(address: str | None, actors: int) -> None:
    if (
        address is not None and not actors
    ):  # flag words in the Python API too: tests/rollout/ray/test_ray_cluster.py pins this message
        raise ValueError("--address: needs --actors N (the branches run in this process otherwise)")


class RecordedDeployment:
    """A recording's deployment rebuilt (through :func:`rollcap.rollout.build.runners`): its env, the runners at its
    batch, a host with its config and (with ``actors``) a pool from ``pool_for(parts, host)``; closed on exit.

    ``parts``: a :class:`~rollcap.rollout.spec.Parts`, or a dict of some of its fields (None or absent: the
    recording's, :func:`~rollcap.rollout.offline.deployment.recorded_parts`).
    """

    def __init__(self, parts, rec, file, actors: int = 0, env: str | None = None, pool_for=None):
        self.parts, self.rec, self.file, self.actors, self.env = parts, rec, str(file), actors, env
        self.pool_for = pool_for
        self.parts_list = []

    def __enter__(self):
        if isinstance(
            self.parts, dict
        ):  # fields given (None: not given): the rest as the recording (offline/deployment.py)
            given, said = recorded_parts(
                {k: v for k, v in self.parts.items() if k not in ("env_id", "env_kwargs")}, self.rec, self.file
            )
            for line in said:
                print(f"rollcap: branch: {line}", file=sys.stderr)
            self.parts = Parts(**given)
        self.parts = dataclasses.replace(self.parts, env_id=self.rec.env_id, env_kwargs=self.rec.env_kwargs or None)
        try:
            named = named_env(self.rec.env_id, self.env, self.file)
            env = make_env(self.rec.env_id, self.rec.env_kwargs, source=None if named else self.file)
            self.parts_list.append(env)
            policy, critic = self._runners(env)
            self.host = recorded_host(self.rec, env, policy, critic)
            pool = None
            if self.actors:  # the actors build their own parts from these names (and check them against the host)
                pool = self.pool_for(self.parts, self.host)
                self.parts_list.insert(0, pool)
        except BaseException:
            self.__exit__()
            raise
        return self.host, pool

    def _runners(self, env):
        """The recording's runners: for an episode of a batched run, one row of runners captured at its batch (so the
        control can be byte-exact, as replay does), else batch-1 runners."""
        batch = recorded_batch(self.rec.fingerprints)
        if batch == 1 or self.actors:  # branch actors build batch-1 runners: the control then says "not comparable"
            policy, critic = make_runners(self.parts, env, source=self.file)
            self.parts_list += [policy, critic]
            return policy, critic
        policy, critic = make_runners(self.parts, env, source=self.file, envs=batch)
        self.parts_list += [policy, critic]
        return row_views(policy, critic)

    def __exit__(self, *exc):
        for part in self.parts_list:
            if part is not None:
                part.close()
        self.parts_list = []


def recorded_host(rec, env, policy, critic):
    """A host with the recording's config (and its critic only when the recording had one)."""
    critic = critic if "critic" in rec.fingerprints else None
    return RolloutHost(env, policy, critic, HostConfig.from_json(rec.config))
