"""Small Sphinx fixes for the memlab book.

Sphinx reads (and so executes) the pages in the order of their names, which would run the
claims appendix before the chapters. Read them in the book's order instead (``_toc.yml``): each
chapter computes its claims' evidence, kept in ``$MEMLAB_CACHE_DIR``, and the appendix, read
last, finds it there instead of computing every claim's evidence itself.

Sphinx before 8.2 emits some extensions' inline scripts twice (sphinx-thebe's
``THEBE_JS_URL`` among them), which throws "Identifier has already been declared" in
the browser. Drop exact repeats from each page's script list.
"""

from __future__ import annotations

from pathlib import Path


def toc_order(toc: dict) -> list[str]:
    """The documents of a jb-book ``_toc.yml`` (parsed), root first, in reading order."""
    order = [toc["root"]] if toc.get("root") else []

    def walk(entries):
        for entry in entries or ():
            if "file" in entry:
                order.append(str(Path(entry["file"]).with_suffix("")))
            walk(entry.get("sections"))

    for part in toc.get("parts") or [{"chapters": toc.get("chapters")}]:
        walk(part.get("chapters"))
    return order


def _read_in_book_order(app, env, docnames):
    import yaml

    toc = Path(app.srcdir) / "_toc.yml"
    if not toc.is_file():
        return
    rank = {doc: i for i, doc in enumerate(toc_order(yaml.safe_load(toc.read_text())))}
    docnames.sort(key=lambda doc: (rank.get(doc, -1), doc))  # pages outside the TOC first


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
    app.connect("env-before-read-docs", _read_in_book_order)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
