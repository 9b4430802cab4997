"""Kiosk mode (?kiosk=1) without a browser: the rotation's order through pages and their parts,
and each wall screen's layout (what it draws, what it says it leaves out, no widgets to pick).

The fit at 1920x1080 is measured in a real Chromium: tests/test_browser_kiosk.py.
"""

from __future__ import annotations

import pytest
import store_fixtures
from test_pages import _clear_streamlit_caches, assert_clean, open_app, texts  # noqa: F401 (autouse fixture)

from components import page as page_mod


def cycle(node_down: bool, has_gpu: bool) -> list[tuple[str, int]]:
    """The screens the wall shows from the Overview's first part until it comes back to it."""
    screens, here = [("overview", 1)], ("overview", 1)
    while (here := page_mod.next_kiosk_screen(*here, node_down, has_gpu)) != ("overview", 1):
        screens.append(here)
        assert len(screens) < 20, screens
    return screens


def test_the_rotation_pages_through_each_page_s_parts():
    assert cycle(False, True) == [("overview", 1), ("overview", 2), ("lengths", 1), ("lengths", 2), ("gpus", 1)]
    assert cycle(True, True)[-1] == ("nodes", 1)  # Nodes only while a node is down


def test_the_rotation_skips_gpus_when_no_node_has_a_gpu():
    assert ("gpus", 1) not in cycle(False, False)
    assert cycle(True, False) == [("overview", 1), ("overview", 2), ("lengths", 1), ("lengths", 2), ("nodes", 1)]
    assert page_mod.next_kiosk_page("lengths", False, has_gpu=False) == "overview"
    assert page_mod.next_kiosk_page("lengths", True, has_gpu=False) == "nodes"


def test_a_screen_outside_the_rotation_goes_on_from_a_known_one():
    assert page_mod.next_kiosk_screen("samples", 1, False, True) == ("overview", 1)
    assert page_mod.next_kiosk_screen("lengths", 7, False, True) == ("lengths", 1)  # ?part=7: no such part
    assert page_mod.next_kiosk_screen("gpus", 1, False, False) == ("overview", 1)  # opened by hand, no GPU


def run_kiosk(page: str, part: int, config, monkeypatch):
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(config))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = open_app(page)
    at.query_params.update({"kiosk": "1", "rotate": "0", "part": str(part)})
    at.run()
    assert_clean(at)
    return at


def left_out(at) -> str:
    return next(m.value for m in at.markdown if m.value.startswith('<div class="rh-kiosk-left-out"'))


@pytest.mark.parametrize(
    ("page", "part", "shown", "said"),
    [
        ("overview", 1, "Completions", "Part 1 of 2 · Next: throughput"),
        ("overview", 2, "tok/s (1 min)", "Part 2 of 2 · Alerts and tiles: part 1"),
        ("lengths", 1, "P90", "Part 1 of 2 · Next: the what-if"),
        ("lengths", 2, "What if max_tokens were raised to 8,192?", "Part 2 of 2 · The what-if&#x27;s model"),
        ("gpus", 1, "Series over the last 1 h", "The GPU table, memory, temperature"),
        ("nodes", 1, "node-1", "Each node&#x27;s details, shards, servers and config"),
    ],
)
def test_each_wall_screen_draws_its_part_and_says_what_it_leaves_out(page, part, shown, said, tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "ceiling_18")
    store.close()
    at = run_kiosk(page, part, config, monkeypatch)
    assert said in left_out(at)
    assert shown in texts(at) + " ".join(str(d.value) for d in at.dataframe)


def test_the_gpus_wall_screen_has_no_select_boxes_and_few_charts(tmp_path, monkeypatch):
    store, config = store_fixtures.make_store(tmp_path, "healthy")
    store.close()
    at = run_kiosk("gpus", 1, config, monkeypatch)
    assert not at.selectbox and not at.multiselect
    at = run_kiosk("lengths", 2, config, monkeypatch)
    assert not at.number_input  # the what-if at twice the ceiling
    assert [b.key for b in at.button] == ["lengths_refresh_button"]  # the hidden sidebar's only: no continuation batch
