"""Workloads: the native trace format, importers of public traces, generators, statistics."""
