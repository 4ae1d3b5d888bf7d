"""ORG_QUOTAS: per-organization overrides of the quota settings, every bad entry one line."""

from __future__ import annotations

import pytest

from orquestador.config import Settings
from orquestador.domain.quotas import parse_org_quotas
from orquestador.errors import ConfigError


def test_an_organization_named_gets_its_overrides_and_the_rest_the_settings() -> None:
    settings = Settings.from_env(
        {
            "QUOTA_SCHEDULES": "100",
            "ORG_QUOTAS": '{"acme": {"schedules": 500, "scheduleMinSeconds": 10}}',
        }
    )
    acme, other = settings.quotas_for("acme"), settings.quotas_for("globex")

    assert (acme.schedules, acme.schedule_min_seconds) == (500, 10)
    assert (other.schedules, other.schedule_min_seconds) == (100, 60)
    assert acme.transitions_per_second == other.transitions_per_second == 50
    assert acme.as_json()["transitionsBurst"] == 200


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("{", "not JSON"),
        ("[1]", "a JSON object of organizations"),
        ('{"acme": 5}', "an object of quotas"),
        ('{"acme": {"schedule": 5}}', "unknown quota 'schedule'"),
        ('{"acme": {"schedules": -1}}', "schedules must be a whole number, 0 or more"),
        ('{"acme": {"schedules": 2.5}}', "schedules must be a whole number, 0 or more"),
        ('{"acme": {"schedules": true}}', "schedules must be a whole number, 0 or more"),
    ],
)
def test_a_bad_org_quotas_is_one_line_naming_what_is_wrong(raw: str, said: str) -> None:
    _, problems = parse_org_quotas(raw)
    assert len(problems) == 1 and said in problems[0]
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"ORG_QUOTAS": raw})
    assert f"ORG_QUOTAS: {problems[0]}" in refused.value.problems


def test_open_executions_and_rollout_items_are_settings_and_overrides() -> None:
    settings = Settings.from_env(
        {
            "QUOTA_OPEN_EXECUTIONS": "1000",
            "ORG_QUOTAS": '{"acme": {"openExecutions": 5, "rolloutItems": 7}}',
        }
    )
    acme, other = settings.quotas_for("acme"), settings.quotas_for("globex")

    assert (acme.open_executions, acme.rollout_items) == (5, 7)
    assert (other.open_executions, other.rollout_items) == (1000, 10_000)
    assert acme.as_json()["openExecutions"] == 5
