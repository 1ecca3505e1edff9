"""controllers/base.py: the view a policy decides on."""

import dataclasses
import inspect

import pytest

from controllers.base import GatewayView


def test_the_view_takes_exactly_its_fields_in_order_and_is_frozen():
    params = list(inspect.signature(GatewayView.__init__).parameters)[1:]
    assert params == [f.name for f in dataclasses.fields(GatewayView)]
    view = GatewayView(12.5, 3, 90_000, 400_000, 1, 2)
    assert (view.now_s, view.num_active, view.demand_tokens, view.pool_tokens, view.num_parked,
            view.num_waiting_new) == (12.5, 3, 90_000, 400_000, 1, 2)
    assert view == GatewayView(12.5, 3, 90_000, 400_000, 1, 2) and view != GatewayView(12.5, 3, 90_000, 400_000, 1, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):  # a policy cannot change what the gateway sees
        view.num_active = 0
    assert dataclasses.replace(view, num_parked=0).num_parked == 0
