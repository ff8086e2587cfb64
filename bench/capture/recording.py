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
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

from bench.trace import Latency, Prompt, Request, Response, ResponseError, ToolCall, ToolOutput, Trajectory, Turn

from .parse import CapturedAnswer, CapturedInput
from .tracker import Placement

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
    errors: list[dict[str, Any]] = field(default_factory=list)  # each error answer: turn, attempt, status, body
    inputs: list[list[int] | None] = field(default_factory=list)  # each turn's whole input ids (None: unknown)
    outputs: list[list[int]] = field(default_factory=list)  # each turn's output ids
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
    """The trajectories of one recording, built exchange by exchange.

    A turn is written in ids whenever its input ids are known (sent as ids, reported by the server, or, for a
    text prompt, the recording tokenizer's tokenization of it, noted): `input_ids_append` when it extends the
    previous turn's input and output, else `input_ids` (a chat template that renders history differently).
    Replay identifies requests by ids; the messages of a chat stay in `prompt.messages`.
    """

    def __init__(self, tokenizer: Detokenizer | None, *, texts_from_ids: bool = False) -> None:
        self.tokenizer = tokenizer  # decodes appended ids to find tool outputs; None: they stay unread
        # the bench's own tokenizer: an answer's text is what its ids decode to (what `validate` checks)
        self.texts_from_ids = texts_from_ids and tokenizer is not None
        self._open: dict[str, _Open] = {}

    def add(self, placement: Placement, captured: CapturedInput, answer: CapturedAnswer, endpoint: str,
            input_ids: list[int] | None, check: Callable[[Trajectory], None] | None = None) -> Trajectory:
        """Record one finished exchange; returns the exchange alone, as a fragment (`_fragment`). `check` sees the
        fragment first: when it raises, nothing of the exchange is kept (the recording stays a valid trace)."""
        notes: list[str] = []
        if input_ids is None and captured.text is not None and self.tokenizer is not None:
            input_ids = self.tokenizer.encode(captured.text)
            notes.append("input ids are the recorder's tokenization of the text prompt")
        elif input_ids is None and captured.messages is not None and self.texts_from_ids:
            input_ids = self._render_chat(captured)
            if input_ids is not None:
                notes.append("input ids are the messages rendered with the bench's chat template (the server sent none)")
        if answer.error is None and not answer.ids_known and self.texts_from_ids and answer.text:
            assert self.tokenizer is not None  # the bench's own tokenizer: its ids are exactly the text's
            answer = replace(answer, output_ids=self.tokenizer.encode(answer.text), ids_known=True,
                             logprobs=None if answer.logprobs is None else list(answer.logprobs))
            notes.append("the server sent text without token ids: ids are the recorder's tokenization of the text")
        state = self._open.get(placement.trajectory)
        fresh = state is None
        if state is None:
            state = _Open(placement, self._prompt(captured, answer, input_ids))
        append = self._append(state, placement.turn, input_ids)
        turn, note = self._turn(placement, captured, answer, endpoint, input_ids, append)
        fragment = self._fragment(state, placement, turn, input_ids)
        if answer.error is not None:
            fragment.metadata["recording"]["error_body"] = answer.error.body or answer.error.message
        if check is not None:
            check(fragment)
        if fresh:
            self._open[placement.trajectory] = state
        notes.extend(filter(None, [note]))
        note = "; ".join(notes)
        if answer.error is not None:
            state.errors.append({"turn": placement.turn, "attempt": placement.attempt, "status": answer.error.status,
                                 "body": answer.error.body or answer.error.message})
        if note:
            state.notes.append(f"turn {placement.turn} attempt {placement.attempt}: {note}")
        output = list(turn.response.output_ids)
        if placement.turn < len(state.turns):  # a later attempt replaces the turn; the earlier one is noted
            state.attempts.append(self._attempt_note(placement.turn, state.turns[placement.turn]))
            state.turns[placement.turn] = turn
            del state.turns[placement.turn + 1:]
            state.inputs[placement.turn:] = [input_ids]
            state.outputs[placement.turn:] = [output]
        else:
            state.turns.append(turn)
            state.inputs.append(input_ids)
            state.outputs.append(output)
            appended = self._appended_text(captured, append)
            state.appends_text.append(appended)
            if placement.turn > 0:
                self._tool_outputs(state, placement.turn - 1, appended, captured)
        return fragment

    def trajectory(self, ident: str) -> Trajectory:
        state = self._open[ident]
        metadata: dict[str, Any] = {"recording": {"member": state.placement.member}}
        if state.attempts:
            metadata["recording"]["attempts"] = list(state.attempts)
        if state.notes:
            metadata["recording"]["notes"] = list(state.notes)
        if state.errors:
            metadata["recording"]["errors"] = list(state.errors)
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

    def _render_chat(self, captured: CapturedInput) -> list[int] | None:
        """A chat's prompt ids as the bench's mock renders them (its chat template, text parts joined as vLLM does)."""
        messages = []
        for message in captured.messages or []:
            content = message.get("content")
            if isinstance(content, list):
                content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            messages.append({**message, "content": content})
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=captured.tools,  # type: ignore[union-attr]
                                                      add_generation_prompt=True)
        except Exception:  # a message shape the template cannot render: the ids stay unknown
            return None
        return self.tokenizer.encode(text)  # type: ignore[union-attr]

    @staticmethod
    def _append(state: _Open, turn: int, input_ids: list[int] | None) -> list[int] | None:
        """The ids turn `turn` adds after the previous turn's input and output; None when they do not extend it."""
        if input_ids is None:
            return None
        if turn == 0:
            return [] if input_ids == list(state.prompt.ids) else None
        before = state.inputs[turn - 1] if turn - 1 < len(state.inputs) else None
        if before is None:
            return None
        context = before + state.outputs[turn - 1]
        return input_ids[len(context):] if input_ids[:len(context)] == context else None

    def _turn(self, placement: Placement, captured: CapturedInput, answer: CapturedAnswer, endpoint: str,
              input_ids: list[int] | None, append: list[int] | None) -> tuple[Turn, str | None]:
        if append is not None:
            request = Request(endpoint, captured.sampling_params, input_ids_append=append)
        elif input_ids is not None:
            request = Request(endpoint, captured.sampling_params, input_ids=list(input_ids))
        elif captured.messages is not None:
            request = Request(endpoint, captured.sampling_params, messages=captured.messages)
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
            response = Response(list(answer.output_ids), logprobs, self._text(answer), answer.finish_reason,
                                answer.weight_version, len(input_ids) if input_ids is not None else answer.prompt_tokens,
                                len(answer.output_ids), answer.cached_tokens, latency)
        return Turn(request, response, self._tool_calls(placement.turn, answer)), note

    def _text(self, answer: CapturedAnswer) -> str:
        """The answer's text: what its ids decode to (a matched stop token trimmed) in the bench's tokenizer, where
        a chat answer's message content alone would leave out its tool-call markup; else the server's."""
        ids = answer.output_ids
        if not (self.texts_from_ids and answer.ids_known and ids):
            return answer.text
        matched = (answer.finish_reason or {}).get("matched")
        if isinstance(matched, int) and ids[-1] == matched:
            ids = ids[:-1]
        assert self.tokenizer is not None
        return self.tokenizer.decode(ids)

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

    def _appended_text(self, captured: CapturedInput, append: list[int] | None) -> str | None:
        if captured.messages is not None or append is None or self.tokenizer is None:
            return None
        return self.tokenizer.decode(append)

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
        if input_ids is not None:
            request = Request(turn.request.endpoint, turn.request.sampling_params, input_ids_append=[])
            text = self.tokenizer.decode(ids) if self.tokenizer is not None and ids else state.prompt.text
            prompt = Prompt(ids, text, state.prompt.messages, state.prompt.tools)
        else:
            request, prompt = turn.request, Prompt(ids, state.prompt.text if placement.turn == 0 else "",
                                                   state.prompt.messages, state.prompt.tools)
        fragment = Turn(request, turn.response, turn.tool_calls)
        metadata = {"recording": {"fragment_of": placement.trajectory, "turn": placement.turn,
                                  "attempt": placement.attempt}}
        # a later turn's fragment has a prompt of its own (the whole context): a group of its own, as members of a
        # group share their prompt; turn 0's fragments keep the group their members share
        group = placement.group if placement.turn == 0 else f"{placement.trajectory}/t{placement.turn}"
        return Trajectory(f"{placement.trajectory}/t{placement.turn}a{placement.attempt}", group, prompt,
                          [fragment], None, metadata)
