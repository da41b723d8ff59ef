"""Episode sequences (`record.tokens: "episode"`, rollout/episode_sequences.py): one token sequence per
episode built from the ids the model server sent, checked token for token, in the response, the stored
trace and `traces export --format tokens --episodes`; `policy.config.history_reasoning`; the per-decision
event scores and what `/info` says about tokens.

End to end against the loopback fake model in its vLLM mode, rendering a chat template
(tests/support/fake_model.py: "reasoning" renders earlier reasoning back, "no-reasoning" drops it).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.fake_model import IM_END, FakeModel, tool_call
from support.rollouts import post_rollout, request_body
from support.servers import AppServer

from task_app.cli.main import main
from task_app.policy.conversation import assistant_message
from task_app.rollout.episode_sequences import Turn, episode_sequence

pytestmark = pytest.mark.usefixtures("no_key_in_logs")

THOUGHTS = ["wood is to the left", "keep chopping", "now the table"]


def _tokens(prompt: list[int], completion: list[int], **extra: Any) -> dict[str, Any]:
    logprobs = [-0.1 * (index + 1) for index in range(len(completion))]
    return {
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "completion_logprobs": logprobs,
        "tokens_missing": False,
        **extra,
    }


# --- the builder -------------------------------------------------------------------------------------


def test_turns_that_extend_each_other_make_one_sequence() -> None:
    turns = [
        Turn(0, _tokens([1, 2], [3, 4])),
        Turn(1, _tokens([1, 2, 3, 4, 5], [6])),
        Turn(3, _tokens([*range(1, 7), 7, 8], [9])),
    ]
    sequence = episode_sequence(0, turns)
    assert sequence["prefix_consistent"] and sequence["divergence"] is None and sequence["samples"] is None
    assert sequence["input_ids"] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert sequence["loss_mask"] == [0, 0, 1, 1, 0, 1, 0, 0, 1]
    assert sequence["logprobs"] == [None, None, -0.1, -0.2, None, -0.1, None, None, -0.1]
    assert sequence["turns"] == [
        {"decision_index": 0, "prompt_start": 0, "completion_start": 2, "completion_end": 4},
        {"decision_index": 1, "prompt_start": 4, "completion_start": 5, "completion_end": 6},
        {"decision_index": 3, "prompt_start": 6, "completion_start": 8, "completion_end": 9},
    ]
    assert sequence["decisions"] == [0, 1, 3]


@pytest.mark.parametrize(
    ("second_prompt", "index", "reason"),
    [([1, 2, 3, 9, 5], 3, "prompt_differs"), ([1, 2, 3], 3, "prompt_shorter"), ([7], 0, "prompt_differs")],
)
def test_the_first_diverging_token_is_named(second_prompt: list[int], index: int, reason: str) -> None:
    turns = [Turn(4, _tokens([1, 2], [3, 4])), Turn(5, _tokens(second_prompt, [6]))]
    sequence = episode_sequence(2, turns)
    assert not sequence["prefix_consistent"]
    assert (sequence["input_ids"], sequence["loss_mask"], sequence["logprobs"], sequence["turns"]) == (None,) * 4
    divergence = sequence["divergence"]
    assert (divergence["turn"], divergence["decision_index"], divergence["token_index"], divergence["reason"]) == (
        1,
        5,
        index,
        reason,
    )
    assert [sample["prompt_token_ids"] for sample in sequence["samples"]] == [[1, 2], second_prompt]
    assert [sample["completion_logprobs"] for sample in sequence["samples"]] == [[-0.1, -0.2], [-0.1]]


def test_a_turn_without_tokens_breaks_the_chain_with_its_reason() -> None:
    missing = {"tokens_missing": True, "tokens_missing_reason": "the server sent no prompt token ids"}
    sequence = episode_sequence(0, [Turn(0, _tokens([1], [2])), Turn(1, missing)])
    assert sequence["divergence"] == {
        "turn": 1,
        "decision_index": 1,
        "token_index": None,
        "reason": "tokens_missing",
        "detail": "turn 1: the server sent no prompt token ids",
    }
    assert sequence["samples"][1]["tokens_missing"] is True


def test_an_episode_without_model_calls_is_an_empty_sequence() -> None:
    sequence = episode_sequence(1, [])
    assert sequence["prefix_consistent"] and sequence["input_ids"] == [] and sequence["turns"] == []


# --- end to end ------------------------------------------------------------------------------------


def _react(model: FakeModel, decisions: int, *, record: dict[str, Any] | None = None, **config: Any) -> dict[str, Any]:
    body = request_body(
        inference_url=model.url(),
        decisions=decisions,
        record={"tokens": "episode", "return_trace": True, "trace_format": "structured", **(record or {})},
    )
    body["policy"]["config"].update({"history": "messages", **config})
    return body


def _reasoning_answers(model: FakeModel, template: str) -> None:
    model.tokens, model.template = "vllm", template
    model.script(*(tool_call("move_left", "do", reasoning=thought) for thought in THOUGHTS))


def _export_episodes(server: AppServer, out: Path, run_id: str) -> list[dict[str, Any]]:
    db = str(server.settings.traces_db)
    assert main(["traces", "--db", db, "export", "--format", "tokens", "--episodes", "-o", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    return [line for line in lines if line["run_id"] == run_id]


def _served(answer: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    choice = answer["choices"][0]
    return (
        answer["prompt_token_ids"],
        choice["token_ids"],
        [entry["logprob"] for entry in choice["logprobs"]["content"]],
    )


@pytest.mark.e2e
def test_reasoning_sent_back_makes_one_exact_sequence_everywhere(
    app_server: AppServer, client: httpx.Client, fake_model: FakeModel, tmp_path: Path
) -> None:
    _reasoning_answers(fake_model, "reasoning")
    body = _react(fake_model, 3, history_reasoning=True)
    result = post_rollout(client, body)
    sent = [request.body["messages"] for request in fake_model.requests]
    assert [message.get("reasoning_content") for message in sent[2] if message["role"] == "assistant"] == THOUGHTS[:2]
    (sequence,) = result["trajectories"][0]["episode_sequences"]
    assert sequence["prefix_consistent"] and sequence["divergence"] is None
    assert sequence["decisions"] == [0, 1, 2]
    served = [_served(answer) for answer in fake_model.answers]
    # the whole sequence is the last prompt and its completion, exactly as the server sent them
    last_prompt, last_completion, _ = served[-1]
    assert sequence["input_ids"] == last_prompt + last_completion
    mask, logprobs = sequence["loss_mask"], sequence["logprobs"]
    for turn, (prompt, completion, completion_logprobs) in zip(sequence["turns"], served, strict=True):
        start, end = turn["completion_start"], turn["completion_end"]
        assert sequence["input_ids"][:start] == prompt
        assert sequence["input_ids"][start:end] == completion and completion[-1] == IM_END
        assert logprobs[start:end] == completion_logprobs
        assert set(mask[turn["prompt_start"] : start]) == {0} and set(mask[start:end]) == {1}
        assert logprobs[turn["prompt_start"] : start] == [None] * (start - turn["prompt_start"])
    assert sum(mask) == sum(len(completion) for _, completion, _ in served)
    # the stored trace and the export say the same
    assert result["trace"]["session_metadata"]["episode_sequences"] == [sequence]
    (exported,) = _export_episodes(app_server, tmp_path / "episodes.jsonl", body["run_id"])
    assert {key: exported[key] for key in sequence} == sequence
    episode = result["metrics"]["details"]["episodes"][0]
    assert (exported["model"], exported["return"]) == ("fake-model", episode["return"])


@pytest.mark.e2e
def test_reasoning_left_out_of_the_history_breaks_the_prefix_where_it_was(
    client: httpx.Client, fake_model: FakeModel
) -> None:
    _reasoning_answers(fake_model, "reasoning")
    result = post_rollout(client, _react(fake_model, 3))
    assert all("reasoning_content" not in message for message in fake_model.requests[1].body["messages"])
    (sequence,) = result["trajectories"][0]["episode_sequences"]
    first_prompt = fake_model.answers[0]["prompt_token_ids"]
    # the previous completion opens with the reasoning; the re-rendered turn does not have it
    assert sequence["divergence"] == {
        "turn": 1,
        "decision_index": 1,
        "token_index": len(first_prompt),
        "reason": "prompt_differs",
        "detail": f"turn 1's prompt_token_ids[{len(first_prompt)}] is not the previous prompt and completion's "
        f"token {len(first_prompt)}",
    }
    assert not sequence["prefix_consistent"] and sequence["input_ids"] is None
    # the per-turn samples are kept, exactly as sampled
    assert [
        (sample["prompt_token_ids"], sample["completion_token_ids"], sample["completion_logprobs"])
        for sample in sequence["samples"]
    ] == [_served(answer) for answer in fake_model.answers]


@pytest.mark.e2e
def test_a_template_that_drops_earlier_reasoning_is_caught(client: httpx.Client, fake_model: FakeModel) -> None:
    _reasoning_answers(fake_model, "no-reasoning")
    result = post_rollout(client, _react(fake_model, 2, history_reasoning=True))
    (sequence,) = result["trajectories"][0]["episode_sequences"]
    assert sequence["divergence"]["turn"] == 1
    assert sequence["divergence"]["token_index"] == len(fake_model.answers[0]["prompt_token_ids"])


@pytest.mark.e2e
def test_answers_without_reasoning_extend_under_either_template(client: httpx.Client, fake_model: FakeModel) -> None:
    for template in ("reasoning", "no-reasoning"):
        fake_model.reset()
        fake_model.tokens, fake_model.template = "vllm", template
        fake_model.default = tool_call("move_right", content="going right")
        (sequence,) = post_rollout(client, _react(fake_model, 3))["trajectories"][0]["episode_sequences"]
        assert sequence["prefix_consistent"], template
        assert (
            sequence["input_ids"]
            == fake_model.answers[-1]["prompt_token_ids"] + fake_model.answers[-1]["choices"][0]["token_ids"]
        )


@pytest.mark.e2e
def test_each_episode_has_its_own_sequence(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.tokens, fake_model.template = "vllm", "reasoning"
    body = _react(fake_model, 4)
    body["env"]["config"] = {"length": 2}  # two primitive steps an episode: two episodes of two decisions
    result = post_rollout(client, body)
    sequences = result["trajectories"][0]["episode_sequences"]
    assert [sequence["episode"] for sequence in sequences] == [0, 1]
    assert [sequence["decisions"] for sequence in sequences] == [[0, 1], [2, 3]]
    assert all(sequence["prefix_consistent"] for sequence in sequences)
    # the second episode starts a new conversation: its sequence is the fourth call's prompt and completion
    assert (
        sequences[1]["input_ids"]
        == fake_model.answers[3]["prompt_token_ids"] + fake_model.answers[3]["choices"][0]["token_ids"]
    )


@pytest.mark.e2e
def test_summary_history_is_not_one_sequence_and_says_so(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.tokens, fake_model.template = "vllm", "reasoning"
    body = _react(fake_model, 2, history="summary")
    (sequence,) = post_rollout(client, body)["trajectories"][0]["episode_sequences"]
    assert sequence["divergence"]["turn"] == 1 and sequence["divergence"]["reason"] == "prompt_differs"


@pytest.mark.e2e
def test_without_the_option_there_are_no_sequences(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.tokens = "vllm"
    body = _react(fake_model, 1, record={"tokens": "decision"})
    trajectory = post_rollout(client, body)["trajectories"][0]
    assert "episode_sequences" not in trajectory
    assert trajectory["steps"][0]["info"]["tokens"]["prompt_token_ids"] == fake_model.answers[0]["prompt_token_ids"]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"policy": {"config": {"history_reasoning": True, "history": "summary"}}}, "history_reasoning"),
        ({"record": {"tokens": "everything"}}, "record.tokens"),
    ],
)
def test_bad_options_are_precise_422s(client: httpx.Client, change: dict[str, Any], where: str) -> None:
    body = request_body(inference_url="http://127.0.0.1:9/v1", run_id=f"bad-{uuid.uuid4().hex[:8]}", **change)
    response = client.post("/rollout", json=body)
    assert response.status_code == 422
    assert where in response.text


# --- event scores per decision, /info ------------------------------------------------------------------


@pytest.mark.e2e
def test_each_step_carries_its_event_scores_and_they_average_to_the_episode(client: httpx.Client) -> None:
    result = post_rollout(client, request_body(decisions=12))
    steps = result["trajectories"][0]["steps"]
    scores = [step["info"]["event_scores"] for step in steps]
    rubric = result["metrics"]["details"]["rubrics"]["events"]
    assert {score["version"] for score in scores} == {rubric["version"]}
    assert set(scores[0]["criteria"]) == set(rubric["criteria"])
    for name, value in rubric["criteria"].items():
        assert sum(score["criteria"][name] for score in scores) / len(scores) == pytest.approx(value, abs=1e-5)
    assert any(score["score"] > 0 for score in scores)  # the scripted policy collects wood on seed 1


@pytest.mark.e2e
def test_info_says_what_token_data_the_app_returns(client: httpx.Client) -> None:
    tokens = client.get("/info").json()["inference"]["tokens"]
    assert tokens["episode_sequences"]["request"] == 'record.tokens: "episode"'
    assert tokens["providers"]["custom"] == {"prompt_ids": True, "completion_ids": True, "logprobs": True}
    assert tokens["providers"]["groq"]["completion_ids"] is False
    assert tokens["event_scores"] == {"where": "info.event_scores"} and tokens["retokenized"] is False


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_goes_back_under_the_servers_own_field_only_when_asked(field: str) -> None:
    answer = {"role": "assistant", "content": "", field: "the table first", "tool_calls": []}
    kept, _ = assistant_message(answer, 0, reasoning=True)
    dropped, _ = assistant_message(answer, 0)
    assert kept == {"role": "assistant", "content": "", field: "the table first"}
    assert dropped == {"role": "assistant", "content": ""}


@pytest.mark.e2e
def test_export_episodes_goes_with_the_tokens_format(
    app_server: AppServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(app_server.settings.traces_db)
    out = tmp_path / "episodes.jsonl"
    assert main(["traces", "--db", db, "export", "--format", "jsonl", "--episodes", "-o", str(out)]) == 2
    assert "--episodes goes with --format tokens" in capsys.readouterr().err
    assert not out.exists()
