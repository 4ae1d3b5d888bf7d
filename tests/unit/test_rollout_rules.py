"""A rollout's rules in pure code: limits as numbers, each child's data, where it stands."""

from __future__ import annotations

import pytest

from orquestador.domain.rollouts import ItemProblem, RolloutCounts, child_data, limit_of, machine_of


@pytest.mark.parametrize(
    ("value", "total", "minimum", "expected"),
    [
        (5, 100, 1, 5),
        ("10%", 5, 1, 1),  # a batch rounds up: never 0
        ("10%", 1000, 1, 100),
        ("10%", 15, 0, 1),  # a budget rounds down
        ("0%", 15, 0, 0),
        ("100%", 7, 0, 7),
    ],
)
def test_a_limit_is_a_number_or_a_share_of_all_items(
    value: int | str, total: int, minimum: int, expected: int
) -> None:
    assert limit_of(value, total, minimum=minimum) == expected


def test_an_item_names_its_machine_itself_or_in_machine_id() -> None:
    assert machine_of("m-1") == "m-1"
    assert machine_of({"machineId": "m-2", "zone": "a"}) == "m-2"
    assert machine_of({"name": "m-3"}) is None


def test_the_child_s_data_takes_whole_values_and_text_from_the_item() -> None:
    item = {"machineId": "m-1", "tags": ["a"], "port": 22}
    template = {
        "machineId": "{/item/machineId}",
        "all": "{/item}",
        "tags": "{/item/tags}",
        "note": "patch {/item/machineId} on port {/item/port}",
        "fixed": 3,
    }
    assert child_data(template, item) == {
        "machineId": "m-1",
        "all": item,
        "tags": ["a"],
        "note": "patch m-1 on port 22",
        "fixed": 3,
    }
    with pytest.raises(ItemProblem, match="nothing at /item/zone"):
        child_data({"zone": "{/item/zone}"}, item)
    with pytest.raises(ItemProblem, match="not text"):
        child_data({"note": "tags {/item/tags}"}, item)


def test_the_budget_is_spent_once_failures_exceed_it_and_the_rest_are_skipped() -> None:
    held = RolloutCounts(
        total=10, started=6, running=2, succeeded=3, failed=1, cancelled=0, max_failures=1
    )
    assert not held.budget_spent and held.skipped == 0 and not held.settled
    spent = RolloutCounts(
        total=10, started=6, running=1, succeeded=3, failed=2, cancelled=0, max_failures=1
    )
    assert spent.budget_spent and spent.skipped == 4 and not spent.settled
    done = RolloutCounts(
        total=10, started=6, running=0, succeeded=4, failed=2, cancelled=0, max_failures=1
    )
    assert done.settled and done.as_json()["skipped"] == 4
