"""The Crafter task app.

The folders are the layers, lowest first; a module may import its own layer and the layers below it,
never one above (tests/test_layers.py walks every import and enforces it):

    core        settings, errors, wire contracts, JSON codec, outbound HTTP, rubrics, shared helpers
    store       the state store: bytes by key with one atomic primitive; memory, sqlite, modal-dict
    game        Crafter itself: worlds and their cache, actions, observations, checkpoints, traits
    sessions    env sessions: records and checkpoints in the store, live envs, snapshots, OpenEnv
    policy      who decides: the LLM ReAct policy (prompt, inference, vendors) and the scripted baseline
    rollout     one rollout, HTTP-free: plan, ops loop, step rewards, result, run registry
    tracing     what a rollout leaves behind: trace payloads, the SQLite store, SFT files
    inspection  looking back at rollouts: replay, episode viewer, eval report, scores
    service     the application: admission, engine, storage, response; policies; the taskset
    web         the HTTP layer: app factory, auth, limits, routes
    cli         `task-app ...`: serve, demo, eval, traces, replay, view
"""

LAYERS = ("core", "store", "game", "sessions", "policy", "rollout", "tracing", "inspection", "service", "web", "cli")
