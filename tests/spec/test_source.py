"""The two readings of a pipeline file agree: the fast one (values only, from libyaml's events)
and the careful walk (values and positions), which also reads whatever the fast one gives up on."""

from __future__ import annotations

import pytest

from tests.conftest import PIPELINES
from tracer.core.errors import TracerError
from tracer.spec import source
from tracer.spec.load import load_spec_text
from tracer.spec.source import SourceMap, parse_document

BUNDLED = sorted(PIPELINES.rglob("*.yaml"))


def _careful(text: str):
    found = SourceMap("f.yaml")
    return source._Walker(found).convert(source._composed(text, "f.yaml"), (), 0), found


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: str(p.relative_to(PIPELINES)))
def test_bundled_files_read_the_same_both_ways_and_find_positions_only_when_asked(path):
    text = path.read_text()
    data, found = parse_document(text, "f.yaml")
    careful, positions = _careful(text)
    assert data == careful
    assert found._values is None and found._keys is None  # nothing located yet
    assert (found.values, found.keys) == (positions.values, positions.keys)


ODD = [
    "a: &x [1, 2]\nb: *x\n",  # an alias
    "a: !!str 5\n",  # a tag, standard
    "a: {b: 1}\n? [1]\n: 2\n",  # a key that is not a scalar
    "1: one\n",  # an int key
    "a: ''\nb: ~\nc: 1e-5\nd: .inf\ne: 0x1f\nf: yes\n",  # the YAML 1.1 scalars
    "name: 'x'\nsteps: [{id: 'a\tb'}]\n",  # a tab in a one-line field
    "note: 'a\tb'\n",  # a tab where one is allowed
    "a: 1\n---\nb: 2\n",  # two documents
    "# nothing\n",
    "null\n",
    "- 1\n- [2, {x: 3}]\n",
]


@pytest.mark.parametrize("text", ODD)
def test_odd_documents_read_as_the_careful_walk_reads_them(text):
    try:
        careful = _careful(text)[0]
    except TracerError as exc:
        with pytest.raises(TracerError) as info:
            parse_document(text, "f.yaml")
        assert str(info.value) == str(exc)
    else:
        assert parse_document(text, "f.yaml")[0] == careful


def test_what_the_fast_reading_leaves_is_read_carefully():
    left = [text for text in ODD if source._plain_values(text) is source._CAREFUL]
    assert left == [ODD[0], ODD[2], ODD[5], ODD[7], ODD[8], ODD[9]]  # alias, odd key, control character, documents, none, null


def test_an_error_found_after_a_fast_reading_is_located():
    text = "name: p\ninputs:\n  x: {shape: [2], init: randn}\nsteps:\n  - id: y\n    op: softmax\n    dimm: -1\n"
    with pytest.raises(TracerError) as info:
        load_spec_text(text, "f.yaml")
    assert str(info.value).startswith("f.yaml:7:5: error[unknown-key]")


def test_a_scalar_is_read_as_its_context_asks_whatever_was_read_before():
    """The fast reading keeps each short scalar's value: the same text is refused as a one-line
    field and kept as a note, and a tag or quoting that changes its type changes the value."""
    note = "note: 'a\tb'\nid: 'a\tb'\n"
    assert source._plain_values("note: 'a\tb'\n") == {"note": "a\tb"}
    assert source._plain_values(note) is source._CAREFUL  # the id's tab
    assert source._plain_values("note: 'a\tb'\n") == {"note": "a\tb"}
    assert source._plain_values("a: 5\nb: '5'\nc: !!str 5\n") == {"a": 5, "b": "5", "c": "5"}
    assert source._plain_values("a: 5\nb: '5'\nc: 5.0\nd: yes\ne: 'yes'\n") == {"a": 5, "b": "5", "c": 5.0, "d": True, "e": "yes"}


def test_the_kept_scalars_are_bounded_and_reading_stays_right_past_the_bound(monkeypatch):
    monkeypatch.setattr(source, "MAX_SCALARS", 8)
    text = "".join(f"k{i}: {i}\n" for i in range(30))
    assert source._plain_values(text) == {f"k{i}": i for i in range(30)}
    assert len(source._SCALARS) <= 8
    assert source._plain_values(text) == {f"k{i}": i for i in range(30)}
