"""`tracer diff A B --html PAGE`: the two pipelines side by side on one offline page."""

import re
from html.parser import HTMLParser

import pytest

import tracer
from tests.browser import Browser, find_chromium
from tests.conftest import PIPELINES, tracer_cli
from tracer.diff import diff, diff_page

MHA = PIPELINES / "causal_mha.yaml"


class Rows(HTMLParser):
    """The class of every table row and the tags the page uses."""

    def __init__(self):
        super().__init__()
        self.rows, self.tags = [], set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "tr":
            self.rows.append(dict(attrs).get("class"))


def _variant(tmp_path, name="b.yaml"):
    """causal_mha with two steps renamed, the softmax over the other axis, and one step added."""
    text = re.sub(r"\bscores\b", "attn_scores", MHA.read_text())
    text = re.sub(r"\bq_heads\b", "q_split", text).replace("{id: weights, op: softmax, dim: -1", "{id: weights, op: softmax, dim: -2")
    text = text.replace(
        "  - {id: out, op: linear, input: merged, weight: W_o, bias: b_o}",
        "  - {id: out, op: linear, input: merged, weight: W_o, bias: b_o}\n  - {id: act, op: gelu}",
    )
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_page_has_a_row_per_pair_marked_as_the_text_diff_marks_it_and_no_script(tmp_path):
    page = tmp_path / "diff.html"
    done = tracer_cli("diff", str(MHA), str(_variant(tmp_path)), "--values", "--html", str(page))
    assert done.returncode == 1, done.stderr
    text = page.read_text()
    parsed = Rows()
    parsed.feed(text)
    assert "script" not in parsed.tags and "img" not in parsed.tags
    assert "Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\"" in text
    steps = [r for r in parsed.rows if r is not None]
    assert len(steps) == 19 and steps.count("renamed") == 2 and steps.count("added") == 1
    assert steps.count("changed") == 1 and steps[-1] == "added"  # the new last step, after its predecessor
    assert "<td>dim -1 -&gt; -2</td>" in text and "values: the first tensor that differs is &#x27;weights&#x27; (max abs" in text


def test_a_hostile_file_name_is_text_on_the_page_in_chromium(tmp_path):
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium on PATH: install Debian's chromium (`make install` does, as root with apt-get)")
    hostile = _variant(tmp_path, "b<img src=x onerror=document.title='owned'>.yaml")
    a, b = tracer.load(MHA), tracer.load(hostile)
    page = tmp_path / "diff.html"
    page.write_text(diff_page(a, b, diff(a, b)))
    browser = Browser(executable)
    try:
        browser.open(page.as_uri(), ready="document.readyState === 'complete'")
        assert browser.evaluate("document.images.length + document.scripts.length") == 0
        assert "onerror=document.title='owned'" in browser.evaluate("document.body.innerText")
        assert browser.evaluate("document.title").endswith("owned'>.yaml · tracer diff")  # the name as text, not set by a handler
        counts = browser.evaluate("['renamed', 'changed', 'added', 'removed'].map(c => document.querySelectorAll('tr.' + c).length)")
        assert counts == [2, 1, 1, 0]
    finally:
        browser.close()
