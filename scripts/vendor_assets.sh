#!/usr/bin/env bash
# Vendor the browser-side JavaScript the built book needs, so the published HTML
# loads nothing from a CDN. Files land in _vendor/_static/vendor/ and end up in
# _build/html/_static/vendor/ (html_extra_path: ["_vendor"] in _config.yml):
#
#   MathJax 3     -> vendor/mathjax/          (tex-chtml.js, its CHTML woff2 fonts,
#                                              and the TeX extensions it autoloads)
#   RequireJS     -> vendor/requirejs/        (AMD loader the widget manager needs)
#   html-manager  -> vendor/jupyter-widgets/  (embed-amd.js: renders saved ipywidgets)
#
# and one file the tests need, which is not published with the book:
#
#   axe-core      -> tests/_vendor/axe-core/  (axe.min.js: the accessibility rules the
#                                              browser tests run on the built pages)
#
# Why not _static/: Jupyter Book adds a <script> tag for every *.js file under
# html_static_path to every page, which would load all of the above everywhere.
# html_extra_path is copied verbatim and not scanned.
#
# The output is committed; rerun this script only to change a version.
# Needs node/npm (packages come from the npm registry via `npm pack`).
#
# Usage: scripts/vendor_assets.sh            (from anywhere in the repository)
set -euo pipefail

MATHJAX_VERSION="3.2.2"
REQUIREJS_VERSION="2.3.8"
# html-manager 1.x renders the widget state written by ipywidgets 8.
HTML_MANAGER_VERSION="1.0.15"
AXE_VERSION="4.14.1"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/_vendor/_static/vendor"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

fetch() {  # fetch <npm spec> <dir name>: unpack the package tarball into $TMP/<dir name>
    local spec="$1" name="$2" tgz
    tgz="$(cd "$TMP" && npm pack --silent "$spec" 2>/dev/null | tail -n 1)"
    mkdir -p "$TMP/$name"
    tar -xzf "$TMP/$tgz" -C "$TMP/$name" --strip-components=1
}

fetch "mathjax@$MATHJAX_VERSION" mathjax
fetch "requirejs@$REQUIREJS_VERSION" requirejs
fetch "@jupyter-widgets/html-manager@$HTML_MANAGER_VERSION" html-manager
fetch "axe-core@$AXE_VERSION" axe-core

rm -rf "$DEST/mathjax" "$DEST/requirejs" "$DEST/jupyter-widgets"
mkdir -p "$DEST/mathjax/output/chtml/fonts" "$DEST/mathjax/input/tex" \
    "$DEST/requirejs" "$DEST/jupyter-widgets"

# MathJax: the combined component, the woff2 fonts CHTML output asks for (relative to
# tex-chtml.js), and the TeX extensions `autoload` fetches on first use (\boldsymbol, \cancel...).
cp "$TMP/mathjax/es5/tex-chtml.js" "$DEST/mathjax/"
cp -r "$TMP/mathjax/es5/output/chtml/fonts/woff-v2" "$DEST/mathjax/output/chtml/fonts/"
cp -r "$TMP/mathjax/es5/input/tex/extensions" "$DEST/mathjax/input/tex/"
cp "$TMP/mathjax/LICENSE" "$DEST/mathjax/LICENSE"

# RequireJS: the single-file loader (MIT, licence header inside the file).
cp "$TMP/requirejs/require.js" "$DEST/requirejs/"

# html-manager: the AMD embed bundle (bundles @jupyter-widgets/base, controls and output,
# and renders every widget-view script on the page once loaded), plus the woff2 icon fonts
# its CSS asks for. It looks for them next to its AMD module URL, which
# _vendor/_static/widgets-offline.js points at this folder.
cp "$TMP/html-manager/dist/embed-amd.js" "$DEST/jupyter-widgets/"
cp "$TMP/html-manager/dist/"*.woff2 "$DEST/jupyter-widgets/"
cp "$TMP/html-manager/dist/embed.js.LICENSE.txt" "$DEST/jupyter-widgets/LICENSE.txt"

cat > "$DEST/VERSIONS.txt" <<EOF
Vendored by scripts/vendor_assets.sh from the npm registry.
mathjax@$MATHJAX_VERSION                       Apache-2.0   mathjax/
requirejs@$REQUIREJS_VERSION                     MIT          requirejs/
@jupyter-widgets/html-manager@$HTML_MANAGER_VERSION BSD-3-Clause jupyter-widgets/
EOF

# axe-core: the minified bundle and its licence (MPL-2.0), for tests/test_a11y.py only.
AXE_DEST="$ROOT/tests/_vendor/axe-core"
rm -rf "$AXE_DEST"
mkdir -p "$AXE_DEST"
cp "$TMP/axe-core/axe.min.js" "$TMP/axe-core/LICENSE" "$AXE_DEST/"
echo "axe-core@$AXE_VERSION from the npm registry (scripts/vendor_assets.sh), MPL-2.0" \
    > "$AXE_DEST/VERSION.txt"

du -sh "$DEST" "$AXE_DEST"
