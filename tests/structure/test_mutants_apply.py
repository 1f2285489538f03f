"""`make mutate`'s mutants still name lines of the code: one that no longer applies stops the
whole run before any mutant is tried (it did, after `_start_read` changed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.mutation.mutants import MUTANTS, Mutant, apply

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_applies_to_the_code_and_changes_one_line(mutant: Mutant) -> None:
    text = (ROOT / mutant.path).read_text()
    mutated = apply(text, mutant)
    changed = [(a, b) for a, b in zip(text.split("\n"), mutated.split("\n"), strict=True) if a != b]
    assert len(changed) == 1 and changed[0][1].strip() == mutant.new, changed


def test_mutant_names_are_unique() -> None:
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
