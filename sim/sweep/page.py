"""Pieces of the sweep and Pareto pages: self-contained HTML (figures inline as SVG, no script, nothing fetched)."""

from __future__ import annotations

import html
import io
import math

STYLE = ("body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;font-size:0.85em}"
         "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}svg{max-width:100%;height:auto}"
         ".wide{overflow-x:auto}")


def pyplot():
    """matplotlib's pyplot on the file-only backend (no display on a server or in CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_svg(figure) -> str:
    """The figure as inline SVG, closed afterwards."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})  # no timestamp: same data, same page
    pyplot().close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def table(columns: list[str], rows: list[list[str]]) -> str:
    """An HTML table; cells are HTML already (escape text before). A table wider than the page scrolls in its own
    box, not the whole page."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def num(value, spec: str = ".3f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def document(title: str, body: str) -> str:
    """A whole page."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head>
<body><h1>{html.escape(title)}</h1>
{body}
</body></html>
"""
