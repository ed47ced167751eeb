"""The built pages, readable on any screen and by any reader.

* ``static/memlab-pages.css`` and ``static/memlab-pages.js`` go on every page: output tables get
  a height limit and their own scroll, short numeric cells do not wrap, and the theme's menu
  buttons open the table of contents at phone and tablet widths.
* The widget manager (``nb_ipywidgets_js``) and the saved widget state load only on a page that
  shows a widget: myst-nb adds them to any notebook with widget state in its metadata, which a
  notebook keeps from widgets it made but never displayed.
* After the build: the source maps the themes ship (``*.map``, of no use to a reader) are
  removed, and each page's HTML is adjusted where the theme's or pandas' markup fails an
  accessibility rule (:func:`accessible_html`).
"""

from __future__ import annotations

import re
from pathlib import Path

STATIC = Path(__file__).parent / "static"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

# A table cell of at most this many characters with a digit in it is a number (with its unit):
# it does not wrap. One of more than PROSE_CELL_CHARS is a sentence: it keeps a readable width.
NUMERIC_CELL_CHARS = 24
PROSE_CELL_CHARS = 60

_EMPTY_TH = re.compile(r"<th((?:\s[^>]*)?)>(?:\s|&nbsp;|&#160;)*</th>")
_CELL = re.compile(r"<(td|th)((?:\s[^>]*)?)>([^<>]*)</\1>")
# The theme's search field says "Search Ctrl+K" on screen, named "Search" only.
_SEARCH_FIELD = re.compile(r'(<button class="btn search-button-field[^"]*"[^>]*?) aria-label="Search"')
# The colour-mode button is named by its aria-label; its icons' titles are not its text.
_THEME_ICON = re.compile(r'(<i class="theme-switch [^"]*" data-mode="[a-z]+")\s+title="[^"]*"')
# The book's title in the primary sidebar sits outside any landmark.
_SIDEBAR_LOGO = re.compile(r'<div class="sidebar-primary-item">(\s*<a class="navbar-brand logo")')


def _mark_cell(match: re.Match) -> str:
    tag, attrs, text = match.groups()
    plain = text.replace("&nbsp;", " ").strip()
    if len(plain) > PROSE_CELL_CHARS:
        mark = "memlab-prose"
    elif plain and len(plain) <= NUMERIC_CELL_CHARS and any(c.isdigit() for c in plain):
        mark = "memlab-num"
    else:
        return match.group(0)
    if mark in attrs:  # marked by an earlier build
        return match.group(0)
    if "class=" in attrs:
        attrs = re.sub(r'class="', f'class="{mark} ', attrs, count=1)
    else:
        attrs += f' class="{mark}"'
    return f"<{tag}{attrs}>{text}</{tag}>"


def accessible_html(html: str) -> str:
    """One built page with the markup that accessibility checkers flag made right.

    Empty table header cells (pandas' corner above the index) become ``td``; short numeric
    cells are marked ``memlab-num`` (no wrapping), long ones ``memlab-prose`` (a readable
    width); the search field is named by its visible
    text; the colour-mode icons lose their titles (hidden from assistive technology); the
    sidebar's book title is put in a named navigation landmark.
    """
    html = _EMPTY_TH.sub(r"<td\1></td>", html)
    html = _CELL.sub(_mark_cell, html)
    html = _SEARCH_FIELD.sub(r"\1", html)
    html = _THEME_ICON.sub(r'\1 aria-hidden="true"', html)
    return _SIDEBAR_LOGO.sub(
        r'<div class="sidebar-primary-item" role="navigation" aria-label="Book">\1', html)


def _add_static(app, config) -> None:
    config.html_static_path = [*config.html_static_path, str(STATIC)]


def _widgets_only_where_shown(app, pagename, templatename, context, doctree) -> None:
    body = context.get("body") or ""
    scripts = context.get("script_files")
    if not scripts or WIDGET_VIEW in body:
        return
    # Sphinx puts _static/ before a local file's name (builder.add_js_file)
    widget_js = {f"_static/{p}" for p in (getattr(app.config, "nb_ipywidgets_js", None) or {})}

    def is_widget(js) -> bool:
        attrs = getattr(js, "attributes", None) or {}
        return (str(getattr(js, "filename", js) or "") in widget_js
                or attrs.get("type") == WIDGET_STATE)

    scripts[:] = [js for js in scripts if not is_widget(js)]


def _after_build(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    for source_map in (out / "_static").rglob("*.map"):
        source_map.unlink()
    for page in out.rglob("*.html"):
        if "_static" in page.relative_to(out).parts:
            continue
        text = page.read_text(encoding="utf-8")
        fixed = accessible_html(text)
        if fixed != text:
            page.write_text(fixed, encoding="utf-8")


def setup(app):
    app.connect("config-inited", _add_static)
    app.add_css_file("memlab-pages.css")
    app.add_js_file("memlab-pages.js", loading_method="defer")
    app.connect("html-page-context", _widgets_only_where_shown, priority=950)
    app.connect("build-finished", _after_build)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
