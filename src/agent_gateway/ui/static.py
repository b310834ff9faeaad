"""The status page's style and script, inline in the page: no build step, no external assets.

The script refreshes the live sections every ``REFRESH_MS`` by fetching the page's
``?part=live`` fragment and swapping each ``[data-live]`` section by id (the catalog only when
its version changed, so open schemas and the search stay as they are), and asks the gateway
for the catalog as the search box finds it (``?part=catalog&q=``) once typing pauses: the page
holds only the first of the tools a search matches, not the whole catalog to filter.
"""

from __future__ import annotations

REFRESH_MS = 2000
SEARCH_DELAY_MS = 250
"""Milliseconds the search box waits after a keystroke before it asks the gateway."""

STYLE = """
:root { color-scheme: light dark; --ok: #1a7f37; --bad: #cf222e; --warn: #9a6700;
  --muted: #6e7781; --line: #d0d7de; --bad-bg: rgba(207, 34, 46, .12); }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; padding: 1rem 1.5rem; max-width: 88rem; }
header { display: flex; align-items: baseline; gap: 1rem; border-bottom: 1px solid var(--line); }
header h1 { font-size: 1.4rem; margin: .3rem 0; }
header .version { color: var(--muted); }
header #updated { margin-left: auto; }
h2 { font-size: 1.1rem; margin: 1.6rem 0 .4rem; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .25rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: var(--muted); }
code, pre, .mono { font-family: ui-monospace, monospace; font-size: 12px; }
pre { margin: .3rem 0; max-height: 20rem; overflow: auto; }
.muted { color: var(--muted); }
.badge { display: inline-block; padding: 0 .45rem; border-radius: 1rem; font-weight: 600; color: #fff; }
.state-up .badge { background: var(--ok); }
.state-connecting .badge { background: var(--warn); }
.state-down .badge { background: var(--bad); }
tr.state-down td, tr.failed td { background: var(--bad-bg); }
tr.failed .outcome, .error { color: var(--bad); font-weight: 600; }
input[type=search] { font: inherit; padding: .3rem .5rem; width: 24rem; max-width: 100%; }
details summary { cursor: pointer; color: var(--muted); }
.steps { margin: 0; padding-left: 1rem; }
#stale[hidden] { display: none; }
#stale { color: var(--bad); font-weight: 600; }
"""

SCRIPT = (
    """
"use strict";
const REFRESH_MS = """
    + str(REFRESH_MS)
    + """;
const SEARCH_DELAY_MS = """
    + str(SEARCH_DELAY_MS)
    + """;
const search = document.getElementById("search");
let asked = 0;  // searches sent: an answer is shown only if no search was sent after its request
let typing = null;

function swap(html, withCatalog) {
  const fresh = new DOMParser().parseFromString(html, "text/html");
  for (const section of fresh.querySelectorAll("[data-live]")) {
    const old = document.getElementById(section.id);
    if (old && (withCatalog || section.id !== "catalog")) old.replaceWith(document.adoptNode(section));
  }
}

async function find() {
  const mine = ++asked;
  try {
    const url = location.pathname + "?part=catalog&q=" + encodeURIComponent(search.value);
    const answer = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    if (!answer.ok) throw new Error("status " + answer.status);
    const html = await answer.text();
    if (mine === asked) swap(html, true);
  } catch (problem) {
    document.getElementById("stale").hidden = false;
  }
}

async function refresh() {
  let wait = REFRESH_MS;
  try {
    const catalog = document.getElementById("catalog").dataset;
    const searches = asked;
    const url = location.pathname + "?part=live&catalog=" + encodeURIComponent(catalog.version) +
      "&q=" + encodeURIComponent(catalog.query);
    const answer = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    if (answer.status === 429) {  // past this client's budget of pages: back when it says
      wait = Math.max(REFRESH_MS, 1000 * (Number(answer.headers.get("Retry-After")) || 0));
    }
    if (!answer.ok) throw new Error("status " + answer.status);
    swap(await answer.text(), searches === asked);  // a search sent since owns the catalog
    document.getElementById("stale").hidden = true;
  } catch (problem) {
    document.getElementById("stale").hidden = false;
  } finally {
    setTimeout(refresh, wait);
  }
}

async function schema(event) {
  // A row's schema is fetched when it is opened: the page holds none (100 of 16 KiB: 1.7 MB).
  const details = event.target;
  if (!(details instanceof HTMLDetailsElement) || !details.open || !details.dataset.tool) return;
  const pre = details.querySelector("pre");
  if (pre.textContent) return;
  try {
    const url = location.pathname + "?part=schema&tool=" + encodeURIComponent(details.dataset.tool);
    const answer = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    pre.textContent = answer.ok ? await answer.text() : "(not available: status " + answer.status + ")";
  } catch (problem) {
    pre.textContent = "(not available)";
  }
}

document.addEventListener("toggle", schema, true);  // toggle does not bubble: caught on its way down
search.addEventListener("input", () => {
  clearTimeout(typing);
  typing = setTimeout(find, SEARCH_DELAY_MS);
});
setTimeout(refresh, REFRESH_MS);
"""
)
