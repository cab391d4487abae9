"""mmsim: a discrete-event simulator of multi-model LLM serving on shared GPUs.

Importing ``sim`` never imports torch; only :mod:`calibrate` does.
"""

__version__ = "0.1.0"
