"""Small Sphinx fixes for the memlab book.

Sphinx before 8.2 emits some extensions' inline scripts twice (sphinx-thebe's
``THEBE_JS_URL`` among them), which throws "Identifier has already been declared" in
the browser. Drop exact repeats from each page's script list.
"""

from __future__ import annotations


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        # Same file (or inline body) and attributes; the priority may differ between copies.
        key = (
            str(getattr(js, "filename", js) or ""),
            tuple(sorted((getattr(js, "attributes", None) or {}).items())),
        )
        if key in seen:
            continue
        seen.add(key)
        unique.append(js)
    scripts[:] = unique


def setup(app):
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
