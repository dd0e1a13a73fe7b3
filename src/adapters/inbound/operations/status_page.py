"""`GET /status`: one server-rendered HTML page that updates itself from `/status.json`.

No build step, no framework, nothing fetched but `/status.json`: the page is rendered
here from the same `StatusReport`, and a few lines of plain JS refresh every figure once a
second. Each figure's element names its value (`data-v`, a key of the flattened JSON:
`u:NAME:field` per upstream, `r:NAME:ADDRESS:field` per replica, `s:NAME:CONSUMER:field` per
consumer of an upstream, `c:NAME:field` per consumer) and, for a share or an index, its format
(`data-fmt`: `pct`, `2` decimals); each bar its value and its scale (`data-bar`, `data-of`: a
key, a number, or `max:u:field` / `max:c:field`, the largest of that field). When the
upstreams, replicas or consumers listed change, the page reloads itself (the server renders
the new rows).
"""

from __future__ import annotations

import math
from html import escape

from ports.status import ConsumerStatus, StatusReport, UpstreamStatus

_CSS = """
:root{--fg:#1b1f24;--mute:#5b6570;--bg:#f6f7f9;--card:#fff;--bar:#d9dee4;--ok:#2f7d4f;--warn:#b7791f;--bad:#c0392b}
*{box-sizing:border-box}body{margin:0;font:15px/1.4 system-ui,sans-serif;color:var(--fg);background:var(--bg)}
header{display:flex;flex-wrap:wrap;gap:.25rem 1rem;align-items:baseline;padding:.75rem 1rem;background:var(--card);
border-bottom:1px solid var(--bar)}h1{font-size:1.2rem;margin:0}h2{font-size:1rem;margin:1rem 1rem .5rem}
h3{font-size:1rem;margin:0 0 .5rem;word-break:break-all}.mute{color:var(--mute)}
.grid{display:grid;gap:.75rem;padding:0 1rem;grid-template-columns:repeat(auto-fill,minmax(17rem,1fr))}
.card{background:var(--card);border:1px solid var(--bar);border-radius:.5rem;padding:.75rem}
.fig{margin:.35rem 0}.fig .row{display:flex;justify-content:space-between;gap:.5rem}
.num{font-variant-numeric:tabular-nums;font-weight:600}
.bar{height:.6rem;background:var(--bar);border-radius:.3rem;overflow:hidden;margin-top:.15rem}
.bar i{display:block;height:100%;background:var(--ok);transition:width .3s}.bar.q i{background:var(--warn)}
.bar.e i{background:var(--bad)}table{width:100%;border-collapse:collapse;font-size:.9rem}
td,th{text-align:left;padding:.1rem .25rem}.stale header{background:#fde8e8}
footer{padding:1rem;font-size:.8rem}
"""

# Refresh: fetch the JSON, reload when the rows changed, else set every figure and bar.
_JS = """
const flat = s => { const f = {ready: s.ready ? "ready" : "draining", window_seconds: s.window_seconds};
  const add = (p, o) => { for (const k in o) if (typeof o[k] !== "object" || o[k] === null) {
    f[p + k] = o[k]; f["max:" + p.slice(0, 2) + k] = Math.max(f["max:" + p.slice(0, 2) + k] || 0, o[k] || 0); } };
  for (const u of s.upstreams) { add("u:" + u.name + ":", u);
    for (const r of u.replicas) add("r:" + u.name + ":" + r.address + ":", r);
    for (const c of u.consumers) add("s:" + u.name + ":" + c.name + ":", c); }
  for (const c of s.consumers) add("c:" + c.name + ":", c);
  return f; };
const rows = s => s.upstreams.map(u => [u.name, ...u.replicas.map(r => r.address),
  ...u.consumers.map(c => "s:" + c.name)].join(",")).concat(s.consumers.map(c => "c:" + c.name)).join(" ");
const fmt = (v, how) => v === null || v === undefined ? "\\u2013"
  : how === "pct" ? Math.round(100 * v) + "%" : how === "2" ? v.toFixed(2)
  : typeof v === "number" && !Number.isInteger(v) ? v.toFixed(1) : String(v);
async function refresh() {
  try {
    const s = await (await fetch("status.json", {cache: "no-store"})).json();
    if (rows(s) !== document.body.dataset.rows) { location.reload(); return; }
    const f = flat(s);
    for (const el of document.querySelectorAll("[data-v]")) el.textContent = fmt(f[el.dataset.v], el.dataset.fmt);
    for (const el of document.querySelectorAll("[data-bar]")) {
      const of = el.dataset.of in f ? f[el.dataset.of] : Number(el.dataset.of);
      el.style.width = (of > 0 ? Math.min(100, 100 * (f[el.dataset.bar] || 0) / of) : 0) + "%"; }
    document.body.classList.remove("stale");
  } catch (e) { document.body.classList.add("stale"); }
}
setInterval(refresh, 1000);
"""


