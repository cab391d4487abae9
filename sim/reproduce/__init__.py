"""Reproductions of published experiments in the simulator (``mmsim reproduce``).

:mod:`~sim.reproduce.experiments` runs the paper's preemption and offload experiments
through :func:`sim.simulation.simulate` with the policies of :mod:`~sim.reproduce.policies`;
:mod:`~sim.reproduce.compare` sets the results against the published numbers and the
fidelity targets; :mod:`~sim.reproduce.report` and :mod:`~sim.reproduce.html` present them.
"""
