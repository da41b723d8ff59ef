"""Policies: the LLM ReAct policy, the scripted baseline, and what the engine needs from both."""

from .base import HistoryEntry, LMCall, Policy, PolicyDecision, PolicyError

__all__ = ["HistoryEntry", "LMCall", "Policy", "PolicyDecision", "PolicyError"]
