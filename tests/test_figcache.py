"""Built figures reused across reruns (components/figcache.py): the same figure while the data
and choices are the same, a new one as soon as either changes."""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go
import pytest
import streamlit as st

from components import figcache, figures

BUILDS: list[tuple] = []


def counted(df: pd.DataFrame, title: str, scale: tuple[float, float] | None = None) -> go.Figure:
    BUILDS.append((len(df), title, scale))
    return go.Figure(go.Scatter(x=df["t"], y=df["v"]), layout=dict(title=dict(text=title)))


@pytest.fixture(autouse=True)
def fresh_cache():
    st.cache_resource.clear()
    BUILDS.clear()
    yield
    st.cache_resource.clear()


def frame(values) -> pd.DataFrame:
    return pd.DataFrame({"t": range(len(values)), "v": values})


def test_same_content_reuses_the_built_figure():
    first = figcache.figure(counted, frame([1.0, 2.0]), "Power", scale=(0, 100))
    again = figcache.figure(counted, frame([1.0, 2.0]), "Power", scale=(0, 100))  # a new, equal frame
    assert again is first
    assert len(BUILDS) == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda: ((frame([1.0, 2.5]), "Power"), {}),  # one new value (a new payload)
        lambda: ((frame([1.0, 2.0, 3.0]), "Power"), {}),  # one more row
        lambda: ((frame([1.0, 2.0]).rename(columns={"v": "w"}).assign(v=[1.0, 2.0]), "Power"), {}),
        lambda: ((frame([1.0, 2.0]), "Memory"), {}),  # another chart
        lambda: ((frame([1.0, 2.0]), "Power"), {"scale": (0, 700)}),  # another widget choice
        lambda: ((frame([1.0, 2.0]).set_axis([5, 6]), "Power"), {}),  # same values, other index
    ],
)
def test_any_change_of_data_or_choice_builds_again(change):
    figcache.figure(counted, frame([1.0, 2.0]), "Power")
    args, kwargs = change()
    fig = figcache.figure(counted, *args, **kwargs)
    assert len(BUILDS) == 2
    assert list(fig.data[0].y) == list(args[0]["v"])
    assert fig.layout.title.text == args[1]


def test_a_frame_pandas_cannot_hash_is_built_every_time():
    df = frame([1.0, 2.0]).assign(procs=[[1], [2]])  # lists in cells
    figcache.figure(counted, df, "Power")
    figcache.figure(counted, df, "Power")
    assert len(BUILDS) == 2


def test_a_large_frame_is_keyed_by_every_row():
    # Streamlit's own hashing samples frames past 50,000 rows: one changed row must still count.
    big = frame([float(i) for i in range(60_000)])
    figcache.figure(counted, big, "Power")
    changed = big.copy()
    changed.loc[31_337, "v"] = -1.0
    assert figcache.content_key(changed) != figcache.content_key(big)
    figcache.figure(counted, changed, "Power")
    assert len(BUILDS) == 2


def test_the_real_builders_give_the_same_figure_cached_or_not():
    bands = pd.DataFrame(
        {
            "node": ["a", "a", "b", "b"],
            "t_unix": [0.0, 60.0, 0.0, 60.0],
            "median": [50.0, 60.0, 40.0, 45.0],
            "min": [40.0, 50.0, 30.0, 35.0],
            "max": [60.0, 70.0, 50.0, 55.0],
            "gpus": [8, 8, 8, 8],
        }
    )
    args = (bands, "Power", "W", 700.0, (0, 700.0))
    cached = figcache.figure(figures.make_gpu_band_figure, *args, show_legend=True)
    assert json.loads(cached.to_json()) == json.loads(figures.make_gpu_band_figure(*args, show_legend=True).to_json())


def test_the_cached_figure_gives_streamlit_the_same_dict_each_run():
    fig = figcache.figure(counted, frame([1.0, 2.0]), "Power")
    assert isinstance(fig, figcache.FrozenFigure)
    first = fig.to_dict()
    assert fig.to_dict() is first  # made once, not copied again on the next rerun
    assert json.loads(fig.to_json()) == json.loads(counted(frame([1.0, 2.0]), "Power").to_json())


def test_a_keyed_frame_is_hashed_once_and_built_as_the_frame_itself(monkeypatch):
    """figcache.keyed: the GPUs page's five series charts share one frame, hashed once (#42)."""
    df = frame([1.0, 2.0, 3.0])
    hashed = []
    real = pd.util.hash_pandas_object
    monkeypatch.setattr(pd.util, "hash_pandas_object", lambda *a, **k: hashed.append(1) or real(*a, **k))
    one = figcache.keyed(df)
    first = figcache.figure(counted, one, "Power")
    assert figcache.figure(counted, one, "Power") is first and len(BUILDS) == 1  # reused
    figcache.figure(counted, one, "Temperature")  # another chart of the same frame: built, not hashed again
    assert len(hashed) == 1 and len(BUILDS) == 2
    assert figcache.figure(counted, df, "Power") is first  # the same key as the frame itself
    assert [b[0] for b in BUILDS] == [3, 3]  # the builder got the frame (len() of the wrapper raises)
    lists = figcache.keyed(frame([1.0, 2.0]).assign(procs=[[1], [2]]))  # pandas cannot hash it: built each time
    figcache.figure(counted, lists, "Power")
    figcache.figure(counted, lists, "Power")
    assert len(BUILDS) == 4
