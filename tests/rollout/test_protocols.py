"""The events and the predicates' view keep their dataclass contract with written-out constructors."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import numpy as np
import pytest

from rollcap.rollout.predicates import BoundaryView
from rollcap.rollout.protocols import ChunkEvent


@pytest.mark.parametrize("cls", [ChunkEvent, BoundaryView])
def test_written_out_init_takes_the_fields_in_order_with_their_defaults(cls):
    """The hand-written ``__init__`` (issue 57: cheaper than a frozen dataclass's) is the one the fields would generate:
    a field added to the class and not to it fails here."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]


def test_events_stay_frozen_equal_and_picklable():
    actions = np.zeros((2, 1), np.float32)
    event = ChunkEvent(1, 2, 3, {"state": actions}, actions, actions, 0.5, 0.1, 0.2, 0.3, None)
    assert event.carried is None and event.flow is None and event.latency_boundary_s == 0.3
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.chunk = 5
    view = BoundaryView(4, 5, actions, -0.5, 1.5)
    assert (view.chunk, view.step, view.actions, view.value, view.elapsed_s) == (4, 5, actions, -0.5, 1.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.value = 0.0
    plain = BoundaryView(4, 5, None, -0.5, 1.5)  # (an array field compares elementwise)
    assert pickle.loads(pickle.dumps(plain)) == plain and hash(plain) == hash(BoundaryView(4, 5, None, -0.5, 1.5))
    again = pickle.loads(pickle.dumps(event))
    assert dataclasses.replace(event, chunk=9).chunk == 9 and again.chunk == 2 and again.value == 0.5
