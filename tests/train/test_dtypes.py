"""A model is one dtype: cast_to_model_dtype moves every floating parameter, and only those."""

from __future__ import annotations

import pytest
import torch

from hpcrl.train.dtypes import DTYPES, cast_to_model_dtype


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_every_floating_parameter_takes_the_model_dtype(name: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.RMSNorm(4))
    model[1].weight.data = model[1].weight.data.to(torch.float64)  # a norm built without the dtype
    model.register_parameter("steps", torch.nn.Parameter(torch.arange(3), requires_grad=False))
    values = [p.detach().clone() for p in model.parameters()]

    cast_to_model_dtype(model, DTYPES[name])

    floating = [p for p in model.parameters() if p.is_floating_point()]
    assert {p.dtype for p in floating} == {DTYPES[name]}
    assert model.steps.dtype == torch.int64, "integer parameters keep their dtype"
    for before, after in zip(values, model.parameters(), strict=True):
        assert torch.allclose(after.to(torch.float64), before.to(torch.float64), atol=1e-2, rtol=1e-2)


def test_parameters_stay_the_same_objects() -> None:
    """The optimizer and the reshard hold the parameter objects; the cast must not replace them."""
    model = torch.nn.Linear(2, 2)
    identities = [id(p) for p in model.parameters()]
    cast_to_model_dtype(model, torch.bfloat16)
    assert [id(p) for p in model.parameters()] == identities
