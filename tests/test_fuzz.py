"""Schemathesis against the app's own OpenAPI schema, every operation, on a real server.

Each generated request is sent twice: with the API key, where schemathesis checks that no answer is
a 5xx and that status, content type, headers and body are all the ones the schema declares (error
bodies included: `task_app/routes/openapi.py`), that schema-violating data is refused, and that
undeclared methods get 405 with a correct `Allow`; and without a key, where every protected
operation must answer 401 and every public one must still answer. No answer carries a piece of a key.

Not checked, by design:
- "positive data acceptance" (a schema-valid body is accepted): the schema cannot say everything the
  app validates (an unknown env_name, a crafter-react policy without a model, a proxy call without
  messages are 4xx on purpose), so the check would only restate those rules as failures;
- "negative data rejection" (a schema-violating body is refused): request models coerce types the
  way the seed system's pydantic models did (`"return_trace": 0` is false, `"seed": "7"` is 7), so
  trainers built against it keep working; the bodies that must be refused are `test_bad_input.py`'s.

Bounded for CI: `FUZZ_EXAMPLES` generated cases per operation plus schemathesis' explicit examples
and coverage cases, no example database (nothing is written into the work tree). The server only
lets rollouts call 127.0.0.1 (`TASKAPP_INFERENCE_ALLOWED_HOSTS`), so no generated URL leaves the machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import negative_data_rejection, positive_data_acceptance
from support.keys import SECRETS, TEST_KEY, assert_no_key_material
from support.servers import AppServer, start_app_server

from task_app.core.settings import Settings
from task_app.web.server import create_app

pytestmark = pytest.mark.e2e  # every test here starts a server or a child process

# Generated cases per operation; `FUZZ_EXAMPLES=400 pytest tests/test_fuzz.py` for a deeper run (~40 s).
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
PUBLIC = frozenset({("GET", "/"), ("HEAD", "/"), ("GET", "/health"), ("GET", "/health/rollout")})

# The schema of an app built like the server's (the schema does not depend on settings); the test
# below checks that the server publishes exactly this at /openapi.json.
SCHEMA = create_app(Settings(environment_api_key="schema-only", warm_up=False)).openapi()
schema = schemathesis.openapi.from_dict(SCHEMA)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    with ExitStack() as stack:
        yield start_app_server(
            stack,
            tmp_path_factory.mktemp("fuzz"),
            inference_allowed_hosts=["127.0.0.1"],
            max_time_s=5.0,
            warm_up=False,
        )


def test_the_served_schema_is_the_one_fuzzed(fuzz_server: AppServer) -> None:
    response = fuzz_server.client(key=None).get("/openapi.json")
    assert response.status_code == 200
    assert response.json() == SCHEMA
    for path, operations in SCHEMA["paths"].items():
        for method, operation in operations.items():
            statuses = set(operation["responses"])
            assert statuses & {"200", "202"}, (method, path)  # 202: POST /rollouts accepts for later
            if (method.upper(), path) not in PUBLIC:
                assert {"401", "503"} <= statuses, (method, path)
    assert fuzz_server.client(key=None).get("/docs").status_code == 404  # no CDN-loaded docs pages


@schema.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_declared(case: Any, fuzz_server: AppServer) -> None:
    response = case.call_and_validate(
        base_url=fuzz_server.base_url,
        headers={"X-API-Key": TEST_KEY},
        excluded_checks=[positive_data_acceptance, negative_data_rejection],
        timeout=30,
    )
    assert_no_key_material(response.text + str(dict(response.headers)), SECRETS)

    anonymous = case.call(base_url=fuzz_server.base_url, headers={"X-API-Key": ""}, timeout=30)
    assert anonymous.status_code < 500, anonymous.text
    assert_no_key_material(anonymous.text, SECRETS)
    if case.method.upper() != case.operation.method.upper():  # a coverage case probing an undeclared method
        assert anonymous.status_code == 405, (case.method, case.path, anonymous.status_code)
    elif (case.method.upper(), case.path) not in PUBLIC:
        assert anonymous.status_code == 401, (case.method, case.path, anonymous.status_code, anonymous.text)
        assert anonymous.json()["error"]["code"] == "unauthorized"
