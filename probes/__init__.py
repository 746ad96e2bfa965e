"""Chaos Toolkit activities (probes, actions, controls) for canary game days."""
