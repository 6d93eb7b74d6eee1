"""What CI tools read of a gate report: JUnit XML (test reporters) and GitHub workflow annotations."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from bless.core.untrusted_text import unicode_safe, xml_safe
from bless.flows.gate.check import GateReport

__all__ = ["github_annotations", "junit_xml"]


def junit_xml(report: GateReport) -> bytes:
    """A JUnit XML document: one testcase per profile, a ``<failure>`` for each unblessed one."""
    suites = ET.Element("testsuites", name="bless gate")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="bless gate",
        tests=str(len(report.rows)),
        failures=str(len(report.failed)),
        errors="0",
        skipped="0",
        time=f"{report.seconds:.3f}",
    )
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="manifests_dir", value=xml_safe(str(report.manifests_dir)))
    for row in report.rows:
        profile = xml_safe(row.profile)  # a file name may hold what XML cannot (controls, non-UTF-8 bytes)
        case = ET.SubElement(
            suite, "testcase", classname="bless.gate", name=profile, file=profile, time=f"{row.seconds:.3f}"
        )
        if not row.ok:
            failure = ET.SubElement(case, "failure", message=xml_safe(row.reason), type=row.error or "GateFailed")
            lines = [row.reason]
            if row.config_hash:
                lines.append(f"config hash: {row.config_hash}")
            lines += [f"drift: {change['field']}: {change['before']!r} -> {change['after']!r}" for change in row.drift]
            lines += [f"note: {note}" for note in row.notes]
            failure.text = "\n".join(map(xml_safe, lines))
        elif row.notes:
            ET.SubElement(case, "system-out").text = "\n".join(map(xml_safe, row.notes))
    ET.indent(suites)
    document: bytes = ET.tostring(suites, encoding="utf-8", xml_declaration=True)
    return document + b"\n"


def _escape_data(text: str) -> str:
    """GitHub workflow-command escaping of a message."""
    return unicode_safe(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """GitHub workflow-command escaping of a property value (``file=...``)."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(report: GateReport) -> list[str]:
    """``::error file=<profile>::<message>`` per failed profile, ``::warning`` for notes of passing ones."""
    lines: list[str] = []
    for row in report.rows:
        file = _escape_property(row.profile)
        if not row.ok:
            message = f"bless gate: {row.reason}"
            lines.append(f"::error file={file},title={_escape_property('not blessed')}::{_escape_data(message)}")
        for note in row.notes:
            lines.append(f"::warning file={file}::{_escape_data('bless gate: ' + note)}")
    return lines
