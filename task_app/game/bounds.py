"""The sizes a world may be configured with, shared by rollouts and env sessions."""

from __future__ import annotations

MIN_AREA_SIDE = 9  # one screen is 9 tiles wide
MAX_AREA_SIDE = 256
MAX_EPISODE_LENGTH = 1_000_000  # env steps; also bounds decisions per episode (each takes at least one step)
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 16, 512  # frame side in pixels


def valid_area(area: tuple[int, int]) -> bool:
    return all(MIN_AREA_SIDE <= side <= MAX_AREA_SIDE for side in area)
