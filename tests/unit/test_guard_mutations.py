"""The guard-mutation list still fits the code: every find-text occurs exactly once, every
replacement changes it, and every test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.mutations.guards import CONTROLS, MUTATIONS, Mutation

REPO = Path(__file__).resolve().parents[2]
EVERY = [*CONTROLS, *MUTATIONS]


def test_ids_are_unique_and_stable_looking():
    ids = [m.id for m in EVERY]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", i) for i in ids), ids


@pytest.mark.parametrize("mutation", EVERY, ids=lambda m: m.id)
def test_the_mutation_still_applies(mutation: Mutation):
    text = (REPO / mutation.file).read_text()
    assert text.count(mutation.find) == 1, (
        f"{mutation.id}: the find-text occurs {text.count(mutation.find)} times in "
        f"{mutation.file}; update tests/mutations/guards.py to the code as it is now"
    )
    assert mutation.replace != mutation.find
    assert mutation.promise.strip() and mutation.expect in ("KILLED", "SURVIVED")


@pytest.mark.parametrize("mutation", EVERY, ids=lambda m: m.id)
def test_the_tests_it_names_exist(mutation: Mutation):
    assert mutation.tests or mutation.expect == "SURVIVED", "a guard needs tests that catch it"
    for node in mutation.tests:
        path, _, name = node.partition("::")
        source = REPO / path
        assert source.is_file(), f"{mutation.id}: {path} does not exist"
        if name:
            function = name.split("[")[0]
            assert re.search(rf"^def {re.escape(function)}\(", source.read_text(), re.M), (
                f"{mutation.id}: {path} has no test {function}"
            )
