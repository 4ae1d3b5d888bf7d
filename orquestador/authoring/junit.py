"""JUnit XML of a `flows test` run, the report CI systems read: one testcase per case."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from xml.etree import ElementTree

from orquestador.authoring.cases import Played


def write_junit(path: Path, suite: str, played: Sequence[Played]) -> None:
    failed = [run for run in played if not run.passed]
    seconds = sum(run.seconds for run in played)
    root = ElementTree.Element(
        "testsuite",
        name=suite,
        tests=str(len(played)),
        failures=str(len(failed)),
        errors="0",
        skipped="0",
        time=f"{seconds:.3f}",
    )
    for run in played:
        case = ElementTree.SubElement(
            root, "testcase", classname=suite, name=run.case.name, time=f"{run.seconds:.3f}"
        )
        if not run.passed:
            failure = ElementTree.SubElement(case, "failure", message="; ".join(run.reasons))
            failure.text = run.ended.said() if run.ended is not None else run.problem
    ElementTree.indent(root)
    ElementTree.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
