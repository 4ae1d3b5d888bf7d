"""The settings each command reads, named in its --help (every command validates them all)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from orquestador.config import environment_sections

ALL_SETTINGS: tuple[str, ...] = tuple(
    name for names in environment_sections().values() for name in names
)
_ADAPTERS_AND_LOGS = (
    "ADAPTER_MODULES",
    "INTEGRATIONS_FILE",
    "MACHINE_COMMANDS",
    "LOG_LEVEL",
    "LOG_FORMAT",
)
MIGRATE_SETTINGS = (
    "MIGRATION_DATABASE_URL",
    "RUNTIME_DATABASE_ROLE",
    "PLATFORM_DATABASE_ROLE",
    "DATABASE_URL",
    "ORQUESTADOR_HOME",
    "LOG_LEVEL",
    "LOG_FORMAT",
)
WORKER_SETTINGS = (
    "DATABASE_URL",
    "WORKER_ENABLED",
    *environment_sections()["worker"],
    *environment_sections()["retries"],
    *environment_sections()["e-mail"],
    *environment_sections()["retention"],
    *environment_sections()["operations"],
    *environment_sections()["traces"],
    "MACHINE_COMMAND_RETENTION_DAYS",
    *_ADAPTERS_AND_LOGS,
)
API_SETTINGS = (
    "DATABASE_URL",
    "ORQUESTADOR_HOME",
    "REQUEST_API_ENABLED",
    "FLOW_ADMIN_ENABLED",
    *[name for name in environment_sections()["tokens"] if name != "JWT_PRIVATE_KEY_FILE"],
    *environment_sections()["api"],
    *environment_sections()["traces"],
    *_ADAPTERS_AND_LOGS,
)
TOKEN_SETTINGS = (
    "JWT_SECRET",
    "JWT_PRIVATE_KEY_FILE",
    "ORQUESTADOR_HOME",
    "JWT_ISSUER",
    "JWT_AUDIENCE",
    "ORQUESTADOR_API_URL",
)
AGENT_SETTINGS = (
    "ORQUESTADOR_API_URL",
    "ORQUESTADOR_TOKEN",
    "AGENT_COMMANDS_FILE",
    "LOG_LEVEL",
    "LOG_FORMAT",
)
HEALTH_SETTINGS = (
    "REQUEST_API_ENABLED",
    "FLOW_ADMIN_ENABLED",
    "API_HOST",
    "API_PORT",
    "WORKER_ENABLED",
    "DATABASE_URL",
)


def settings_epilog(names: Sequence[str]) -> str:
    """The epilog of a command's --help: the settings it reads, by section."""
    if not names:
        return "Reads no setting."
    known = {
        name: section for section, all_names in environment_sections().items() for name in all_names
    }
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"not settings: {unknown}")
    by_section: dict[str, list[str]] = {}
    for name in names:
        by_section.setdefault(known[name], []).append(name)
    lines = [
        textwrap.fill(
            ", ".join(section_names),
            width=79,
            initial_indent=f"  {section}: ",
            subsequent_indent=" " * (4 + len(section)),
            break_on_hyphens=False,
        )
        for section, section_names in by_section.items()
    ]
    return "settings read (environment variables; .env.example has defaults):\n" + "\n".join(lines)
