"""`Sampling.fields`: what reaches the upstream body, exactly the parameters that are set."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from domain.sampling import Sampling

_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "min_p": st.floats(0, 1),
    "repetition_penalty": st.floats(0.5, 2),
    "seed": st.integers(0, 2**31),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "logit_bias": st.dictionaries(st.sampled_from(["1", "7"]), st.floats(-100, 100)),
    "response_format": st.just({"type": "json_object"}),
    "structured_outputs": st.just({"regex": "a+"}),
    "guided_json": st.one_of(st.just({"type": "object"}), st.just("{}")),
    "guided_choice": st.lists(st.sampled_from(["x", "y"]), min_size=1),
    "guided_regex": st.just("[0-9]+"),
}


def test_the_parameters_are_the_structs_fields() -> None:
    assert set(_VALUES) == set(Sampling.__struct_fields__)


def test_none_set_gives_nothing() -> None:
    assert Sampling().fields() == []


@given(st.fixed_dictionaries({}, optional=_VALUES))
def test_every_set_parameter_and_only_those_in_field_order(values: dict[str, Any]) -> None:
    fields = Sampling(**values).fields()
    assert fields == [(name, values[name]) for name in Sampling.__struct_fields__ if name in values]
