"""The state protocol: how a component hands its live state to a capsule.

Implemented by the policy and critic runners, by envs with exact simulator
state, and by the rollout host's own bookkeeping (RNG state, counters).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, Union, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch

StateValue = Union["torch.Tensor", np.ndarray]
"""A buffer's value: a torch tensor, or a numpy array (an env's exact state, RNG state: no torch needed)."""


@runtime_checkable
class Stateful(Protocol):
    """A component whose live state a capsule can snapshot and restore.

    ``live_state()`` is called at snapshot time; it returns the *live* values
    (views of the component's buffers are fine: the capsule copies them).
    ``load_live_state()`` is called at restore time, after the capsule has
    validated names, shapes, dtypes and fingerprint; it must copy the values
    back *into the same buffers* (never rebind them, so captured graphs keep
    their addresses) and validate before the first copy, leaving the
    component untouched if it refuses. The values it receives belong to the
    capsule and may be shared with its forks: copy from them, never keep or
    write them (numpy ones arrive read-only). ``state_fingerprint()`` names what
    bit-exactness of this state depends on; restore refuses a capsule whose
    fingerprint differs.
    """

    def live_state(self) -> dict[str, StateValue]: ...

    def load_live_state(self, state: Mapping[str, StateValue]) -> None: ...

    def state_fingerprint(self) -> dict: ...
