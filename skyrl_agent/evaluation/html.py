"""A self-contained HTML report: run summary, charts, per-task table and a trajectory viewer.

One file, no network: the charts are inline SVG (charts.py: pass@k over k, mean reward per task,
histograms of turns and sampled tokens, the time account, and a training run's per-step
curves); the data is embedded as JSON and a small script renders it, with a task filter and
expandable trajectories showing each turn's new input, the model's output and the reward.

Every string in the page may be the agent's (outputs, reasons, task ids): the JSON goes through
`script_json`, text and attributes outside it through `html.escape`, and the page's
Content-Security-Policy runs only its own script (by hash) and loads nothing.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skyrl_agent.evaluation.charts import run_charts, training_charts
from skyrl_agent.evaluation.curves import Series
from skyrl_agent.evaluation.stats import RunSummary
from skyrl_agent.types import Trajectory, Turn

Decode = Callable[[tuple[int, ...]], str]

# The characters that let text inside <script> end it or switch the HTML tokenizer into its
# (double) escaped states ("<!--<script>", "</script>"), plus JavaScript's line separators; as
# \u escapes JSON.parse reads them back unchanged.
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                              "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _finite(value: Any) -> Any:
    """Non-finite floats as text ("-inf"): JSON.parse rejects NaN and Infinity outright."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def script_json(value: Any) -> str:
    """`value` as JSON that is safe inside an HTML <script> element whatever text it holds."""
    return json.dumps(_finite(value), allow_nan=False).translate(_SCRIPT_SAFE)


def _input_pieces(turn: Turn, new_input: tuple[int, ...],
                  decode: Decode | None) -> list[str | dict[str, str]]:
    """A turn's new input as text pieces and, where it shows images, `{"image": sha256}`."""
    if decode is None:
        return [f"[{len(new_input)} tokens]"]
    start = len(turn.prompt_ids) - len(new_input)
    pieces: list[str | dict[str, str]] = []
    at = start
    for image in turn.images:
        if image.offset >= start:
            pieces += [decode(turn.prompt_ids[at : image.offset]), {"image": image.sha256}]
            at = image.end
    pieces.append(decode(turn.prompt_ids[at:]))
    return [piece for piece in pieces if piece != ""]


def image_url(data: bytes) -> str | None:
    """A data: URL for PNG or JPEG bytes (by their signature); None for anything else, which
    the page then does not show."""
    kind = "png" if data.startswith(b"\x89PNG\r\n\x1a\n") else \
        "jpeg" if data.startswith(b"\xff\xd8\xff") else None
    return None if kind is None else f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


def _images(trajectory: Trajectory) -> dict[str, str | None]:
    """Each image of the trajectory once, by content address."""
    return {image.sha256: image_url(image.data) for segment in trajectory.segments
            for turn in segment.turns for image in turn.images}


def _turns(trajectory: Trajectory, decode: Decode | None) -> list[dict[str, Any]]:
    turns = []
    for segment_index, segment in enumerate(trajectory.segments):
        for turn, new_input in zip(segment.turns, segment.new_inputs(), strict=True):
            turns.append({
                "segment": segment_index,
                "input": _input_pieces(turn, new_input, decode),
                "output": decode(turn.completion_ids) if decode
                else f"[{len(turn.completion_ids)} tokens]",
                "prompt_tokens": len(turn.prompt_ids),
                "completion_tokens": len(turn.completion_ids),
                "mean_logprob": sum(turn.completion_logprobs) / max(1, len(turn.completion_ids)),
                "policy_version": turn.policy_version, "finish": turn.finish_reason.value})
    return turns


def report_data(summary: RunSummary, trajectories: list[Trajectory], title: str,
                decode: Decode | None) -> dict[str, Any]:
    return {
        "title": title, "summary": dataclasses.asdict(summary),
        "trajectories": [{
            "task": t.task_id, "sample": t.sample_index, "agent": t.agent,
            "reward": t.reward.value, "reward_reason": t.reward.reason,
            "components": dict(t.reward.components), "finish": t.finish_reason.value,
            "masked": t.masked, "mask_reason": t.mask_reason, "time": t.time_account(),
            "segments": len(t.segments), "turns": _turns(t, decode),
            "images": _images(t)} for t in trajectories]}


