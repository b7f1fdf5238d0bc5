"""What a supervisor keeps of the manifests it parsed (<state root>/parsed):
used for the very same text only, written by its own uid only, and what
spares a private supervisor PyYAML's import."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
from svhelpers import PYTHON, REPO

from supervisor.manifests import file as manifest_file, state
from supervisor.manifests.file import ManifestError

TEXT = "command: /bin/true\nargs: [a, b]\nuser: nobody\nsandbox: {profiles: [system]}\n"


@pytest.fixture
def kept(tmp_path):
    directory = state.parsed_directory(str(tmp_path / "root"), print)
    assert directory is not None
    source = tmp_path / "m.yaml"
    source.write_text(TEXT)
    return source, directory


def _entry(directory: str) -> str:
    [name] = os.listdir(directory)
    return os.path.join(directory, name)


@pytest.mark.timeout(10)
def test_kept_and_used_for_that_text_alone(kept):
    source, directory = kept
    document = manifest_file.read(str(source), directory)
    assert document == {"command": "/bin/true", "args": ["a", "b"], "user": "nobody", "sandbox": {"profiles": ["system"]}}
    entry = _entry(directory)
    assert os.stat(entry).st_mode & 0o777 == 0o600
    # What read() returns is the entry's (changed here to tell them apart)...
    data = json.loads(open(entry).read())
    data["document"]["args"] = ["from", "the", "entry"]
    open(entry, "w").write(json.dumps(data))
    assert manifest_file.read(str(source), directory)["args"] == ["from", "the", "entry"]
    # ...while the file's text is the one it holds: one byte more, parsed anew.
    source.write_text(TEXT.replace("[a, b]", "[a, c]"))
    assert manifest_file.read(str(source), directory)["args"] == ["a", "c"]
    assert json.loads(open(_entry(directory)).read())["document"]["args"] == ["a", "c"]


@pytest.mark.timeout(10)
def test_another_parser_parses_anew(kept, monkeypatch):
    """An entry of another manifests/document or PyYAML (a refusal added since, say) is not used."""
    source, directory = kept
    manifest_file.read(str(source), directory)
    entry = _entry(directory)
    data = json.loads(open(entry).read())
    assert data["parser"] == manifest_file._parser() and data["parser"].count(":") == 2
    data["document"]["args"] = ["from", "the", "entry"]
    open(entry, "w").write(json.dumps(data))
    assert manifest_file.read(str(source), directory)["args"] == ["from", "the", "entry"]
    monkeypatch.setattr(manifest_file, "_parser", lambda: "another")
    assert manifest_file.read(str(source), directory)["args"] == ["a", "b"]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("planted", ["other-uid", "symlink", "not-json", "huge"])
def test_an_entry_not_as_written_is_parsed_anew(kept, tmp_path, planted):
    source, directory = kept
    manifest_file.read(str(source), directory)
    entry = _entry(directory)
    forged = json.dumps({"text": TEXT, "parser": manifest_file._parser(), "document": {"command": "/bin/sh"}})
    os.unlink(entry)
    if planted == "symlink":
        (tmp_path / "elsewhere.json").write_text(forged)
        os.symlink(tmp_path / "elsewhere.json", entry)
    else:
        body = {"other-uid": forged, "not-json": "{", "huge": forged + " " * (8 * manifest_file.MAX_MANIFEST_BYTES)}
        open(entry, "w").write(body[planted])
        if planted == "other-uid":
            os.chown(entry, 64123, 64123)
    assert manifest_file.read(str(source), directory)["command"] == "/bin/true"


@pytest.mark.timeout(10)
def test_what_json_cannot_give_back_is_not_kept(tmp_path, kept):
    _, directory = kept
    source = tmp_path / "dated.yaml"
    source.write_text("command: /bin/true\nwhen: 2026-12-01\n1: one\n")
    first = manifest_file.read(str(source), directory)
    assert [n for n in os.listdir(directory) if n.startswith("dated.yaml")] == []
    assert manifest_file.read(str(source), directory) == first


@pytest.mark.timeout(10)
def test_refusals_are_not_kept(tmp_path, kept):
    _, directory = kept
    source = tmp_path / "alias.yaml"
    source.write_text("a: &x [1]\nb: *x\n")
    for _ in range(2):
        with pytest.raises(ManifestError, match="aliases are not allowed"):
            manifest_file.read(str(source), directory)
    assert [n for n in os.listdir(directory) if n.startswith("alias.yaml")] == []


_LOAD = """
import sys
from supervisor.manifests import manifest
loaded = manifest.load_all([sys.argv[1]], only="m", state_root=sys.argv[2], parsed=sys.argv[3])
print(sorted(loaded), "yaml" in sys.modules)
"""


@pytest.mark.timeout(20)
def test_a_second_load_imports_no_yaml(kept, tmp_path):
    """The private supervisor of each `run --manifests`: PyYAML only for a
    manifest it has not parsed before (the other files of the directory,
    read for their name, included)."""
    source, directory = kept
    (tmp_path / "other.yaml").write_text("name: other\ncommand: /bin/true\nuser: nobody\n")
    argv = [PYTHON, "-c", _LOAD, str(tmp_path), str(tmp_path / "root"), directory]
    outs = [subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True).stdout for _ in range(2)]
    assert outs == ["['m'] True\n", "['m'] False\n"]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("granted,warned", [("{root}", True), ("{top}", True), ("{root}/servers/m/x", False),
                                            ("{top}/elsewhere", False)])
def test_a_grant_holding_the_state_root_is_warned_about(tmp_path, granted, warned):
    """Such a server could rewrite the parsed manifests (and every server's state)."""
    from supervisor.manifests import manifest
    root = tmp_path / "top" / "root"
    path = granted.format(root=root, top=tmp_path / "top")
    source = tmp_path / "m.yaml"
    source.write_text(f"command: /bin/true\nuser: nobody\nsandbox: {{read_write: [{path}]}}\n")
    m = manifest.load(str(source), state_root=str(root))
    assert any("holds the supervisor's state root" in w for w in m.warnings) == warned, m.warnings


@pytest.mark.timeout(20)
def test_entries_are_bounded(kept, tmp_path, monkeypatch):
    """One entry per manifest path ever parsed: the least recently written go."""
    _, directory = kept
    monkeypatch.setattr(manifest_file, "_KEPT_ENTRIES", 5)
    for i in range(9):
        source = tmp_path / f"m{i}.yaml"
        source.write_text(f"command: /bin/true\nargs: [{i}]\n")
        manifest_file.read(str(source), directory)
        os.utime(_newest(directory), ns=(i * 10**9, i * 10**9))
    assert sorted(n.split("-")[0] for n in os.listdir(directory)) == [f"m{i}.yaml" for i in range(4, 9)]


def _newest(directory: str) -> str:
    return max((os.path.join(directory, n) for n in os.listdir(directory)), key=os.path.getctime)


@pytest.mark.timeout(10)
def test_a_manifest_not_in_utf8_is_parsed_each_time(tmp_path, kept):
    """YAML may be UTF-16 (with its BOM): read all the same, nothing kept."""
    _, directory = kept
    source = tmp_path / "wide.yaml"
    source.write_bytes("command: /bin/true\n".encode("utf-16"))
    for _ in range(2):
        assert manifest_file.read(str(source), directory) == {"command": "/bin/true"}
    assert [n for n in os.listdir(directory) if n.startswith("wide.yaml")] == []
