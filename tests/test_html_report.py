"""The HTML report's integrity against agent-written text: a model's output, a reward or mask
reason, a task id may hold markup meant to blank or hijack the page. The report must render
every trajectory, show such text as text, and run no injected markup."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from skyrl_agent.evaluation.html import script_json, write_report
from skyrl_agent.evaluation.stats import summarize
from skyrl_agent.types import Reward, Segment, Trajectory
from tests.test_store import make_trajectory

# `<!--<script>` puts the tokenizer in "script data double escaped" state (the page's own
# </script> no longer ends the data block); the others are the classic break-outs.
HOSTILE = ("<!--<script>", "</script>", "</textarea>", "<img src=x onerror=\"document.body"
           ".setAttribute('data-pwned','1')\">", "\u2028", "\u2029", "]]>", "&amp;")
PAYLOAD = "".join(HOSTILE)
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "wbr"}


def test_script_json_reads_back_and_leaves_no_markup():
    """Stops: agent text ending or re-entering the <script> that carries the report's data."""
    value = {"output": PAYLOAD, PAYLOAD: [1.5, None, "a\u2028b"], "nested": {"x": "</SCRIPT >"}}
    text = script_json(value)
    assert json.loads(text) == value
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}, text


def test_script_json_writes_non_finite_numbers_as_text():
    """Stops: one -inf logprob (JSON.parse rejects -Infinity) blanking the whole page."""
    text = script_json({"logprob": float("-inf"), "nan": float("nan"), "ok": 0.5})
    assert json.loads(text) == {"logprob": "-inf", "nan": "nan", "ok": 0.5}


class _Elements(HTMLParser):
    """Every element of a serialized DOM as (tag, attributes, text content)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None], list[str]]] = []
        self._open: list[tuple[str, dict[str, str | None], list[str]]] = []

    def handle_starttag(self, tag, attrs):
        element: tuple[str, dict[str, str | None], list[str]] = (tag, dict(attrs), [])
        self.elements.append(element)
        if tag not in VOID:
            self._open.append(element)

    def handle_endtag(self, tag):
        while any(open_tag == tag for open_tag, _, _ in self._open):
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data):
        for _, _, text in self._open:
            text.append(data)

    def find(self, tag: str, css_class: str | None = None) -> list[tuple[dict, str]]:
        return [(attrs, "".join(text)) for name, attrs, text in self.elements
                if name == tag and (css_class is None
                                    or css_class in (attrs.get("class") or "").split())]


def _browser() -> str:
    """Chromium's path; a skip where it is missing, unless the full tier must run (CI)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("SKYRL_AGENT_REQUIRE_DOCKER") == "1":
            pytest.fail("chromium must be installed here (scripts/setup.sh --dev)")
        pytest.skip("chromium not installed (scripts/setup.sh --dev)")
    return browser


def dump_dom(browser: str, page: Path, profile: Path) -> str:
    """The page's DOM, serialized after headless Chromium loaded it and ran its script."""
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-1000:]
    return dom.stdout


def _rendered_dom(browser: str, page: Path, profile: Path) -> _Elements:
    elements = _Elements()
    elements.feed(dump_dom(browser, page, profile))
    return elements


def _hostile_run() -> list[Trajectory]:
    """Four trajectories over two tasks; agent text in every field that reaches the page, and
    one turn with a -inf logprob."""
    runs = [make_trajectory("demo/plain", 0), make_trajectory(f"demo/{PAYLOAD}", 1, 0.0)]
    runs.append(dataclasses.replace(make_trajectory(f"demo/{PAYLOAD}", 2, 0.0),
                                    reward=Reward(0.0, {PAYLOAD: 0.0}, reason=PAYLOAD)))
    masked = make_trajectory("demo/plain", 3)
    turn = dataclasses.replace(masked.segments[0].turns[0],
                               completion_logprobs=(float("-inf"), -0.25))
    runs.append(dataclasses.replace(masked, masked=True, mask_reason=PAYLOAD,
                                    segments=(Segment((turn,)),)))
    return runs


