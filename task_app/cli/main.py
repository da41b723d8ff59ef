"""`task-app serve | demo | eval | traces | replay | view`: the parser and the serve, demo and eval commands."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from rich.console import Console

from ..core.json_codec import dumps
from ..core.settings import Settings
from ..core.version import app_version
from ..inspection.eval_stats import eval_summary
from ..inspection.report import request_with_trace, write_report
from ..web.local_server import DOORS_FROM_ENV, UVICORN_OPTIONS, bind_socket, serve_in_thread, serve_processes, with_ors
from ..web.server import APP_FROM_ENV, create_app
from .evaluation import parse_seeds, print_eval_summary, report, rollout_request, run_rollouts, submit_rollouts
from .trace_db import CliError, print_error
from .traces import add_traces_parser
from .view import add_viewer_parsers

STARTUP_FAILURE = 3  # uvicorn's exit code when the app does not start
# How long a process may leave the supervisor's ping unanswered before it is replaced (uvicorn: 5 s). A
# starting process imports crafter, numba and the mcp SDK with the GIL mostly held; on a loaded machine
# that starved the ping past 5 s and the supervisor killed every process it started, over and over.
WORKER_HEALTHCHECK_S = 30


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def _serve(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {} if args.processes is None else {"processes": args.processes}
    if args.ors_port is not None:
        overrides["ors_port"] = args.ors_port
    try:
        settings = Settings(_env_file=args.env_file, **overrides)
    except ValueError as exc:  # pydantic's ValidationError: a bad setting, said once, without a traceback
        return print_error(CliError(str(exc)))
    host = args.host or settings.host
    port = settings.port if args.port is None else args.port
    env_file = args.env_file if Path(args.env_file).exists() else None
    if args.reload:
        if settings.ors_port is not None:
            return print_error(CliError("--reload serves one port: leave out --ors-port (TASKAPP_ORS_PORT)"))
        uvicorn.run(APP_FROM_ENV, factory=True, host=host, port=port, reload=True, env_file=env_file, **UVICORN_OPTIONS)
        return 0
    sockets = [bind_socket(host, port)]
    if settings.ors_port is not None:
        sockets.append(bind_socket(host, settings.ors_port))
        ors_port = sockets[1].getsockname()[1]
        os.environ["TASKAPP_ORS_PORT"] = str(ors_port)  # the port bound, for the processes' factory
    if settings.processes > 1:
        # Each process builds the app from the environment (uvicorn loads the env file into it first).
        config = uvicorn.Config(
            DOORS_FROM_ENV,
            factory=True,
            **UVICORN_OPTIONS,
            workers=settings.processes,
            env_file=env_file,
            timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
        )
        serve_processes(config, sockets)
    else:
        app = create_app(settings)
        served = app if len(sockets) == 1 else with_ors(app, sockets[1].getsockname()[1])
        server = uvicorn.Server(uvicorn.Config(served, **UVICORN_OPTIONS))
        with suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it shut down on, as `uvicorn.run` swallows
            server.run(sockets=sockets)
        if not server.started:
            return STARTUP_FAILURE  # as `uvicorn.run`: the lifespan failed (the error is logged)
    return 0


def _demo(args: argparse.Namespace) -> int:
    """Start the app on a free loopback port and drive scripted rollouts over HTTP, as a trainer would."""
    console = Console()
    api_key = secrets.token_urlsafe(24)
    seeds = parse_seeds(args.seeds)
    settings = Settings(environment_api_key=api_key)
    if args.traces_dir:
        settings = settings.model_copy(update={"traces_db": Path(args.traces_dir) / "task_app.db"})
    requests = [
        rollout_request(f"demo-{seed}-{secrets.token_hex(4)}", seed, args.decisions, "crafter-scripted")
        for seed in seeds
    ]
    report_path = None if args.no_report else (args.report or settings.traces_db.parent / "report.html")
    if report_path is not None:
        requests = [request_with_trace(request) for request in requests]
    console.print(f"Serving the task app locally; {len(seeds)} scripted rollouts of {args.decisions} decisions")
    with serve_in_thread(create_app(settings)) as base_url:
        rows = anyio.run(run_rollouts, base_url, api_key, requests, args.concurrency, 3700.0, console)
    report(rows, console)
    console.print(f"Traces: {settings.traces_db}", highlight=False)
    if report_path is not None:
        for line in write_report(rows, report_path).describe():
            console.print(line, highlight=False, markup=False)
    return 1 if any(row.error for row in rows) else 0


def _eval(args: argparse.Namespace) -> int:
    console = Console()
    config = {"model": args.model, "inference_url": args.inference_url, "temperature": args.temperature}
    if args.model_api_key:
        config["api_key"] = args.model_api_key
    policy_config = {key: value for key, value in config.items() if value is not None}
    plan = [(seed, repeat) for seed in parse_seeds(args.seeds) for repeat in range(args.repeats)]
    requests = [
        rollout_request(
            f"eval-{seed}-{repeat}-{secrets.token_hex(4)}", seed, args.decisions, args.policy, policy_config
        )
        for seed, repeat in plan
    ]
    if args.report is not None:
        requests = [request_with_trace(request) for request in requests]
    drive = submit_rollouts if args.submit else run_rollouts
    rows = anyio.run(drive, args.base_url, args.api_key, requests, args.concurrency, args.timeout, console)
    for row, (_, repeat) in zip(rows, plan, strict=True):
        row.repeat = repeat
    report(rows, console)
    summary = eval_summary(rows, args.repeats)
    print_eval_summary(summary, console)
    if args.json is not None:
        text = dumps(summary, pretty=True) + "\n"
        if str(args.json) == "-":
            sys.stdout.write(text)
        else:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(text, encoding="utf-8")
    if args.report is not None:
        for line in write_report(rows, args.report).describe():
            console.print(line, highlight=False, markup=False)
    return 1 if any(row.error for row in rows) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="task-app", description="Crafter task app")
    parser.add_argument("--version", action="version", version=f"%(prog)s {app_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the app with uvicorn")
    serve.add_argument("--host", default=None, help="default 127.0.0.1 (TASKAPP_HOST)")
    serve.add_argument("--port", type=int, default=None, help="default 8001 (TASKAPP_PORT)")
    serve.add_argument("--reload", action="store_true")
    serve.add_argument(
        "--processes", type=_positive, default=None, help="app processes on the port (TASKAPP_PROCESSES, default 1)"
    )
    serve.add_argument(
        "--ors-port",
        type=int,
        default=None,
        help="also serve the Open Reward Standard at the root of this port (TASKAPP_ORS_PORT; 0: any free port)",
    )
    serve.add_argument("--env-file", default=".env")
    serve.set_defaults(run=_serve)

    demo = commands.add_parser("demo", help="serve locally and run scripted rollouts over HTTP")
    demo.add_argument("--seeds", default="0-7")
    demo.add_argument("--decisions", type=int, default=300)
    demo.add_argument("--concurrency", type=int, default=4)
    demo.add_argument("--traces-dir", default=None, help="directory of the trace database (default ./traces)")
    demo.add_argument("--report", type=Path, default=None, help="HTML report (default: <traces dir>/report.html)")
    demo.add_argument("--no-report", action="store_true", help="skip the HTML report and the episode pages")
    demo.set_defaults(run=_demo)

    evaluate = commands.add_parser("eval", help="run rollouts against a task app with an OpenAI-compatible model")
    evaluate.add_argument("--base-url", required=True, help="the task app, e.g. http://127.0.0.1:8001")
    evaluate.add_argument("--api-key", required=True, help="the task app's ENVIRONMENT_API_KEY")
    evaluate.add_argument("--inference-url", required=True, help="OpenAI-compatible base or /chat/completions URL")
    evaluate.add_argument("--model", required=True)
    evaluate.add_argument("--model-api-key", default=None, help="sent to the model server as a Bearer token")
    evaluate.add_argument("--seeds", default="0-9")
    evaluate.add_argument("--repeats", type=_positive, default=1, metavar="K", help="rollouts per seed (default 1)")
    evaluate.add_argument(
        "--json", type=Path, default=None, metavar="FILE", help="also write every figure as JSON (- for stdout)"
    )
    evaluate.add_argument("--decisions", type=int, default=50)
    evaluate.add_argument(
        "--concurrency", type=int, default=8, help="rollouts in flight (with --async: result polls in flight)"
    )
    evaluate.add_argument(
        "--async",
        dest="submit",
        action="store_true",
        help="submit every rollout at once (POST /rollouts, a group per seed) and poll the results",
    )
    evaluate.add_argument("--timeout", type=float, default=3700.0, help="seconds to wait for all results")
    evaluate.add_argument("--temperature", type=float, default=None)
    evaluate.add_argument("--policy", default="crafter-react")
    evaluate.add_argument("--report", type=Path, default=None, help="also write an HTML report and episode pages")
    evaluate.set_defaults(run=_eval)
    add_traces_parser(commands)
    add_viewer_parsers(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
