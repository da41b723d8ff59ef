"""The suite's shared test code, one module a job (conftest.py holds only fixtures and hooks):

    servers     the task app under uvicorn in this process (AppServer, start_app_server, open_rollout)
    processes   the task app in child processes (server_process, server_processes, first_line, ROOT)
    fake_model  a scriptable OpenAI-compatible model server on loopback (FakeModel and its behaviours)
    browser     headless Chromium for the page tests
    e2e         the `e2e` marker, enforced: a test that starts a server or a child process carries it
    keys        the test keys and the checks that no piece of one shows (responses, logs: KEY_GUARD)
    errors      the one error-body check (error_body)
    polling     the one polling helper (wait_until)
    worlds      world fingerprints and full game state, cleared surroundings
    policies    small deterministic policies and FakeLLMPolicy (a chat model's answers, no network)
    rollouts    the one request builder (request_body) and in-process rollouts
    traces      rollouts stored in and read back from trace databases; the trace CLI in-process
    pages       the HTML pages' embedded data and outside references
    fakes       FakeModalDict (modal.Dict as documented) and FakeClock

Test modules import from here (`from support.rollouts import request_body`), never from conftest.
"""
