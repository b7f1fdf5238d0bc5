"""docs/protocol.md against supervisor.errors: the code table and the
child's stages, both ways (a code or stage the doc lacks, or one it names
that the supervisor never sends)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from supervisor.errors import Code, Refused
from supervisor.zygote.child import STAGES

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()


def test_code_table_matches_the_enum():
    table = DOC[DOC.index("| code | meaning |"):]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    documented = [code for row in rows for code in re.findall(r"`([a-z_]+)`", row.split("|")[1])]
    assert sorted(documented) == sorted(c.value for c in Code)


def test_stage_list_matches_the_tuple():
    start = DOC.index("The stages, in the child's order")
    paragraph = DOC[start:DOC.index("\n\n", start)]
    without_asides = re.sub(r"\([^)]*\)", "", paragraph)
    assert tuple(re.findall(r"`([a-z_]+)`", without_asides)) == STAGES


def test_a_code_is_its_wire_string():
    assert json.dumps({"code": Code.BAD_SPEC}) == '{"code": "bad_spec"}'
    assert f"{Code.BAD_SPEC}" == "bad_spec" and Code("bad_spec") is Code.BAD_SPEC
    assert all(c.meaning for c in Code)
    e = Refused(Code.TOO_LARGE, "args: too many or too long")
    assert e.code == "too_large" and str(e) == "args: too many or too long"
