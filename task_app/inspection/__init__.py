"""Looking back at rollouts: deterministic replay, the episode viewer, the eval report, episode scores."""
