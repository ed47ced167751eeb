"""Each notebook figure's alt text on the page: what the figure says it shows.

A figure drawn by ``memlab.plot`` carries its alt text (``memlab.plot.alt.figure_alt``, computed
from what it drew) in its PNG's ``Description`` text chunk and in the output's metadata. myst-nb
writes each PNG output to a file named by its hash and makes an image node of it, but takes only
width and height from the output's metadata; without an alt, Sphinx writes the file's path as
the ``<img alt>``. Here, after a page is read, every image without an alt gets its PNG's
``Description``.
"""

from __future__ import annotations

from pathlib import Path


def png_description(path: Path) -> str:
    """The ``Description`` text chunk of a PNG file, or "" (none, unreadable, not a PNG)."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            return str(im.info.get("Description", "")) if im.format == "PNG" else ""
    except (OSError, ImportError, ValueError):
        return ""


def _image_path(app, docname: str, node) -> Path:
    """The file an image node names.

    Sphinx's image collector, which runs before this hook, rewrites the uri relative to the
    source folder and keeps it in ``candidates``; before it, a uri is from the source folder
    ('/...', as myst-nb writes its outputs) or the page's.
    """
    found = node.get("candidates", {}).get("*")
    if found:
        return Path(app.srcdir) / found
    uri = node.get("uri", "")
    if uri.startswith("/"):
        return Path(app.srcdir) / uri.lstrip("/")
    return (Path(app.srcdir) / docname).parent / uri


def _alt_from_png(app, doctree) -> None:
    from docutils import nodes

    docname = app.env.docname
    for node in doctree.findall(nodes.image):
        uri = node.get("uri", "")
        if node.get("alt") or not uri.lower().endswith(".png") or "://" in uri:
            continue
        alt = png_description(_image_path(app, docname, node))
        if alt:
            node["alt"] = alt


def setup(app):
    app.connect("doctree-read", _alt_from_png)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
