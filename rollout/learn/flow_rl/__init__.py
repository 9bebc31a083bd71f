"""Flow-policy RL: PPO and GRPO that fine-tune the FlowVLA itself, on rollcap's batched envs.

The rollout side gives the loop what it needs exactly, and never imports it:

- the Flow-SDE sampler (``sampler="sde"``, :mod:`rollcap.policies.flow_sde`): each chunk with its exact per-step
  log-probabilities and denoising trace, all its randomness drawn on the host and recorded;
- groups from one capsule (:mod:`rollcap.rollout.groups`): G episodes that start from one exact state and differ
  only in their noise, and continuations from one chunk boundary, as one batch on the batched graph;
- new weights into the captured graph in place (:meth:`~rollcap.kernels.runner.GraphRunner.load_weights`): no
  recapture; every episode names the weights digest it ran with.

This package is the learner: :class:`TrainConfig` and :func:`train` (:mod:`.loop`), the update (:mod:`.learner`),
advantages (:mod:`.advantages`), the held-out comparison (:mod:`.evaluate`), what a run keeps on disk
(:mod:`.store`). ``examples/flow_rl.py`` is its door.
"""

from rollcap.rollout.learn.flow_rl.config import TrainConfig
from rollcap.rollout.learn.flow_rl.evaluate import compare, play
from rollcap.rollout.learn.flow_rl.loop import Interrupted, train
from rollcap.rollout.learn.flow_rl.store import find_weights

__all__ = ["Interrupted", "TrainConfig", "compare", "find_weights", "play", "train"]
