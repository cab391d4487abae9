"""``python -m sim.cli``: the ``mmsim`` command (for ``python -X importtime -m sim.cli run ...`` and the like)."""

from sim.cli import main

main()
