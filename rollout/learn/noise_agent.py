"""The networks and updates of DSRL (Wagenmaker et al., 2025): an agent that picks a frozen flow policy's noise.

Two variants share the noise actor (a tanh-squashed Gaussian in ``[-magnitude, magnitude]`` per element) and the
replay batch layout:

- ``na`` (DSRL-NA, noise-aliased): a critic ``QA(s, a)`` on the *executed action chunk* learns by TD from the data;
  a noise critic ``QW(s, w)`` is distilled from it on the data's (noise, action) pairs, which the frozen policy
  made (``a = policy(s, w)``), so every noise that maps to the same chunk gets the same value; the actor climbs
  ``QW``. Nothing bootstraps through the noise. The target's next chunk ``a'`` is the one the data executed at
  ``s'`` (the actor's own noise when ``s'`` was visited), not a fresh ``policy(s', actor(s'))``: on this CPU one
  such call over a 256-row batch costs 0.56 s (MT10 policy) to 2.1 s (the shipped one), more than a whole update.
- ``sac`` (noise-space SAC): twin ``QW(s, w)`` trained by SAC's soft TD target through the actor's next noise.

Both use the published recipe's critic (LayerNorm MLPs, twin critics and a min backup, Polyak targets, an entropy
coefficient tuned towards a target entropy), scaled down in width and update ratio to a 2-core CPU
(:class:`AgentConfig` says by how much). Plain torch; the updates run on one intra-op thread by default.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

ALGORITHMS = ("na", "sac")
LOG_STD = (-5.0, 2.0)


@dataclass(frozen=True)
class AgentConfig:
    """DSRL's knobs. Published defaults (robomimic) in brackets; the defaults here are what a 2-core CPU runs."""

    algorithm: str = "na"
    """``na`` (DSRL-NA, the paper's recommended variant) or ``sac`` (noise-space SAC)."""
    hidden: int = 256
    """Units per hidden layer [2048]."""
    layers: int = 3
    """Hidden layers of every network [3]."""
    batch: int = 256
    """Replay buffer batch [256]."""
    lr: float = 3e-4
    """Adam learning rate of every network [3e-4]."""
    gamma: float = 0.99
    """Discount per chunk [0.99]."""
    tau: float = 0.005
    """Polyak rate of the target critics [0.005]."""
    target_entropy: float = 0.0
    """The entropy the tuned coefficient aims at, in nats over the whole noise [DSRL robomimic: 0 (``target_ent``);
    SAC (Haarnoja et al., 2018): -dim(noise)]."""
    init_alpha: float = 0.1
    """Initial entropy coefficient."""
    alpha_min: float = 0.01
    """Entropy guard: the tuned coefficient never falls below this [DSRL robomimic (``ent_coef -1``: tuned) and SAC:
    no floor, 0]. 0: off. Free, peg-insert-side's was 0.011-0.016 at 15 min while it improved, 0.0014 at 40 min when
    it had collapsed, the entropy with it."""
    magnitude: float = 1.5
    """The actor's noise lies in [-magnitude, magnitude] per element [1.5]."""
    n_step: int = 1
    """Chunks of reward the critic's TD target sums before it bootstraps (with gamma^n) [1]. Carries a late success
    back to the chunk that decided it without leaning on a critic that cannot yet rank that chunk."""
    noise_penalty: float = 0.0
    """Adds this x the mean squared noise element to the actor's loss: a pull towards the noise's mode, zero, where
    the policy was trained densest [not in DSRL; 0: off]."""

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm: expected one of {ALGORITHMS}, got {self.algorithm!r}")
        for name in ("hidden", "layers", "batch", "n_step"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        for name, lo, hi in (
            ("lr", 0, 1),
            ("gamma", 0, 1),
            ("tau", 0, 1),
            ("init_alpha", 0, 1e6),
            ("magnitude", 0, 4.0),
        ):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and lo < v <= hi):
                raise ValueError(f"{name}: expected a number in ({lo}, {hi}], got {v!r}")
        if not (
            isinstance(self.noise_penalty, (int, float))
            and not isinstance(self.noise_penalty, bool)
            and 0 <= self.noise_penalty < math.inf
        ):
            raise ValueError(f"noise_penalty: expected a finite number >= 0, got {self.noise_penalty!r}")
        if not (
            isinstance(self.alpha_min, (int, float))
            and not isinstance(self.alpha_min, bool)
            and 0 <= self.alpha_min <= self.init_alpha
        ):
            raise ValueError(
                f"alpha_min: expected a number in [0, init_alpha={self.init_alpha}], got {self.alpha_min!r}"
            )
        if not (isinstance(self.target_entropy, (int, float)) and math.isfinite(self.target_entropy)):
            raise ValueError(f"target_entropy: expected a finite number, got {self.target_entropy!r}")

    def to_json(self) -> dict:
        return asdict(self)


