"""Hostile inputs: JSON of every shape, text with lone surrogates, huge integers, deep nesting."""

import json

from hypothesis import strategies as st

# Every code point, lone surrogates included (text a JSON \u escape can carry).
any_char = st.characters(codec=None, exclude_categories=())
hostile_text = st.text(alphabet=any_char, max_size=40)
printable_text = st.text(
    alphabet=st.characters(exclude_categories=("Cs",)), max_size=60
)  # what a form or a file name can carry

numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 50, 51, 2**31, 2**63, -(2**63), 1e308, -0.0, 5e-324]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, hostile_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)
    ),
    max_leaves=12,
)


def dumps(value) -> str:
    """JSON text as a careless client writes it: NaN and Infinity included."""
    return json.dumps(value)


# Whole bodies, some not JSON at all.
deep_json = st.integers(min_value=1, max_value=6000).map(lambda n: "[" * n + "]" * n)
long_integer = st.integers(min_value=21, max_value=6000).map(lambda n: "9" * n)
raw_bodies = st.one_of(
    json_values.map(dumps),
    deep_json,
    long_integer,
    long_integer.map(lambda digits: '{"generations": ' + digits + "}"),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.sampled_from(["", "{", "}", "[", "null", "NaN", '"\\udcff"', '{"a":1,"a":2}', "\ufeff{}"]),
)
