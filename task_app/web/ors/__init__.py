"""The Open Reward Standard door: a second ASGI app on the main app's state (`create_ors_app`)."""

from .app import create_ors_app

__all__ = ["create_ors_app"]
