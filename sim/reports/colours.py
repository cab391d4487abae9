"""Fixed colours: one per built-in policy in every report and plot; user policies take the next free one."""

from __future__ import annotations

BUILTIN_POLICY_COLOURS = {"static": "#64748b", "fcfs-swap": "#dc2626", "time-slice": "#d97706",
                          "swap-aware": "#2563eb", "offload-aware": "#059669", "slo-aware": "#7c3aed",
                          "prefix-swap-aware": "#0d9488"}
"""One colour per built-in policy, the same in every report and plot."""
EXTRA_POLICY_COLOURS = ("#111827", "#c026d3", "#65a30d", "#78350f", "#0891b2", "#db2777", "#4f46e5", "#be123c")
"""Colours for user policies, handed out in order of appearance: the first few far from every built-in's (the
first was a pink beside fcfs-swap's red)."""
MODEL_COLOURS = ("#60a5fa", "#f472b6", "#34d399", "#fbbf24", "#a78bfa", "#fb923c", "#22d3ee", "#a3e635", "#94a3b8",
                 "#f87171")


def colour_map(names: list[str], palette: tuple[str, ...]) -> dict[str, str]:
    """A fixed colour per name, in order, cycling through the palette."""
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def policy_colours(names: list[str]) -> dict[str, str]:
    """Each built-in policy's own colour; other policies take the next free extra colour (cycling if many)."""
    colours = {name: BUILTIN_POLICY_COLOURS[name] for name in names if name in BUILTIN_POLICY_COLOURS}
    others = [name for name in names if name not in BUILTIN_POLICY_COLOURS]
    colours.update(colour_map(others, EXTRA_POLICY_COLOURS))
    return {name: colours[name] for name in names}
