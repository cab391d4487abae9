"""Elastic fleets: node pools of several GPU types, cold starts, autoscalers and what the GPUs cost."""