def mlp(inp: int, out: int, hidden: int, layers: int, zero_out: bool = False) -> nn.Sequential:
    """``layers`` x (Linear, LayerNorm, ReLU), then a Linear to ``out`` (``zero_out``: that one starts at zero)."""
    mods: list[nn.Module] = []
    for i in range(layers):
        mods += [nn.Linear(inp if i == 0 else hidden, hidden), nn.LayerNorm(hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden if layers else inp, out))
    if zero_out:
        nn.init.zeros_(mods[-1].weight)
        nn.init.zeros_(mods[-1].bias)
    return nn.Sequential(*mods)


class Twin(nn.Module):
    """Two Q networks on the same input; ``forward`` gives ``[2, B]``. Both start at 0 everywhere (a sparse reward's
    values lie in [0, 1]; a random start would take ~1/(1 - gamma) chunks of bootstrapping to wash out)."""

    def __init__(self, inp: int, hidden: int, layers: int):
        super().__init__()
        self.q = nn.ModuleList([mlp(inp, 1, hidden, layers, zero_out=True) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([q(x)[:, 0] for q in self.q])


class NoiseActor(nn.Module):
    """A tanh-squashed Gaussian over the flattened noise, scaled into ``[-magnitude, magnitude]``."""

    def __init__(self, obs_dim: int, noise_dim: int, hidden: int, layers: int, magnitude: float):
        super().__init__()
        self.net = mlp(obs_dim, 2 * noise_dim, hidden, layers)
        self.magnitude = float(magnitude)
        self.generator = torch.Generator().manual_seed(0)
        """Draws the exploration noise (:class:`NoiseAgent` seeds it from its own seed)."""
        with (
            torch.no_grad()
        ):  # start at the box's centre with unit spread: zero noise on average, the policy's own width
            self.net[-1].weight.mul_(0.01)
            self.net[-1].bias.zero_()

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised sample and its log-probability (with the tanh correction)."""
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        std = log_std.clamp(*LOG_STD).exp()
        u = mean + std * torch.randn(mean.shape, generator=self.generator)
        y = torch.tanh(u)
        logp = (-0.5 * ((u - mean) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
        logp = logp - (torch.log(self.magnitude * (1 - y.pow(2)) + 1e-6)).sum(-1)
        return self.magnitude * y, logp

    def mean(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic noise (the squashed mean)."""
        return self.magnitude * torch.tanh(self.net(obs).chunk(2, dim=-1)[0])


class NoiseAgent(nn.Module):
    """DSRL's actor and critics for an observation of ``obs_dim`` numbers, noise and executed chunk of the given sizes.

    ``update(batch)`` takes one replay batch (tensors ``obs``, ``noise``, ``action``, ``reward``, ``done``,
    ``next_obs``, ``next_action``, ``ready``) and does one gradient step of each network the variant trains
    (``critic_steps`` of the critic per actor step is the caller's loop: :meth:`critic_step` / :meth:`actor_step`).
    """

    def __init__(self, obs_dim: int, noise_dim: int, action_dim: int, cfg: AgentConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.obs_dim, self.noise_dim, self.action_dim = obs_dim, noise_dim, action_dim
        h, n = cfg.hidden, cfg.layers
        with torch.random.fork_rng(devices=[]):  # parameter init from the seed, the global generator left as it was
            torch.manual_seed(seed)
            self._build(obs_dim, noise_dim, action_dim, cfg, h, n)
        self.actor.generator.manual_seed(seed + 1)

    @classmethod
    def from_state(cls, state: dict, cfg: AgentConfig) -> NoiseAgent:
        """The agent a saved ``state_dict`` holds (its sizes read from its layers), for evaluation; ValueError when
        ``state`` is not one of ``cfg``'s shape (another algorithm, width or depth)."""
        actor = sorted(
            (k for k, v in state.items() if k.startswith("actor.net.") and k.endswith(".weight") and v.ndim == 2),
            key=lambda k: int(k.split(".")[2]),
        )
        if not actor:
            raise ValueError("the saved weights hold no actor (actor.net.*): not a NoiseAgent's")
        obs_dim, noise_dim = int(state[actor[0]].shape[1]), int(state[actor[-1]].shape[0]) // 2
        qa = state.get("qa.q.0.0.weight")  # DSRL-NA's action critic reads the executed chunk
        agent = cls(obs_dim, noise_dim, int(qa.shape[1]) - obs_dim if qa is not None else noise_dim, cfg)
        try:
            agent.load_state_dict(state)
        except RuntimeError as err:
            raise ValueError(
                f"the saved weights do not fit the agent their config describes ({str(err).splitlines()[0]})"
            ) from None
        return agent

    def _build(self, obs_dim: int, noise_dim: int, action_dim: int, cfg: AgentConfig, h: int, n: int) -> None:
        self.actor = NoiseActor(obs_dim, noise_dim, h, n, cfg.magnitude)
        if cfg.algorithm == "na":
            self.qa, self.qw = Twin(obs_dim + action_dim, h, n), mlp(obs_dim + noise_dim, 1, h, n, zero_out=True)
            self.qa_target = Twin(obs_dim + action_dim, h, n)
            self.qa_target.load_state_dict(self.qa.state_dict())
            critic_params = list(self.qa.parameters())
            self.qw_opt = torch.optim.Adam(self.qw.parameters(), lr=cfg.lr)
        else:
            self.qw = Twin(obs_dim + noise_dim, h, n)
            self.qw_target = Twin(obs_dim + noise_dim, h, n)
            self.qw_target.load_state_dict(self.qw.state_dict())
            critic_params = list(self.qw.parameters())
        for p in self.target().parameters():
            p.requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(cfg.init_alpha)))
        self.critic_opt = torch.optim.Adam(critic_params, lr=cfg.lr)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=cfg.lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.lr)

    def target(self) -> nn.Module:
        return self.qa_target if self.cfg.algorithm == "na" else self.qw_target

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    # ------------------------------------------------------------------ values
    def noise_value(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The noise critic's value ``[B]`` (NA: the distilled QW; SAC: the min over the twins)."""
        x = torch.cat([obs, noise], -1)
        return self.qw(x)[:, 0] if self.cfg.algorithm == "na" else self.qw(x).min(0).values

    def action_value(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """NA only: the action critic's value ``[B]`` (min over the twins)."""
        return self.qa(torch.cat([obs, action], -1)).min(0).values

    # ----------------------------------------------------------------- updates
    def critic_step(self, b: dict[str, torch.Tensor]) -> dict[str, float]:
        """One TD step of the critic that bootstraps (NA: QA on the data's next chunk; SAC: QW through the actor's noise)."""
        g = self.cfg.gamma
        with torch.no_grad():
            if self.cfg.algorithm == "na":
                nxt = self.qa_target(torch.cat([b["next_obs"], b["next_action"]], -1)).min(0).values
            else:
                w2, logp2 = self.actor(b["next_obs"])
                nxt = self.qw_target(torch.cat([b["next_obs"], w2], -1)).min(0).values - self.alpha * logp2
            if self.cfg.n_step > 1:  # the row's own discount: gamma^n, or gamma^m where the episode ended sooner
                g = b["discount"]
            y = b["reward"] + g * (1.0 - b["done"]) * nxt
        net = self.qa if self.cfg.algorithm == "na" else self.qw
        inp = torch.cat([b["obs"], b["action"] if self.cfg.algorithm == "na" else b["noise"]], -1)
        err = (net(inp) - y) ** 2 * b["ready"]
        loss = err.sum() / (2 * b["ready"].sum().clamp(min=1))
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_opt.step()
        with torch.no_grad():
            for p, t in zip(net.parameters(), self.target().parameters()):
                t.lerp_(p, self.cfg.tau)
        return {"critic_loss": float(loss.detach()), "target_mean": float(y.mean())}

    def rank_step(self, b: dict[str, torch.Tensor], temperature: float = 0.1) -> dict[str, float]:
        """NA only: one step ordering the action critic's values of chunks tried at one state by what they led to
        (branch data: ``hi_*`` returned more than ``lo_*``), a logistic loss on each twin's difference / ``temperature``."""
        hi = self.qa(torch.cat([b["hi_obs"], b["hi_action"]], -1))
        lo = self.qa(torch.cat([b["lo_obs"], b["lo_action"]], -1))
        loss = torch.nn.functional.softplus((lo - hi) / temperature).mean()
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_opt.step()
        return {"rank_loss": float(loss.detach()), "rank_agree": float(((hi - lo) > 0).float().mean())}

    def distill_step(self, b: dict[str, torch.Tensor]) -> dict[str, float]:
        """NA only: one step fitting QW(s, w) to QA(s, a) on the data's (noise, chunk) pairs."""
        with torch.no_grad():
            y = self.action_value(b["obs"], b["action"])
        loss = ((self.qw(torch.cat([b["obs"], b["noise"]], -1))[:, 0] - y) ** 2).mean()
        self.qw_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.qw_opt.step()
        return {"distill_loss": float(loss.detach())}

    def actor_step(self, b: dict[str, torch.Tensor]) -> dict[str, float]:
        """One step of the actor up the noise critic (with the entropy bonus), then of the entropy coefficient."""
        w, logp = self.actor(b["obs"])
        q = self.noise_value(b["obs"], w)
        loss = (self.alpha * logp - q).mean() + self.cfg.noise_penalty * w.pow(2).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.actor_opt.step()
        alpha_loss = -(self.log_alpha * (logp.detach() + self.cfg.target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()
        if self.cfg.alpha_min > 0:  # the entropy guard: the bonus never vanishes
            with torch.no_grad():
                self.log_alpha.clamp_(min=math.log(self.cfg.alpha_min))
        return {"actor_q": float(q.detach().mean()), "entropy": float(-logp.detach().mean()), "alpha": self.alpha}

    # ----------------------------------------------------------------- acting
    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        """Noise ``[B, noise_dim]`` (float32) for observations ``[B, obs_dim]``."""
        o = torch.as_tensor(obs, dtype=torch.float32)
        return (self.actor.mean(o) if deterministic else self.actor(o)[0]).numpy().astype(np.float32)


class ReplayBuffer:
    """A ring of transitions; ``next_action`` arrives one step after the rest (NA's target needs it), ``ready`` says so.
    ``discount`` is what the TD target multiplies the next value by (n-step rows only; see :attr:`AgentConfig.n_step`)."""

    FIELDS = ("obs", "noise", "action", "reward", "done", "next_obs", "next_action", "ready", "discount")

    def __init__(self, capacity: int, obs_dim: int, noise_dim: int, action_dim: int):
        self.capacity, self.size, self.head = int(capacity), 0, 0
        dims = {
            "obs": obs_dim,
            "next_obs": obs_dim,
            "noise": noise_dim,
            "action": action_dim,
            "next_action": action_dim,
        }
        self.data = {
            k: np.zeros((self.capacity, dims[k]) if k in dims else (self.capacity,), np.float32) for k in self.FIELDS
        }

    def add(self, **row) -> int:
        """Store one transition (``next_action`` and ``ready`` start empty unless given); returns its slot."""
        i = self.head
        for k in self.FIELDS:
            self.data[k][i] = row.get(k, 0.0)
        self.head = (self.head + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        return i

    def complete(self, i: int, next_action: np.ndarray) -> None:
        """Slot ``i``'s next chunk is known: it may now train the action critic."""
        self.data["next_action"][i] = next_action
        self.data["ready"][i] = 1.0

    def sample(self, rng: np.random.Generator, n: int) -> dict[str, torch.Tensor]:
        idx = rng.integers(0, self.size, n)
        return {k: torch.from_numpy(v[idx]) for k, v in self.data.items()}