def _fmt(value: object, how: str = "") -> str:
    """As the page's `fmt`: a dash for none, a share as a whole percent (`pct`), `2` decimals,
    else one decimal for fractions."""
    if value is None:
        return "\u2013"
    if how == "pct":
        return f"{math.floor(100 * float(value) + 0.5)}%"  # type: ignore[arg-type]  # JS Math.round
    if how == "2":
        return f"{float(value):.2f}"  # type: ignore[arg-type]
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.1f}"
    if isinstance(value, float):
        return str(int(value))
    return str(value)


class _Page:
    """The flattened figures of one report (the JSON keys the page's script uses)."""

    def __init__(self, report: StatusReport) -> None:
        self.values: dict[str, object] = {"ready": "ready" if report.ready else "draining",
                                          "window_seconds": report.window_seconds}
        for upstream in report.upstreams:
            self._add(f"u:{upstream.name}:", upstream)
            for replica in upstream.replicas:
                self._add(f"r:{upstream.name}:{replica.address}:", replica)
            for share in upstream.consumers:
                self._add(f"s:{upstream.name}:{share.name}:", share)
        for consumer in report.consumers:
            self._add(f"c:{consumer.name}:", consumer)
        listed = [[u.name, *(r.address for r in u.replicas), *(f"s:{c.name}" for c in u.consumers)]
                  for u in report.upstreams]
        self.rows = " ".join([",".join(names) for names in listed] + [f"c:{c.name}" for c in report.consumers])

    def _add(self, prefix: str, item: object) -> None:
        for field in item.__struct_fields__:  # type: ignore[attr-defined]
            value = getattr(item, field)
            if isinstance(value, (dict, list)):
                continue
            self.values[prefix + field] = value
            top = f"max:{prefix[:2]}{field}"
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.values[top] = max(float(self.values.get(top, 0.0)), float(value))  # type: ignore[arg-type]

    def figure(self, key: str, how: str = "") -> str:
        fmt = f' data-fmt="{how}"' if how else ""
        return f'<span class="num" data-v="{escape(key)}"{fmt}>{escape(_fmt(self.values.get(key), how))}</span>'

    def bar(self, key: str, of: str, kind: str = "") -> str:
        scale = self.values.get(of, None)
        if scale is None:
            try:
                scale = float(of)
            except ValueError:
                scale = 0.0
        value = self.values.get(key) or 0
        width = min(100.0, 100.0 * float(value) / float(scale)) if scale else 0.0  # type: ignore[arg-type]
        return (f'<div class="bar {kind}"><i data-bar="{escape(key)}" data-of="{escape(of)}" '
                f'style="width:{width:.1f}%"></i></div>')


def _upstream(page: _Page, up: UpstreamStatus, auth: bool) -> str:
    k = f"u:{up.name}:"
    parts = [f'<article class="card" id="{escape("up-" + up.name)}"><h3>{escape(up.name)}</h3>']
    if up.capped:
        parts.append(f'<div class="fig"><div class="row"><span>in flight</span><span>{page.figure(k + "in_flight")}'
                     f' / {page.figure(k + "cap")}</span></div>{page.bar(k + "in_flight", k + "cap")}</div>')
        parts.append(f'<div class="fig"><div class="row"><span>queued</span><span>{page.figure(k + "queue_depth")}'
                     f' / {page.figure(k + "queue_limit")}</span></div>'
                     f'{page.bar(k + "queue_depth", k + "queue_limit", "q")}</div>')
        parts.append(f'<div class="fig"><div class="row"><span>oldest wait (s)</span><span>'
                     f'{page.figure(k + "oldest_wait_seconds")} / {page.figure(k + "queue_timeout_seconds")}</span>'
                     f'</div>{page.bar(k + "oldest_wait_seconds", k + "queue_timeout_seconds", "q")}</div>')
    else:
        parts.append(f'<div class="fig"><div class="row"><span>in flight (uncapped)</span>'
                     f'<span>{page.figure(k + "in_flight")}</span></div>'
                     f'{page.bar(k + "in_flight", "max:u:in_flight")}</div>')
    parts.append(f'<div class="fig"><div class="row"><span>503s, last minute</span>'
                 f'<span>{page.figure(k + "unavailable_last_minute")}</span></div>'
                 f'{page.bar(k + "unavailable_last_minute", "max:u:unavailable_last_minute", "e")}</div>')
    if up.replicas:
        parts.append("<table><tr><th>replica</th><th>state</th><th>in flight</th></tr>")
        for replica in up.replicas:
            r = f"r:{up.name}:{replica.address}:"
            parts.append(f"<tr><td>{escape(replica.address)}</td><td>{page.figure(r + 'state')}</td>"
                         f"<td>{page.figure(r + 'in_flight')} / {page.figure(r + 'limit')}"
                         f"{page.bar(r + 'in_flight', r + 'limit')}</td></tr>")
        parts.append("</table>")
    if auth:
        parts.append(_shares(page, up))
    parts.append("</article>")
    return "".join(parts)


