"""The HTML section of a ``validate vllm`` result: the error table, a per-request scatter of simulated vs real
E2E, and CDFs of both, per load level (self-contained: figures are inline SVG)."""

from __future__ import annotations

import html
import io

import numpy as np

from calibrate.vllm_validate import METRICS, error_text, spread_text


def _figure_svg(level: dict) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    per = level["per_request"]
    real, simulated = np.asarray(per["real_e2e_s"]), np.asarray(per["simulated_e2e_s"])
    figure, (scatter, cdf) = plt.subplots(1, 2, figsize=(9, 3.6))
    top = float(max(real.max(), simulated.max())) * 1.05
    scatter.scatter(real, simulated, s=10)
    scatter.plot([0, top], [0, top], color="grey", linewidth=0.8)
    scatter.set(xlabel="real E2E (s)", ylabel="simulated E2E (s)", title="per request", xlim=(0, top), ylim=(0, top))
    for values, label in ((real, "real"), (simulated, "simulated")):
        ordered = np.sort(values)
        cdf.step(ordered, np.arange(1, len(ordered) + 1) / len(ordered), where="post", label=label)
    cdf.set(xlabel="E2E (s)", ylabel="share of requests", title="E2E CDF")
    cdf.legend()
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    plt.close(figure)
    svg = buffer.getvalue()
    return svg[svg.index("<svg"):]


def _allocator_line(result: dict) -> str:
    """Which malloc the replay's engine and the profile's calibration ran on (results before it was recorded: none)."""
    if "allocator" not in result:
        return ""
    calibrated = result.get("profile_allocator") or "not recorded"
    warning = " <strong>They differ: the steps differ by the allocator too.</strong>" if calibrated not in (
        "not recorded", result["allocator"]) else ""
    return (f"<p>Allocator: the replay ran on {html.escape(result['allocator'])}, the profile was calibrated on "
            f"{html.escape(calibrated)}.{warning}</p>")


def section(result: dict) -> str:
    """The validation as an HTML fragment (a ``<section>``)."""
    parts = [f"<section id='vllm-validation'><h2>mmsim vs {html.escape(result['engine'])}: "
             f"{html.escape(result['model'])} ({html.escape(result['dtype'])})</h2>"
             f"<p>Before the replay the engine ran {result['engine_drift_pct']:+.1f}% against the profile's prices "
             "of the same steps (machine noise since calibration).</p>" + _allocator_line(result)]
    for level in result["levels"]:
        matched = level.get("errors_at_replay_speed_pct") or {}
        kinds = level.get("steps_vs_profile_by_kind_pct") or {}
        spread = level.get("replay_spread_pct") if level.get("replays", 1) > 1 else None
        rows = "".join(f"<tr><td>{name}</td><td>{level['real'][name]:.4g}</td><td>{level['simulated'][name]:.4g}</td>"
                       f"<td>{error_text(level['errors_pct'][name])}</td><td>{error_text(matched.get(name))}</td>"
                       + (f"<td>{spread_text(spread[name])}</td>" if spread else "") + "</tr>"
                       for name in METRICS)
        spread_header = f"<th>{level['replays']} replays apart</th>" if spread else ""
        parts.append(f"<h3>load {level['load']:g} ({level['requests']} requests)</h3>"
                     f"<p>The replay's steps took {level['steps_vs_profile_pct']:+.1f}% against the profile's prices of "
                     f"them (decode-only {error_text(kinds.get('decode'))}, with prefills "
                     f"{error_text(kinds.get('prefill'))}); the engine was off the CPU (other processes) for {level['steps_off_cpu_pct']:.1f}% of "
                     f"their time. The last column is the error with the simulator's decode work priced "
                     f"x{level['replay_speed']['decode']:.3f} and its prefill work x{level['replay_speed']['prefill']:.3f}, "
                     "as the replay ran them (the machine's drift since calibration taken out).</p><table><tr><th>metric</th>"
                     f"<th>real</th><th>simulated</th><th>error</th><th>at replay speed</th>{spread_header}</tr>"
                     f"{rows}</table>"
                     f"{_figure_svg(level)}")
    parts.append("</section>")
    return "".join(parts)


def write_html(result: dict) -> str:
    """A whole page holding :func:`section`."""
    return ("<!doctype html><html><head><meta charset='utf-8'><title>mmsim vs vLLM</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            f"padding:2px 8px;text-align:right}}</style></head><body>{section(result)}</body></html>")
