"""Exchanges placed in trajectories, turned into trace v1 records (`Trajectory`, `Turn`).

A turn holds its last attempt; earlier attempts (an HTTP error, an abort retried with the same input) are kept
in the trajectory's `metadata.recording.attempts`, because a replay answers each turn once and the faults that
made a live server fail are the bench's to inject again. Tool calls and their outputs are read from the text in
the Hermes/Qwen form the bench's chat template also uses (`<tool_call>` in an answer, `<tool_response>` in the
next turn's input), or from OpenAI chat messages; anything the recorder cannot read it says so in metadata.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench.trace import Latency, Prompt, Request, Response, ResponseError, ToolCall, ToolOutput, Trajectory, Turn

from .parse import CapturedAnswer, CapturedInput
from .tracker import Placement, key_ids

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)


class Detokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


@dataclass
class _Open:
    """A trajectory being recorded."""

    placement: Placement
    prompt: Prompt
    turns: list[Turn] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    appends_text: list[str | None] = field(default_factory=list)  # each turn's appended input, as text


def _finite_logprobs(answer: CapturedAnswer) -> tuple[list[float] | None, str | None]:
    values = answer.logprobs
    if values is None:
        return None, None
    if len(values) != len(answer.output_ids):
        return None, f"the server sent {len(values)} logprobs for {len(answer.output_ids)} ids (kept none)"
    try:
        floats = [float(v) for v in values]
    except (TypeError, ValueError):
        return None, "the server sent a logprob that is not a number (kept none)"
    if floats and not (all(map(math.isfinite, floats)) and max(floats) <= 0):
        position = next(i for i, v in enumerate(floats) if not math.isfinite(v) or v > 0)
        return None, f"the server sent logprob {values[position]!r} at position {position} (kept none)"
    return floats, None


class Recording:
    """The trajectories of one recording, built exchange by exchange."""

    def __init__(self, tokenizer: Detokenizer | None) -> None:
        self.tokenizer = tokenizer  # decodes appended ids to find tool outputs; None: they stay unread
        self._open: dict[str, _Open] = {}

    def add(self, placement: Placement, captured: CapturedInput, answer: CapturedAnswer, endpoint: str,
            input_ids: list[int] | None) -> Trajectory:
        """Record one finished exchange; returns the exchange alone, as a fragment (`_fragment`)."""
        state = self._open.get(placement.trajectory)
        if state is None:
            state = _Open(placement, self._prompt(captured, answer, input_ids))
            self._open[placement.trajectory] = state
        turn, note = self._turn(placement, captured, answer, endpoint, input_ids)
        if note:
            state.notes.append(f"turn {placement.turn} attempt {placement.attempt}: {note}")
        if placement.turn < len(state.turns):  # a later attempt replaces the turn; the earlier one is noted
            state.attempts.append(self._attempt_note(placement.turn, state.turns[placement.turn]))
            state.turns[placement.turn] = turn
            del state.turns[placement.turn + 1:]
        else:
            state.turns.append(turn)
            appended = self._appended_text(placement, captured)
            state.appends_text.append(appended)
            if placement.turn > 0:
                self._tool_outputs(state, placement.turn - 1, appended, captured)
        return self._fragment(state, placement, turn, input_ids)

    def trajectory(self, ident: str) -> Trajectory:
        state = self._open[ident]
        metadata: dict[str, Any] = {"recording": {"member": state.placement.member}}
        if state.attempts:
            metadata["recording"]["attempts"] = list(state.attempts)
        if state.notes:
            metadata["recording"]["notes"] = list(state.notes)
        return Trajectory(ident, state.placement.group, state.prompt, list(state.turns), None, metadata)

    def trajectories(self) -> list[Trajectory]:
        """Every trajectory so far, in their index order (a trace's, or first arrival)."""
        ordered = sorted(self._open.values(), key=lambda s: (s.placement.index, s.placement.trajectory))
        return [self.trajectory(s.placement.trajectory) for s in ordered]

    # -- pieces --------------------------------------------------------------------------------
    def _prompt(self, captured: CapturedInput, answer: CapturedAnswer, input_ids: list[int] | None) -> Prompt:
        ids = list(input_ids or [])
        if captured.text is not None:
            text = captured.text
        elif ids and self.tokenizer is not None:
            text = self.tokenizer.decode(ids)
        else:
            text = ""
        return Prompt(ids, text, captured.messages, captured.tools)

    def _turn(self, placement: Placement, captured: CapturedInput, answer: CapturedAnswer, endpoint: str,
              input_ids: list[int] | None) -> tuple[Turn, str | None]:
        if captured.messages is not None:
            request = Request(endpoint, captured.sampling_params, messages=captured.messages)
        elif input_ids is not None:
            request = Request(endpoint, captured.sampling_params, input_ids_append=key_ids(placement.append))
        else:
            request = Request(endpoint, captured.sampling_params, text=captured.text)
        logprobs, note = _finite_logprobs(answer)
        latency = Latency(round(answer.ttft, 6), round(max(answer.total, answer.ttft), 6))
        if answer.error is not None:
            response = Response([], None, "", None, answer.weight_version, len(input_ids or []), 0, 0, latency,
                                ResponseError(answer.error.status, answer.error.message))
        else:
            if not answer.ids_known:
                note = "; ".join(filter(None, [note, "the server sent text without token ids"]))
            response = Response(list(answer.output_ids), logprobs, answer.text, answer.finish_reason,
                                answer.weight_version, len(input_ids) if input_ids is not None else answer.prompt_tokens,
                                len(answer.output_ids), answer.cached_tokens, latency)
        return Turn(request, response, self._tool_calls(placement.turn, answer)), note

    @staticmethod
    def _tool_calls(turn: int, answer: CapturedAnswer) -> list[ToolCall]:
        if answer.error is not None:
            return []
        if answer.tool_calls:
            raw = [(call["name"], call["arguments"]) for call in answer.tool_calls]
        else:
            raw = []
            for match in _TOOL_CALL.finditer(answer.text):
                try:
                    call = json.loads(match.group(1))
                except ValueError:
                    continue  # not a call the model finished writing; the text keeps it
                if isinstance(call, dict) and isinstance(call.get("name"), str):
                    raw.append((call["name"], json.dumps(call.get("arguments", {}), ensure_ascii=False)))
        return [ToolCall(f"call_{turn}_{i}", name, arguments if isinstance(arguments, str) else json.dumps(arguments))
                for i, (name, arguments) in enumerate(raw)]

    def _appended_text(self, placement: Placement, captured: CapturedInput) -> str | None:
        if captured.messages is not None or placement.turn == 0:
            return None
        if self.tokenizer is None or captured.text is not None:
            return None
        return self.tokenizer.decode(key_ids(placement.append))

    def _tool_outputs(self, state: _Open, turn: int, appended: str | None, captured: CapturedInput) -> None:
        """Fill turn `turn`'s tool outputs from what the next turn's input added."""
        calls = state.turns[turn].tool_calls
        if not calls:
            return
        if captured.messages is not None:
            texts = [str(m.get("content") or "") for m in captured.messages[-len(calls):] if m.get("role") == "tool"]
        elif appended is not None:
            texts = _TOOL_RESPONSE.findall(appended)
        else:
            state.notes.append(f"turn {turn}: tool outputs not read (no tokenizer to decode the next turn's input)")
            return
        if len(texts) != len(calls):
            state.notes.append(f"turn {turn}: {len(calls)} tool calls but {len(texts)} tool outputs found in the "
                               "next turn's input (outputs kept for the first calls)")
        outputs = []
        for call, text in zip(calls, texts):
            tokens = len(self.tokenizer.encode(text)) if self.tokenizer is not None else 0
            outputs.append(ToolOutput(call.id, text, len(text.encode("utf-8")), tokens))
        previous = state.turns[turn]
        state.turns[turn] = Turn(previous.request, previous.response, previous.tool_calls, outputs)

    @staticmethod
    def _attempt_note(turn: int, replaced: Turn) -> dict[str, Any]:
        response = replaced.response
        note: dict[str, Any] = {"turn": turn, "finish": (response.finish_reason or {}).get("type"),
                                "completion_tokens": response.completion_tokens}
        if response.error is not None:
            note |= {"status": response.error.status, "error": response.error.message[:500]}
        return note

    def _fragment(self, state: _Open, placement: Placement, turn: Turn, input_ids: list[int] | None) -> Trajectory:
        """The exchange as a trajectory of its own, whose prompt is the turn's whole input: what a recording
        killed before it could join its fragments holds (`journal`)."""
        ids = list(input_ids) if input_ids is not None else list(state.prompt.ids)
        if turn.request.input_ids_append is not None:
            request = Request(turn.request.endpoint, turn.request.sampling_params, input_ids_append=[])
            text = self.tokenizer.decode(ids) if self.tokenizer is not None and ids else state.prompt.text
            prompt = Prompt(ids, text, state.prompt.messages, state.prompt.tools)
        else:
            request, prompt = turn.request, Prompt(ids, state.prompt.text if placement.turn == 0 else "",
                                                   state.prompt.messages, state.prompt.tools)
        fragment = Turn(request, turn.response, turn.tool_calls)
        metadata = {"recording": {"fragment_of": placement.trajectory, "turn": placement.turn,
                                  "attempt": placement.attempt}}
        return Trajectory(f"{placement.trajectory}/t{placement.turn}a{placement.attempt}", placement.group, prompt,
                          [fragment], None, metadata)
