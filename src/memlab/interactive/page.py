"""What every kernel-free piece needs to put itself on a page: its script and its data, inline.

The bit viewer and the memory estimator render self-contained HTML: one ``<script>`` holding
the JSON their Python side computed, one per shared script of ``static/`` (``format.js``: numbers
as Python writes them), one per script the piece's own needs (the estimator's activation side),
one holding the piece's algorithm from ``static/``.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from memlab.errors import MemlabError


@cache
def static_script(name: str) -> str:
    """The text of a script shipped as package data in memlab/interactive/static (chapters: 1, 2)."""
    path = resources.files("memlab.interactive") / "static" / name
    if not path.is_file():
        raise MemlabError(f"no script {name!r} in memlab/interactive/static")
    text = path.read_text(encoding="utf-8")
    if "</script" in text.lower() or "<!--" in text:
        raise MemlabError(f"static/{name} must not contain '</script' or '<!--'")
    return text


def script_json(data) -> str:
    """JSON that is safe inside a <script> element (chapters: 1, 2)."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


SHARED_SCRIPTS = ("format.js",)  # what every piece's script uses: numbers as Python writes them


def mount_scripts(vid: str, data, *, script: str, module: str, role: str = "data",
                  needs: tuple[str, ...] = ()) -> str:
    """The data, shared and algorithm scripts of the piece with root id ``vid`` (chapters: 1, 2).

    The shared scripts (:data:`SHARED_SCRIPTS`) define their globals first; defining them again,
    for a second piece on the page, changes nothing. So do the scripts ``needs`` names, which
    ``script`` reads (in order, after the shared ones). The last script mounts ``module`` (the
    global the static script defines) on its parent, or, where the output was attached
    elsewhere, on the element with that id once it exists.
    """
    vid_js = json.dumps(vid)
    return (
        f'<script type="application/json" data-role="{role}">{script_json(data)}</script>'
        + "".join(f"<script>{static_script(name)}</script>" for name in SHARED_SCRIPTS + needs)
        + f"<script>{static_script(script)}\n"
        f"(function(){{var s=document.currentScript,"
        f"r=s&&s.parentElement&&s.parentElement.id==={vid_js}?s.parentElement:null;"
        f"if(r){{{module}.mount(r,JSON.parse("
        f"r.querySelector('script[data-role=\"{role}\"]').textContent));}}"
        f"else{{{module}.mountById({vid_js});}}}})();</script>"
    )
