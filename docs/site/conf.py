"""Sphinx configuration of the site: ``docs/site/README.md`` says how to build it.

The source directory is the repository itself (``include_patterns`` picks the pages: the
guides ``docs/*.md``, the notebooks, the experiments' and the benchmarks' READMEs, and this
folder), so that every Markdown link between them works on the site as on GitHub.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).parent / "_ext")]
# the executed notebooks read this checkout's library, as the generated pages do
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                         os.environ.get("PYTHONPATH")]))

project = "numpy_transformer"
author = "the numpy_transformer authors"
copyright = "the numpy_transformer authors"
root_doc = "docs/site/index"
extensions = ["myst_nb", "numpydoc", "sphinx.ext.autodoc", "sphinx.ext.mathjax",
              "sphinx-mathjax-offline", "book"]
include_patterns = ["README.md", "docs/site/**", "docs/*.md", "docs/notebooks/*.md",
                    "docs/notebooks/*.ipynb", "docs/notebooks/solutions/*.ipynb",
                    "experiments/README.md", "benchmarks/README.md"]
exclude_patterns = [".*", "**/.*", "docs/_build", "runs", "build", "dist", "**/__pycache__",
                    "docs/site/_ext", "docs/site/checks", "docs/site/README.md"]

html_theme = "pydata_sphinx_theme"
html_title = "numpy_transformer"
html_static_path = ["_static"]
html_css_files = ["book.css"]
html_extra_path = ["_extra"]  # index.html at the top of the site: the way in
html_theme_options = {"secondary_sidebar_items": {"docs/site/_generated/functional/*": []},
                      "show_toc_level": 2}
html_sidebars = {"docs/site/_generated/functional/*": [], "docs/site/pictures": []}

# myst-nb: the solution notebooks run at every build; the exercises are shown as they are
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 600
nb_execution_excludepatterns = ["docs/notebooks/0*.ipynb"]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

autodoc_default_options = {"member-order": "bysource"}
autodoc_mock_imports = ["torch"]
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
