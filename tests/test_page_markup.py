"""The built pages' markup fixes (``_ext/memlab_pages.py``), on snippets: no book build needed."""

from __future__ import annotations

import runpy
from pathlib import Path

EXT = Path(__file__).resolve().parents[1] / "_ext" / "memlab_pages.py"


def _fix(html: str) -> str:
    return runpy.run_path(str(EXT))["accessible_html"](html)


def test_empty_header_cells_become_data_cells_and_cells_are_marked():
    fix = _fix
    html = ('<table><thead><tr><th></th><th>bytes</th></tr><tr><th>name</th><th>&nbsp;</th></tr>'
            '</thead><tbody><tr><th>fp16</th><td>1,234.5 GiB</td><td>' + "a sentence " * 8
            + '</td><td class="x">-3e-05</td><td>True</td></tr></tbody></table>')
    out = fix(html)
    assert "<th></th>" not in out and "<th>&nbsp;</th>" not in out and out.count("<td></td>") == 2
    assert '<th class="memlab-num">fp16</th>' in out
    assert '<td class="memlab-num">1,234.5 GiB</td>' in out
    assert '<td class="memlab-num x">-3e-05</td>' in out
    assert '<td class="memlab-prose">a sentence' in out and "<td>True</td>" in out
    assert fix(out) == out  # applying it twice changes nothing


def test_the_theme_s_controls_are_named_by_what_they_show():
    fix = _fix
    search = ('<button class="btn search-button-field search-button__button pst-js-only" '
              'title="Search" aria-label="Search" data-bs-placement="bottom">')
    assert "aria-label" not in fix(search) and 'title="Search"' in fix(search)
    icon = '<i class="theme-switch fa-solid fa-sun fa-lg" data-mode="light" title="Light"></i>'
    assert fix(icon) == ('<i class="theme-switch fa-solid fa-sun fa-lg" data-mode="light" '
                         'aria-hidden="true"></i>')
    logo = '<div class="sidebar-primary-item">\n\n<a class="navbar-brand logo" href="intro.html">'
    assert 'role="navigation" aria-label="Book"' in fix(logo)