def _shares(page: _Page, up: UpstreamStatus) -> str:
    """Who used this upstream in the last minute (slot time, weighted tokens) and how evenly."""
    k = f"u:{up.name}:"
    parts = [f'<div class="fig"><div class="row"><span>fairness (Jain), last minute</span>'
             f'<span>{page.figure(k + "fairness_index", "2")}</span></div>{page.bar(k + "fairness_index", "1")}</div>']
    if up.consumers:
        parts.append("<table><tr><th>consumer</th><th>slot time</th><th>tokens (weighted)</th></tr>")
        for share in up.consumers:
            s = f"s:{up.name}:{share.name}:"
            parts.append(f"<tr><td>{escape(share.name)}</td>"
                         f"<td>{page.figure(s + 'slot_share', 'pct')}{page.bar(s + 'slot_share', '1')}</td>"
                         f"<td>{page.figure(s + 'token_share', 'pct')}{page.bar(s + 'token_share', '1')}</td></tr>")
        parts.append("</table>")
    return "".join(parts)


def _consumer(page: _Page, consumer: ConsumerStatus) -> str:
    k = f"c:{consumer.name}:"
    requests_of = k + "requests_per_minute" if consumer.requests_per_minute else "max:c:requests_last_minute"
    tokens_of = k + "tokens_per_minute" if consumer.tokens_per_minute else "max:c:tokens_last_minute"
    return (
        f'<article class="card" id="{escape("consumer-" + consumer.name)}"><h3>{escape(consumer.name)}</h3>'
        f'<div class="fig"><div class="row"><span>requests, last minute</span><span>'
        f'{page.figure(k + "requests_last_minute")} / {page.figure(k + "requests_per_minute")}</span></div>'
        f'{page.bar(k + "requests_last_minute", requests_of)}</div>'
        f'<div class="fig"><div class="row"><span>tokens, last minute</span><span>'
        f'{page.figure(k + "tokens_last_minute")} / {page.figure(k + "tokens_per_minute")}</span></div>'
        f'{page.bar(k + "tokens_last_minute", tokens_of)}</div>'
        f'<div class="fig"><div class="row"><span>limited (429), last minute</span><span>'
        f'{page.figure(k + "limited_last_minute")}</span></div>'
        f'{page.bar(k + "limited_last_minute", "max:c:limited_last_minute", "e")}</div></article>'
    )


def render(report: StatusReport) -> str:
    page = _Page(report)
    upstreams = "".join(_upstream(page, u, report.auth) for u in report.upstreams)
    if report.auth:
        consumers = "".join(_consumer(page, c) for c in report.consumers) or \
            '<p class="mute">No consumer sent a request in the last minute.</p>'
    else:
        consumers = '<p class="mute">API keys are off: every request is the one anonymous consumer.</p>'
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1"><link rel="icon" href="data:,">'
        f"<title>gateway status</title><style>{_CSS}</style></head>"
        f'<body data-rows="{escape(page.rows)}"><header><h1>gateway</h1>'
        f'<span>{page.figure("ready")}</span>'
        f'<span class="mute">{escape(report.backend)} backend, {report.workers} worker(s); '
        f'per-minute figures over {page.figure("window_seconds")} s</span></header>'
        f'<h2>Upstreams</h2><section class="grid">{upstreams}</section>'
        f'<h2>Consumers</h2><section class="grid">{consumers}</section>'
        '<footer class="mute">Refreshed every second from <a href="status.json">status.json</a>; '
        'metrics: <a href="metrics">/metrics</a>.</footer>'
        f"<script>{_JS}</script></body></html>"
    )
