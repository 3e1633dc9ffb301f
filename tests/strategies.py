"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st


def json_values(*keys: str) -> st.SearchStrategy[object]:
    """Any JSON value, NaN and Infinity included (as Python's json writes them), whose
    objects often have ``keys`` among their keys."""
    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.sampled_from(keys) | st.text(), inner, max_size=4)
        ),
        max_leaves=20,
    )
