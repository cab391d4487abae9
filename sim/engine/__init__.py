"""The simulation engine: a SimPy model of GPUs, model instances and their requests.

Every module here is compiled with mypyc in regular (non-editable) installs
(see ``setup.py``); the annotations are therefore checked at run time there,
and must be exact.
"""


def build() -> str:
    """``compiled`` when this engine runs as mypyc extensions, ``pure-python`` otherwise."""
    from sim.engine import gpu

    return "compiled" if not gpu.__file__.endswith(".py") else "pure-python"