def test_hostile_agent_text_cannot_blank_or_inject_into_the_report(tmp_path):
    """Stops: one trajectory whose output, task id, reward or mask reason holds `<!--<script>`
    (or `</script>`, `<img onerror>`, U+2028) hiding the whole run's report, or adding markup."""
    browser = _browser()
    runs = _hostile_run()
    title = f"run {PAYLOAD}"
    report = write_report(tmp_path / "report.html", summarize(runs), runs, title,
                          decode=lambda ids: f"{PAYLOAD}#{len(ids)}")
    dom = _rendered_dom(browser, report, tmp_path / "profile")
    body = dom.find("body")[0][0]
    assert body.get("data-rendered") == "4" and "data-pwned" not in body, body
    assert not dom.find("img") and not dom.find("textarea")
    assert dom.find("title")[0][1] == title
    assert [text for _, text in dom.find("h1")] == [title]
    boxes = dom.find("details", "trajectory")
    assert len(boxes) == 4
    assert [attrs["data-task"] for attrs, _ in boxes] == [t.task_id for t in runs]
    heads = [text for _, text in dom.find("summary")]
    assert heads[1].startswith(f"demo/{PAYLOAD} #1") and heads[3].endswith(f"masked: {PAYLOAD}")
    assert [text for _, text in dom.find("p", "meta")] == [f"reward note: {PAYLOAD}"]
    outputs = [text for _, text in dom.find("pre", "output")]
    assert len(outputs) == 3 * 3 + 1 and outputs[-1] == f"{PAYLOAD}#2"
    assert "mean logprob -inf" in "".join(text for _, text in dom.find("div", "meta"))
    assert len(dom.find("tr", "task-row")) == 2
    cells = [text for _, text in dom.find("td")]
    assert f"demo/{PAYLOAD}" in cells and "demo/plain" in cells
    # The charts are drawn, with the task's name as a bar's tooltip text, not as markup.
    charts = dom.find("svg", "chart")
    assert body.get("data-charts") == str(len(charts)) and len(charts) == 4
    assert f"demo/{PAYLOAD}: 0" in [text for _, text in dom.find("title")[1:]]


def test_markup_that_slipped_in_would_not_run(tmp_path):
    """Stops: a future escaping slip turning into script execution: the page's CSP runs only
    its own script (by hash), so an injected <script> or on* handler stays inert."""
    browser = _browser()
    runs = [make_trajectory("demo/a", 0)]
    report = write_report(tmp_path / "report.html", summarize(runs), runs, "csp")
    injected = ("<img src=x onerror=\"document.body.setAttribute('data-pwned','img')\">"
                "<script>document.body.setAttribute('data-pwned','script')</script></body>")
    report.write_text(report.read_text().replace("</body>", injected))
    body = _rendered_dom(browser, report, tmp_path / "profile").find("body")[0][0]
    assert body.get("data-rendered") == "1" and "data-pwned" not in body, body


def test_the_viewer_shows_a_turns_images_where_its_input_had_them(tmp_path):
    """A turn whose input showed an image gets it in the viewer, between the text around it,
    once (the next turn, whose prompt still holds it, does not repeat it), decoded by the
    browser under the page's policy; bytes that are not PNG or JPEG (here SVG markup an agent
    could write) are named, never put in an <img>."""
    from skyrl_agent.types import FinishReason, PlacedImage, Turn
    from tests.tiny_models import png

    browser = _browser()
    red, fake = png((200, 0, 0), (30, 20)), b"<svg xmlns='http://www.w3.org/2000/svg'/>"
    first_prompt = (1, 2, *[9] * 4, 3, *[9] * 2, 4)
    first = Turn(first_prompt, (5,), (-0.5,), (1,), 0, FinishReason.STOP,
                 images=(PlacedImage(red, 2, 4), PlacedImage(fake, 7, 2)))
    second = Turn((*first_prompt, 5, 6), (7,), (-0.5,), (1,), 0, FinishReason.STOP,
                  images=first.images)
    runs = [Trajectory("demo/pictures", 0, "test", (Segment((first, second)),), Reward(1.0),
                       FinishReason.STOP)]
    report = write_report(tmp_path / "report.html", summarize(runs), runs, "images",
                          decode=lambda ids: "".join(f"<{i}>" for i in ids))
    dom = dump_dom_with_time(browser, report, tmp_path / "profile")
    images = dom.find("img", "shown")
    assert len(images) == 1
    assert images[0][0]["src"] == "data:image/png;base64," + base64.b64encode(red).decode()
    assert images[0][0].get("data-decoded") == "30x20", images
    inputs = [text for _, text in dom.find("pre", "input")]
    assert inputs[0].startswith("<1><2><3>[image ") and "not PNG or JPEG]<4>" in inputs[0]
    assert inputs[1] == "<6>"  # its prompt adds only this after turn 1's completion


def dump_dom_with_time(browser: str, page: Path, profile: Path) -> _Elements:
    """The DOM after the page's script and the promises it started (image decoding) ran."""
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000", f"--user-data-dir={profile}", "--dump-dom",
         page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-1000:]
    elements = _Elements()
    elements.feed(dom.stdout)
    return elements
