"""One rollout, HTTP-free: the plan, the ops loop, step rewards, the result and the run registry."""
