"""The pinned JVM manifest (infra/jvm/pom.xml) agrees with the Python pins and says where its jars go."""

from __future__ import annotations

import re
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POM = "{http://maven.apache.org/POM/4.0.0}"


def _pom(path: Path) -> ET.Element:
    return ET.parse(path).getroot()


def _properties() -> dict[str, str]:
    props = _pom(REPO / "infra/jvm/pom.xml").find(f"{POM}properties")
    assert props is not None
    return {child.tag.removeprefix(POM): (child.text or "") for child in props}


def _pinned(package: str) -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = [*project["dependencies"], *(d for group in project["optional-dependencies"].values() for d in group)]
    (version,) = [p.split("==", 1)[1] for p in pins if p.split("==", 1)[0] == package]
    return version


def test_spark_connector_matches_the_pinned_pyspark():
    # Spark's Kafka connector is built against one Spark version; PySpark's jars must be that version
    assert _properties()["spark.version"] == _pinned("pyspark")


def test_every_module_is_listed_and_pins_plain_versions():
    root = _pom(REPO / "infra/jvm/pom.xml")
    modules = [m.text for m in root.iter(f"{POM}module")]
    on_disk = sorted(p.parent.name for p in (REPO / "infra/jvm").glob("*/pom.xml"))
    assert sorted(modules) == on_disk
    for name in modules:
        for dep in _pom(REPO / "infra/jvm" / name / "pom.xml").iter(f"{POM}dependency"):
            version = dep.findtext(f"{POM}version") or ""
            # a property or an exact release: no ranges, no SNAPSHOTs, nothing left to Maven to pick
            assert re.fullmatch(r"\$\{[a-z0-9.]+\}|\d+(\.\d+)+", version), (name, version)
    for key, value in _properties().items():
        if key.endswith(".version"):
            assert re.fullmatch(r"\d+(\.\d+)+", value), (key, value)
