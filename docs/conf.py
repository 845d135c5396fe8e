"""Sphinx configuration of the course website (built by `bash scripts/build_site.sh`).

The sources are staged by docs/stage_site.py: README.md as the front page, then the notebooks
with their stored outputs (never re-executed), then the solutions. The site builds offline:
MathJax comes from the npm package in docs/node_modules (installed by scripts/setup_env.sh) and
is copied into the site, the theme bundles its own fonts, and remote images (the Colab badge)
are replaced by their text, so a page loads nothing from outside its own server.
"""

import shutil
import sys
from pathlib import Path

from docutils import nodes
from sphinx.transforms import SphinxTransform

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))
from stage_site import repository_url  # noqa: E402

MATHJAX = DOCS / "node_modules" / "mathjax" / "es5"
if not (MATHJAX / "tex-chtml.js").is_file():
    raise RuntimeError(f"{MATHJAX} is missing: run `bash scripts/setup_env.sh` (it runs `npm ci` in docs/)")

project = "The Transformer, from scratch and proven"
author = "The transformer-course authors"
copyright = "the transformer-course authors, MIT license"

extensions = ["myst_nb", "sphinx.ext.githubpages"]
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

# Notebooks are shown with the outputs committed with them; the site never runs them.
nb_execution_mode = "off"
# A progress bar's widget needs the widget JavaScript from a CDN: show its text fallback instead.
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
nb_ipywidgets_js = {}

myst_enable_extensions = ["dollarmath", "amsmath"]
# `$$...$$` written inside a list item or a paragraph is display math too.
myst_dmath_double_inline = True
# Links to `#a-heading` and `NN_x.ipynb#a-heading` resolve to the headings' anchors.
myst_heading_anchors = 4

# MathJax 3 from the site itself (relative paths are relative to _static/), not from a CDN.
mathjax_path = "mathjax/tex-chtml.js"

html_theme = "sphinx_book_theme"
html_title = project
# Layout for phones and laptops (wrapping, scrolling boxes, wide tables as cards, the header's
# "Back to top") and the full-size figure viewer; tests/test_site.py checks both at 390 px and 1366 px.
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_js_files = ["course.js"]
html_theme_options = {
    "repository_url": repository_url(),
    # The theme's button floats over the text; ours sits in the header bar (_templates/back-to-top.html).
    "back_to_top_button": False,
    "article_header_start": ["toggle-primary-sidebar.html", "back-to-top.html"],
    "use_repository_button": True,
    # The search field is in the sidebar already; no second one in a header bar.
    "navbar_persistent": [],
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
}
# The theme logs a console error when no default colour mode is set.
html_context = {"default_mode": "light"}
html_show_sourcelink = False
html_copy_source = False


class DropRemoteImages(SphinxTransform):
    """Replace images that live on other sites (the Colab badge) by their alt text.

    The site must load nothing from outside; the link around the badge stays.
    """

    default_priority = 400

    def apply(self, **kwargs):
        for image in list(self.document.findall(nodes.image)):
            uri = image.get("uri", "")
            if uri.startswith(("http://", "https://", "//")):
                image.replace_self(nodes.Text(image.get("alt") or "image"))


def copy_mathjax(app, exception):
    """Copy the MathJax component files the site loads into _static/mathjax/."""
    if exception is not None or app.builder.format != "html":
        return
    dest = Path(app.outdir) / "_static" / "mathjax"
    # The other combined components (tex-svg.js, tex-mml-chtml.js, ...) are never loaded.
    unused = [p.name for p in MATHJAX.glob("*.js") if p.name not in ("tex-chtml.js", "startup.js")]
    shutil.copytree(MATHJAX, dest, dirs_exist_ok=True, ignore=lambda d, names: unused if d == str(MATHJAX) else [])


def setup(app):
    app.add_transform(DropRemoteImages)
    app.connect("build-finished", copy_mathjax)
