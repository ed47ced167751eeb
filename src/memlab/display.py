"""How the book's notebooks show tables: a missing value (None, NaN) is written as — (chapter: all).

A table is a pandas DataFrame shown as a cell's last value. Its HTML, the page's table, writes
every missing value as :data:`MISSING` instead of pandas' ``NaN`` or ``None``; its text (the
plain repr a terminal prints) stays pandas' own. :func:`register` installs the HTML formatter in
the running IPython shell; ``import memlab`` calls it, so every notebook that imports memlab
shows its tables so.
"""

from __future__ import annotations

import sys

MISSING = "—"  # an em dash: what a table shows where a value is missing


def frame_html(frame) -> str:
    """A DataFrame's notebook HTML, as pandas writes it, with missing values as — (chapter: all).

    pandas' display options (rows, columns, float format, dimensions) apply as in its own
    ``_repr_html_``.
    """
    import numpy as np
    from pandas import get_option
    from pandas.io.formats import format as fmt

    shown = frame
    for i in range(frame.shape[1]):
        col = frame.iloc[:, i]
        # pandas writes na_rep for a float's NaN only: None, <NA> and NaT print as themselves
        if getattr(col.dtype, "kind", "O") != "f" and col.isna().any():
            if shown is frame:
                shown = frame.copy()
            shown.isetitem(i, col.astype(object).where(col.notna(), np.nan))
    formatter = fmt.DataFrameFormatter(
        shown, na_rep=MISSING, float_format=get_option("display.float_format"), sparsify=None,
        justify=None, index_names=True, header=True, index=True, bold_rows=True, escape=True,
        max_rows=get_option("display.max_rows"), min_rows=get_option("display.min_rows"),
        max_cols=get_option("display.max_columns"),
        show_dimensions=get_option("display.show_dimensions"), decimal=".")
    return fmt.DataFrameRenderer(formatter).to_html(notebook=True)


def register() -> bool:
    """Show DataFrames in the running IPython shell with :func:`frame_html` (chapter: all).

    A no-op outside IPython; pandas is not imported (the formatter is registered by the type's
    name). True when registered.
    """
    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    formatters = getattr(getattr(shell, "display_formatter", None), "formatters", {})
    html = formatters.get("text/html")
    if html is None:
        return False
    for module in ("pandas", "pandas.core.frame"):  # DataFrame.__module__: pandas 3, earlier
        html.for_type_by_name(module, "DataFrame", _frame_html_or_none)
    return True


def _frame_html_or_none(frame) -> str | None:
    from pandas import get_option

    if not get_option("display.notebook_repr_html") or frame._info_repr():
        return frame._repr_html_()  # pandas' own for what it shows another way
    return frame_html(frame)
