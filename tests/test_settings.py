"""Settings: every field documented in .env.example, and read from the environment."""

from __future__ import annotations

import os
import re
from pathlib import Path

from task_app.core.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def _documented() -> set[str]:
    text = (ROOT / ".env.example").read_text()
    return set(re.findall(r"^([A-Z_]+)=", text, flags=re.MULTILINE))


def test_every_setting_is_in_env_example() -> None:
    documented = _documented()
    for name, field in Settings.model_fields.items():
        aliases = getattr(field.validation_alias, "choices", None)
        names = {alias for alias in aliases if alias.isupper()} if aliases else {f"TASKAPP_{name.upper()}"}
        assert names & documented, f"{name} is not in .env.example"


def test_env_example_values_parse(tmp_path: Path) -> None:
    settings = Settings(_env_file=ROOT / ".env.example")  # type: ignore[call-arg]
    assert settings.port == 8001
    assert settings.area == (64, 64)
    assert settings.api_keys == []


def test_keys_and_lists_from_environment() -> None:
    os.environ.update(
        ENVIRONMENT_API_KEY="primary-key",
        ENVIRONMENT_API_KEY_ALIASES="alias-one, alias-two",
        TASKAPP_INFERENCE_ALLOWED_HOSTS="127.0.0.1,model.internal",
        TASKAPP_AREA="32,48",
    )
    settings = Settings()
    assert settings.api_keys == ["primary-key", "alias-one", "alias-two"]
    assert settings.inference_allowed_hosts == ["127.0.0.1", "model.internal"]
    assert settings.area == (32, 48)
    assert "primary-key" not in repr(settings)


def test_dev_key_is_a_fallback_name() -> None:
    os.environ["DEV_ENVIRONMENT_API_KEY"] = "dev-key"
    assert Settings().api_keys == ["dev-key"]


def test_every_setting_is_described() -> None:
    """docs/configuration.md's tables are generated from these descriptions (the fields' docstrings)."""
    undescribed = [name for name, field in Settings.model_fields.items() if not (field.description or "").strip()]
    assert undescribed == []
