"""The results contract: the columns the recorder writes are the documented ones.

tests/factories.py writes its own copy of the schemas from docs/results-format.md, so that the
analysis tests read files shaped as documented; this keeps that copy, the recorder and the doc in step.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loadgen.core.recording import OPTIONAL_TABLES, TABLES
from tests.factories import DOC_SAMPLES_SCHEMA, DOC_SESSIONS_SCHEMA, DOC_TURNS_SCHEMA

DOC = Path(__file__).resolve().parents[1] / "docs" / "results-format.md"


def documented_columns(table: str) -> set[str]:
    """The first cells of the column table in the `## <table>.parquet` section of docs/results-format.md."""
    text = DOC.read_text()
    start = text.index(f"## {table}.parquet\n")
    end = text.find("\n## ", start + 1)
    cells = re.findall(r"^\| *([a-z_0-9, `]+?) *\|", text[start:end if end != -1 else None], flags=re.M)
    return {name.strip(" `") for cell in cells for name in cell.split(",")}  # "a, b | ..." names both


@pytest.mark.parametrize("table, documented", [("turns", DOC_TURNS_SCHEMA), ("samples", DOC_SAMPLES_SCHEMA),
                                               ("sessions", DOC_SESSIONS_SCHEMA)])
def test_the_recorder_writes_the_documented_schema(table, documented):
    assert TABLES[table] == documented


@pytest.mark.parametrize("table", [*TABLES, *OPTIONAL_TABLES])
def test_every_column_is_described_in_the_results_format_doc(table):
    schema = {**TABLES, **OPTIONAL_TABLES}[table]
    assert set(schema.names) - documented_columns(table) == set()


def test_the_tree_columns_are_described_in_the_results_format_doc():
    from loadgen.core.recording import TREE_FIELDS, TREE_ROOT_FIELDS, TREE_TURN_FIELDS

    text = DOC.read_text()
    section = text[text.index("## Session trees\n"):]
    for name, _ in TREE_FIELDS + TREE_ROOT_FIELDS + TREE_TURN_FIELDS:
        assert f"| {name} |" in section, name
