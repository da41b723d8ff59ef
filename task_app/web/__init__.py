"""The HTTP layer: the FastAPI app and its lifespan, auth, limits, error handlers and routes."""
