"""The attribution vocabulary has one home (omnitrace.categories): every category is
described and coloured there, and every user of categories reads it from there."""
from __future__ import annotations


import re

from omnitrace import categories
def test_every_category_has_a_description_and_its_own_colour() -> None:
    for c in categories.VOCABULARY:
        assert len(c.description) > 20, c
        assert re.fullmatch(r"#[0-9a-f]{6}", c.color), c
    colours = [c.color for c in categories.VOCABULARY]
    assert len(set(colours)) == len(colours)
    assert set(categories.DESCRIPTIONS) == set(categories.COLORS) == set(categories.CATEGORIES)
def test_the_rule_the_plots_and_flame_read_the_one_vocabulary() -> None:
    from omnitrace.profile import linked
    from omnitrace.render import html
    from omnitrace.rules import attribution, walk
    assert attribution.CATEGORIES is categories.CATEGORIES
    assert html.COLORS is categories.COLORS
    assert set(walk.CAT) == set(categories.CATEGORIES)
    assert set(linked.CATEGORIES) <= set(categories.CATEGORIES)
