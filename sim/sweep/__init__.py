"""Sweeps and capacity planning: many independent runs of one base scenario, on a process pool or Ray."""
