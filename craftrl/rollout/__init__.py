"""Rollout: workers stepping env processes with batched inference, cutting fragments."""
from craftrl.rollout.fragment import Fragment

__all__ = ["Fragment"]
