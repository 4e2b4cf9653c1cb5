"""The tiers (tests/conftest.py): every test is in exactly one, so that `scripts/test --fast` (the unit tier) and
the full run together miss nothing."""

from __future__ import annotations

from pathlib import Path

from conftest import ALL_ITEMS, FILE_TIERS, TESTS, TIERS


def test_every_collected_test_has_exactly_one_tier(request):
    items = request.config.stash[ALL_ITEMS]  # every test collected, also those -m or -k deselected
    assert items
    wrong = {item.nodeid: names for item in items
             if len(names := [m.name for m in item.iter_markers() if m.name in TIERS]) != 1}
    assert not wrong, f"tests without exactly one tier: {wrong}"


def test_every_test_file_has_a_tier():
    assert set(FILE_TIERS) == {p.name for p in TESTS.glob("test_*.py")}
    assert set(FILE_TIERS.values()) <= set(TIERS)
