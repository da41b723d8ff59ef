"""HTML pages the app writes (episode viewer, eval report): their embedded data and outside references."""

from __future__ import annotations

import json
import re
from typing import Any

# a reference to anything outside the page: the viewer and the report must be self-contained
EXTERNAL = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//|@import|url\(\s*["']?(?:https?:)?//|<link""")


def page_data(page: str) -> dict[str, Any]:
    """The episode data a viewer page embeds."""
    match = re.search(r'<script type="application/json" id="episode-data">(.*?)</script>', page, re.DOTALL)
    assert match is not None
    data: dict[str, Any] = json.loads(match.group(1))
    return data
