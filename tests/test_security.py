"""Security properties, end to end where they can be: constant-time key comparison, the suite-wide
log guard, the model-host allow-list against SSRF (and no redirects), CORS off unless configured
(never `*` with credentials), and safe SFT file names from odd-but-valid run ids.
"""

from __future__ import annotations

import ast
import hmac
import inspect
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.errors import error_body
from support.fake_model import FakeModel, tool_call
from support.keys import ALIAS_KEY, KEY_GUARD, TEST_KEY, KeyGuard, guarded_handle
from support.rollouts import request_body
from support.servers import AppServer

from task_app.web import auth

pytestmark = pytest.mark.usefixtures("no_key_in_logs")


# --- constant-time key comparison -------------------------------------------------------------------

_SECRET_NAMES = re.compile(r"key|token|candidate|presented|accepted|secret", re.IGNORECASE)


def test_auth_compares_keys_only_with_compare_digest() -> None:
    """No `==`, `!=` or `in` on anything key-like in auth.py: those stop at the first differing byte."""
    tree = ast.parse(inspect.getsource(auth))
    offending = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
            isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn | ast.Is | ast.IsNot) for op in node.ops
        ):
            names = {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)}
            if any(_SECRET_NAMES.search(name) for name in names):
                offending.append(ast.unparse(node))
    assert not offending, offending
    calls = [ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert "hmac.compare_digest" in calls


@pytest.mark.e2e
def test_every_presented_key_is_compared_with_every_accepted_key_on_a_real_server(
    app_server: AppServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All pairs, with compare_digest, even after a match: the time does not say which key matched."""
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # the server runs in this process
    client = app_server.client(key=None, headers={"X-API-Keys": f"{TEST_KEY}, not-a-key, also-not"})
    assert client.get("/info").status_code == 200
    assert len(compared) == 3 * 2  # three presented keys, two accepted (primary + alias)
    assert {pair[1] for pair in compared} == {TEST_KEY.encode(), ALIAS_KEY.encode()}
    compared.clear()
    assert app_server.client(key="wrong-key").get("/info").status_code == 401
    assert len(compared) == 2


# --- the suite-wide log guard ----------------------------------------------------------------------


def test_every_log_record_of_the_session_passes_the_key_guard() -> None:
    assert logging.Logger.handle is guarded_handle
    before = KEY_GUARD.checked
    logging.getLogger("task_app.security_probe").debug("a debug line from %s", "the app")
    logging.getLogger("uvicorn.error").warning("a line from a logger that does not propagate to root")
    assert KEY_GUARD.checked == before + 2
    assert logging.getLogger("task_app").getEffectiveLevel() == logging.DEBUG


def test_the_key_guard_finds_a_piece_of_a_key_anywhere_in_a_record() -> None:
    secret = "zz-PqRsTuVwXy"  # not a configured key: the session's own guard must stay clean
    guard = KeyGuard((secret,))
    clean = logging.makeLogRecord({"msg": "rollout %s finished", "args": ("run-1",), "run_id": "run-1"})
    guard.check(clean)
    in_args = logging.makeLogRecord({"msg": "calling %s", "args": (f"http://h/?k={secret[3:8]}",)})
    in_extra = logging.makeLogRecord({"msg": "ok", "headers": {"authorization": f"Bearer {secret}"}})
    try:
        raise ValueError(f"bad key {secret[-5:]}")
    except ValueError:
        in_exception = logging.makeLogRecord({"msg": "failed", "exc_info": sys.exc_info()})
    for record in (in_args, in_extra, in_exception):
        guard.check(record)
    assert guard.checked == 4 and len(guard.leaks) == 3


# --- SSRF: the model-host allow-list and redirects --------------------------------------------------


@pytest.fixture
def guarded(make_app_server: Callable[..., AppServer]) -> AppServer:
    return make_app_server(inference_allowed_hosts=["127.0.0.1"], warm_up=False)


@pytest.mark.e2e
def test_allowed_model_host_is_served(guarded: AppServer, fake_model: FakeModel) -> None:
    response = guarded.client().post("/rollout", json=request_body(inference_url=fake_model.url()))
    assert response.status_code == 200 and response.json()["metrics"]["details"]["stop_reason"] == "completed"
    upper = fake_model.url().replace("http://", "HTTP://")  # scheme and host compare case-insensitively
    assert guarded.client().post("/rollout", json=request_body(inference_url=upper)).status_code == 200


@pytest.mark.e2e
@pytest.mark.parametrize(
    "host",
    [
        "localhost",  # same machine, other name: only the listed names pass
        "169.254.169.254",  # cloud metadata
        "[::1]",
        "[::ffff:127.0.0.1]",
        "127.0.0.2",
        "127.0.0.1.nip.io",
        "0x7f.0.0.1",
        "2130706433",
    ],
)
def test_hosts_outside_the_allow_list_are_refused_before_any_call(
    guarded: AppServer, fake_model: FakeModel, host: str
) -> None:
    url = f"http://{host}:{fake_model.port}/v1"
    response = guarded.client().post("/rollout", json=request_body(inference_url=url))
    error_body(response, 422, "inference_host_not_allowed")
    assert fake_model.requests == []
    assert guarded.health()["rollouts"]["active"] == 0


@pytest.mark.e2e
def test_a_redirect_from_the_model_server_is_not_followed(app_server: AppServer, fake_model: FakeModel) -> None:
    """A model server cannot bounce the app to another host (e.g. cloud metadata) with a redirect.

    Were it followed, the suite's loopback guard would also fail this test.
    """

    async def redirect(ex: Any) -> None:
        headers = [(b"location", b"http://169.254.169.254/latest/meta-data/"), (b"content-length", b"0")]
        await ex.send({"type": "http.response.start", "status": 307, "headers": headers})
        await ex.send({"type": "http.response.body", "body": b""})

    fake_model.default = redirect
    response = app_server.client().post("/rollout", json=request_body(inference_url=fake_model.url()))
    details = response.json()["metrics"]["details"]
    assert details["stop_reason"] == "policy_error"
    assert details["error"]["code"] == "inference_http_error" and details["error"]["status"] == 307
    assert len(fake_model.requests) == 1


# --- CORS ------------------------------------------------------------------------------------------

ORIGIN = "https://trainer.example"
PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x-api-key"}


def _cors_headers(response: httpx.Response) -> dict[str, str]:
    return {name: value for name, value in response.headers.items() if name.lower().startswith("access-control-")}


@pytest.mark.e2e
def test_cors_is_off_by_default(app_server: AppServer) -> None:
    client = app_server.client()
    assert _cors_headers(client.get("/info", headers={"Origin": ORIGIN})) == {}
    assert _cors_headers(client.get("/health", headers={"Origin": ORIGIN})) == {}
    preflight = client.options("/rollout", headers=PREFLIGHT)
    assert preflight.status_code == 405 and _cors_headers(preflight) == {}


@pytest.mark.e2e
def test_cors_for_a_configured_origin_only_and_never_with_credentials(
    make_app_server: Callable[..., AppServer],
) -> None:
    server = make_app_server(cors_origins=[ORIGIN], warm_up=False)
    client = server.client()
    allowed = client.get("/info", headers={"Origin": ORIGIN})
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    assert "access-control-allow-credentials" not in allowed.headers
    preflight = client.options("/rollout", headers=PREFLIGHT)
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "access-control-allow-credentials" not in preflight.headers
    other = client.get("/info", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    assert server.client(key=None).get("/info", headers={"Origin": ORIGIN}).status_code == 401  # CORS is not auth


@pytest.mark.e2e
def test_a_wildcard_origin_never_comes_with_credentials(make_app_server: Callable[..., AppServer]) -> None:
    server = make_app_server(cors_origins=["*"], warm_up=False)
    response = server.client().get("/info", headers={"Origin": ORIGIN, "Cookie": "session=1"})
    assert response.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in response.headers
    preflight = server.client().options("/rollout", headers=PREFLIGHT)
    assert "access-control-allow-credentials" not in preflight.headers


# --- SFT file names --------------------------------------------------------------------------------

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.jsonl$")


@pytest.mark.e2e
@pytest.mark.parametrize(
    "run_id",
    [".hidden", "-rf", "a:b:c", "CON", "nul.txt", "x" * 200, "run.jsonl", ":.", "._-"],
    ids=["dot-file", "dash", "colons", "windows-device", "extension", "200-chars", "jsonl", "colon-dot", "punct"],
)
def test_sft_files_from_odd_run_ids_stay_inside_their_directory(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel, tmp_path: Path, run_id: str
) -> None:
    sft = tmp_path / "sft"
    server = make_app_server(sft_output_dir=sft, warm_up=False)
    fake_model.default = tool_call("noop")
    response = server.client().post("/rollout", json=request_body(inference_url=fake_model.url(), run_id=run_id))
    assert response.status_code == 200, response.text
    written = response.json()["metrics"]["details"]["storage"]["sft"]
    assert written["written"] is True
    (path,) = sft.iterdir()
    assert path.name == written["file"] and SAFE_NAME.match(path.name), path.name
    assert path.resolve().parent == sft.resolve() and len(path.name) < 120


@pytest.mark.e2e
@pytest.mark.parametrize("run_id", ["../escape", "..", "a/../../b", "/etc/passwd", "C:\\x", "a\x00b", "~root"])
def test_hostile_run_ids_are_refused_and_write_nothing(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel, tmp_path: Path, run_id: str
) -> None:
    sft = tmp_path / "sft"
    server = make_app_server(sft_output_dir=sft, warm_up=False)
    response = server.client().post("/rollout", json=request_body(inference_url=fake_model.url(), run_id=run_id))
    error_body(response, 422, "invalid_request")
    assert list(sft.iterdir()) == [] and fake_model.requests == []
