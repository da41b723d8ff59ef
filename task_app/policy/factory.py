"""Build the policy a rollout plan names; one inference client per process serves every rollout."""

from __future__ import annotations

import aiohttp

from ..rollout.plan import SCRIPTED, RolloutPlan
from ..settings import Settings
from .base import Policy
from .inference import InferenceClient, InferenceLimits
from .react import build_react_policy
from .scripted import ScriptedPolicy


class PolicyFactoryBuilder:
    def __init__(self, settings: Settings, session: aiohttp.ClientSession) -> None:
        self.settings = settings
        self.client = InferenceClient(session, InferenceLimits.from_settings(settings))

    def build(self, plan: RolloutPlan, deadline: float) -> Policy:
        if plan.policy_name == SCRIPTED:
            return ScriptedPolicy(max_actions=plan.max_actions, seed=plan.seed)
        return build_react_policy(plan, client=self.client, settings=self.settings, deadline=deadline)
