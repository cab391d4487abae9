"""Scheduler policies: they decide, the engine does and charges.

Built-ins register themselves by name; users load their own with
``--policy path/to/file.py:ClassName`` or a ``mmsim.policies`` entry point.
"""

from sim.policies.base import Policy
from sim.policies.registry import get_policy_class, policy_descriptions, register

__all__ = ["Policy", "get_policy_class", "policy_descriptions", "register"]
