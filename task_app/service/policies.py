"""Build the policy a rollout plan names; one inference client per process serves every rollout."""

from __future__ import annotations

from ..core.outbound import Outbound
from ..core.settings import Settings
from ..policy.base import Policy
from ..policy.inference import InferenceClient, InferenceLimits
from ..policy.react import build_react_policy
from ..policy.scripted import ScriptedPolicy
from ..rollout.plan import SCRIPTED, RolloutPlan


class PolicyFactoryBuilder:
    def __init__(self, settings: Settings, http: Outbound) -> None:
        self.settings = settings
        self.client = InferenceClient(http, InferenceLimits.from_settings(settings))

    def build(self, plan: RolloutPlan, deadline: float) -> Policy:
        if plan.policy_name == SCRIPTED:
            return ScriptedPolicy(max_actions=plan.max_actions, seed=plan.seed)
        return build_react_policy(
            plan.policy,
            run_id=plan.run_id,
            max_actions=plan.max_actions,
            max_time_s=plan.max_time_s,
            client=self.client,
            settings=self.settings,
            deadline=deadline,
        )
