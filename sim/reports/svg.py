"""Matplotlib figures as inline SVG: text kept as text, ids made unique per figure, metadata dropped."""

from __future__ import annotations

import io
import itertools
import re
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

STYLE: dict[RcKeyType, Any] = {
    "svg.fonttype": "none",          # real text: smaller files, selectable, crisp at any zoom
    "svg.hashsalt": "mmsim",         # stable ids, so the same runs give the same file
    "path.simplify": True,
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],  # bundled with matplotlib, so text metrics match everywhere
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e5e7eb",
    "grid.linewidth": 0.6,
    "axes.edgecolor": "#9ca3af",
    "axes.labelcolor": "#374151",
    "xtick.color": "#4b5563",
    "ytick.color": "#4b5563",
    "legend.frameon": False,
}

_counter = itertools.count()


def figure(width: float, height: float, rows: int = 1, cols: int = 1, **kwargs):
    """A figure and its axes, drawn in the report's style."""
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(rows, cols, figsize=(width, height), squeeze=False, **kwargs)
    return fig, axes


def to_svg(fig) -> str:
    """The figure as an ``<svg>`` element ready to inline in HTML, then closed to free its memory."""
    buffer = io.StringIO()
    with plt.rc_context(STYLE):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    # Several figures share one page: prefix every id so references cannot collide.
    prefix = f"f{next(_counter)}-"
    text = re.sub(r'\bid="', f'id="{prefix}', text)
    text = text.replace('href="#', f'href="#{prefix}').replace("url(#", f"url(#{prefix}")
    # Let CSS size the figure to its container while the viewBox keeps proportions.
    # Its natural width caps it, so text never grows past the 9 pt it was drawn at.
    text = re.sub(r'<svg([^>]*?) width="([^"]*)" height="[^"]*"', r'<svg\1 class="plot" role="img" style="max-width:\2"',
                  text, count=1)
    return text.strip()
