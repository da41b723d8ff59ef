"""The application the routes call: a rollout from request to response bytes, the policies, the taskset."""