def charts_html(summary: RunSummary, trajectories: list[Trajectory],
                training: dict[str, Series] | None = None) -> str:
    """The charts' section(s): the run's, then (for a training run) the per-step curves."""
    figures = "".join(f'<figure class="chart-box">{svg}</figure>'
                      for svg in run_charts(summary, trajectories))
    parts = [f'<h2>Charts</h2><div class="charts" id="run-charts">{figures}</div>']
    curves = training_charts(training or {})
    if curves:
        figures = "".join(f'<figure class="chart-box">{svg}</figure>' for svg in curves)
        parts.append(f'<h2>Training</h2><div class="charts" id="training-charts">{figures}</div>')
    return "".join(parts)


def write_report(path: Path, summary: RunSummary, trajectories: list[Trajectory], title: str,
                 decode: Decode | None = None, training: dict[str, Series] | None = None,
                 ) -> Path:
    """Write the report; `training` is a training run's per-step metrics (curves.py)."""
    parts = {"TITLE": html.escape(title), "CHARTS": charts_html(summary, trajectories, training),
             "DATA": script_json(report_data(summary, trajectories, title, decode)),
             "SCRIPT": _SCRIPT, "SCRIPT_HASH": _SCRIPT_HASH}
    # One pass, so a placeholder's name inside the inserted text is never replaced in turn.
    page = re.sub(r"__(TITLE|CHARTS|DATA|SCRIPT|SCRIPT_HASH)__", lambda m: parts[m.group(1)],
                  _PAGE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-__SCRIPT_HASH__'">
<title>__TITLE__</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
.trajectory { border: 1px solid #bbb; border-radius: 4px; margin: 6px 0; padding: 4px 8px; }
.trajectory.masked { background: #fff4e5; }
.turn { border-left: 3px solid #8ab; margin: 8px 0 8px 8px; padding-left: 8px; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: 6px; max-height: 24em; overflow: auto; }
.meta { color: #666; font-size: 12px; }
img.shown { display: block; max-width: 320px; min-width: 64px; image-rendering: pixelated; border: 1px solid #ccc; margin: 4px 0; }
.charts { display: flex; flex-wrap: wrap; gap: 8px; }
.chart-box { margin: 0; border: 1px solid #ddd; border-radius: 4px; }
svg.chart { font: 11px system-ui, sans-serif; fill: #333; }
svg.chart .chart-title { font-size: 13px; font-weight: 600; }
svg.chart line.grid { stroke: #eee; } svg.chart line.axis, svg.chart line.tick { stroke: #888; }
svg.chart .marks rect:hover, svg.chart .marks circle:hover { opacity: 0.7; }
</style></head>
<body>
<h1 id="title"></h1>
<div id="summary"></div>
__CHARTS__
<h2>Tasks</h2><table id="tasks"></table>
<h2>Trajectories</h2>
<label>Filter by task: <input id="filter" placeholder="task name"></label>
<div id="trajectories"></div>
<script type="application/json" id="data">__DATA__</script>
<script>__SCRIPT__</script>
</body></html>
"""
_SCRIPT = """
const data = JSON.parse(document.getElementById("data").textContent);
const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  Object.entries(attrs).forEach(([k, v]) => node.setAttribute(k, v));
  children.forEach(c => node.append(c));
  return node;
};
const fmt = x => (x === null || x === undefined) ? "" : (typeof x === "number" ? x.toFixed(3) : String(x));
document.getElementById("title").textContent = data.title;
const s = data.summary;
const scored = s.tasks - s.unscored_tasks;
const over = k => s.pass_at_tasks[k] < scored ? ` (over ${s.pass_at_tasks[k]} of ${scored} tasks)` : "";
const passAt = Object.entries(s.pass_at).map(([k, v]) => `pass@${k} ${fmt(v)}${over(k)}`).join(", ")
  + (s.unscored_tasks ? `; left out of pass@k: ${s.unscored_tasks} tasks with every sample masked` : "");
document.getElementById("summary").append(
  el("p", {}, `${s.trajectories} trajectories over ${s.tasks} tasks; reward mean ${fmt(s.reward_mean)}; ${passAt}; masked ${s.masked}`),
  el("p", {}, `finish reasons: ${JSON.stringify(s.finish_reasons)}; turns ${fmt(s.turns_mean)}; completion tokens ${fmt(s.completion_tokens_mean)}; summaries ${s.summaries_total}; drift ${fmt(s.drift_tokens_mean)}`),
  el("p", {"id": "time-account"}, "seconds per trajectory: " + Object.entries(s.time_account).map(([k, v]) => `${k} ${v.toFixed(2)}`).join(" · ")));
const tasks = document.getElementById("tasks");
tasks.append(el("tr", {}, ...["task", "samples", "passed", "reward mean", "masked", "turns"].map(h => el("th", {}, h))));
s.per_task.forEach(r => tasks.append(el("tr", {"class": "task-row"},
  ...[r.task_id, r.samples, r.passed, fmt(r.reward_mean), r.masked, fmt(r.turns_mean)].map(v => el("td", {}, String(v))))));
const list = document.getElementById("trajectories");
// A piece of a turn's input: text, or an image the trajectory holds (a data: URL of PNG/JPEG).
const shown = (t, p) => typeof p === "string" ? p : (t.images[p.image]
  ? el("img", {"class": "shown", "src": t.images[p.image], "alt": `image ${p.image.slice(0, 12)}`})
  : `[image ${p.image.slice(0, 12)}: not PNG or JPEG]`);
data.trajectories.forEach(t => {
  const head = el("summary", {}, `${t.task} #${t.sample} — reward ${fmt(t.reward)} — ${t.finish} — ${t.turns.length} turns` + (t.masked ? ` — masked: ${t.mask_reason}` : ""));
  const box = el("details", {"class": "trajectory" + (t.masked ? " masked" : ""), "data-task": t.task}, head);
  if (t.reward_reason) box.append(el("p", {"class": "meta"}, `reward note: ${t.reward_reason}`));
  const spent = Object.entries(t.time).filter(([, v]) => v > 0);
  if (spent.length) box.append(el("p", {"class": "time"}, "seconds: " + spent.map(([k, v]) => `${k} ${v.toFixed(2)}`).join(" · ")));
  t.turns.forEach((turn, i) => box.append(el("div", {"class": "turn"},
    el("div", {"class": "meta"}, `turn ${i + 1} (segment ${turn.segment + 1}) · prompt ${turn.prompt_tokens} tok · completion ${turn.completion_tokens} tok · mean logprob ${fmt(turn.mean_logprob)} · policy v${turn.policy_version} · ${turn.finish}`),
    el("div", {}, "input"), el("pre", {"class": "input"}, ...turn.input.map(p => shown(t, p))),
    el("div", {}, "output"), el("pre", {"class": "output"}, turn.output))));
  list.append(box);
});
document.getElementById("filter").addEventListener("input", e => {
  const q = e.target.value.toLowerCase();
  document.querySelectorAll(".trajectory").forEach(d => { d.style.display = d.dataset.task.toLowerCase().includes(q) ? "" : "none"; });
});
let drawn = 0;  // a chart counts when the browser laid out its marks with a non-empty box
document.querySelectorAll("svg.chart").forEach(svg => {
  const box = svg.querySelector("g.marks").getBBox();
  const ok = box.width > 0 || box.height > 0;
  svg.setAttribute("data-drawn", ok ? "1" : "0");
  drawn += ok ? 1 : 0;
});
document.body.setAttribute("data-charts", String(drawn));
document.body.setAttribute("data-rendered", String(data.trajectories.length));
// An image counts as shown once the browser decoded it (the page's policy allows data: images).
document.querySelectorAll("img.shown").forEach(img => img.decode().then(
  () => img.setAttribute("data-decoded", `${img.naturalWidth}x${img.naturalHeight}`),
  () => img.setAttribute("data-decoded", "failed")));
"""
# The page's CSP runs this script only: an injected one or an on* attribute would not run.
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
