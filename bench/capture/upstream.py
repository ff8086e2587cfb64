"""What a live server says about itself, for a recording's header: model, context length, tokenizer.

SGLang answers `/get_server_info` and `/get_model_info`, vLLM (and SGLang) `/v1/models`; the bench's own mock
also answers `/bench/plan`, which is how a recording of it knows its ids are in the bench's tokenizer. A model's
tokenizer is read only from a local folder given on the command line (`--tokenizer DIR`); nothing downloads.
When none is known the header says so, and the clean end fills in what the traffic showed (largest id, the
id most often matched as a stop).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from bench.tokenizer import TOKENIZER_NAME, load_tokenizer, tokenizer_path
from bench.trace import TokenizerInfo

UNKNOWN_VOCAB = 2**31 - 1


class UpstreamError(RuntimeError):
    """The upstream cannot be reached or is not a generation server."""


@dataclass
class UpstreamInfo:
    model: str
    context_length: int | None
    is_bench_mock: bool
    server: str  # "sglang", "vllm" or "rollout-bench mock"


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any | None:
    try:
        async with session.get(url) as response:
            if response.status != 200:
                return None
            return await response.json(content_type=None)
    except (aiohttp.ClientError, ValueError):
        return None


async def _is_bench_mock(session: aiohttp.ClientSession, base: str) -> bool:
    """Whether `base` is a rollout-bench mock: its `/bench/plan` answers, or refuses for want of the control token
    (a mock bound beyond loopback)."""
    try:
        async with session.get(f"{base}/bench/plan") as response:
            if response.status == 200:
                return True
            body = await response.json(content_type=None) if response.status == 401 else None
    except (aiohttp.ClientError, ValueError):
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and error.get("type") == "bench_control_token"


def split_credentials(upstream: str) -> tuple[str, str | None]:
    """The URL without its `user:password@` (what may be shown and written), and those credentials as an
    Authorization header value."""
    url = URL(upstream)
    if url.scheme not in ("http", "https") or not url.host:
        raise UpstreamError(f"upstream {upstream!r} must be an http:// or https:// URL with a host "
                            "(e.g. http://127.0.0.1:30000)")
    auth = None
    if url.user or url.password:
        encode = getattr(aiohttp, "encode_basic_auth", None)  # aiohttp 3.14+; BasicAuth before it
        auth = (encode(url.user or "", url.password or "") if encode is not None
                else aiohttp.BasicAuth(url.user or "", url.password or "").encode())
    return str(url.with_user(None)).rstrip("/"), auth


async def probe(upstream: str, timeout: float = 10.0) -> UpstreamInfo:
    """Ask the upstream what it serves; `UpstreamError` when it does not answer at all."""
    split_credentials(upstream)  # a URL the client could not use is named as such, not as a dead server
    base = upstream.rstrip("/")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        try:
            async with session.get(f"{base}/health") as response:
                await response.read()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise UpstreamError(f"upstream {upstream} does not answer ({error.__class__.__name__}: {error}); start "
                                "the engine (or the router) first, or check the URL") from None
        mock = await _is_bench_mock(session, base)
        server_info = await _get_json(session, f"{base}/get_server_info") or {}
        model_info = await _get_json(session, f"{base}/get_model_info") or {}
        models = await _get_json(session, f"{base}/v1/models") or {}
    listed = (models.get("data") or [{}])[0] if isinstance(models, dict) else {}
    model = model_info.get("model_path") or server_info.get("model_path") or listed.get("id") or "unknown"
    context = server_info.get("context_length") or listed.get("max_model_len")
    kind = "rollout-bench mock" if mock else "sglang" if server_info or model_info else "vllm"
    return UpstreamInfo(str(model), int(context) if isinstance(context, int) else None, mock, kind)


class LocalTokenizer:
    """A Hugging Face tokenizer read from a local folder (transformers, offline), with the bench's interface."""

    def __init__(self, folder: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise UpstreamError("--tokenizer needs the transformers package (pip install "
                                "'rollout-bench[transformers]')") from None
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as error:
            raise UpstreamError(f"--tokenizer {folder}: not a tokenizer folder ({error})") from None
        self.name = folder
        self.vocab_size = len(self._tokenizer)
        self.eos_token_id = self._tokenizer.eos_token_id or 0
        self.pad_token_id = self._tokenizer.pad_token_id

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    # what the fault proxy's formatters also call (`bench.server.upstream`: answers rewritten in the model's vocabulary)
    def is_special(self, token_id: int) -> bool:
        """A special token (what `skip_special_tokens` drops): the named ones and every added token marked special."""
        special = self.__dict__.get("_special")
        if special is None:
            added = getattr(self._tokenizer, "added_tokens_decoder", {}) or {}
            special = frozenset(self._tokenizer.all_special_ids) | {i for i, t in added.items() if t.special}
            self.__dict__["_special"] = special
        return token_id in special

    def token_bytes(self, token_id: int) -> bytes:
        """A token's text as bytes (a piece of a multi-byte character decodes to U+FFFD, as servers show it)."""
        return self.decode([token_id]).encode("utf-8")

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = False) -> str:
        return str(self._tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None,
                                                       add_generation_prompt=add_generation_prompt, tokenize=False))


def tokenizer_for(info: UpstreamInfo, folder: str | None) -> tuple[Any, TokenizerInfo, str]:
    """(tokenizer or None, the header's tokenizer record, where that record came from). A folder given wins over
    what the upstream looks like."""
    if folder is not None and Path(folder).resolve() == tokenizer_path().resolve():
        info.is_bench_mock = True  # the bench's own tokenizer (`rollout-bench tokenizer`): e.g. the mock behind a router
    elif folder is not None:
        local = LocalTokenizer(folder)
        return local, TokenizerInfo(local.name, local.vocab_size, local.eos_token_id, local.pad_token_id), "--tokenizer"
    if info.is_bench_mock:
        bench = load_tokenizer()
        record = TokenizerInfo(TOKENIZER_NAME, bench.vocab_size, bench.eos_token_id, getattr(bench, "pad_token_id", None))
        return bench, record, "the bench's tokenizer (the upstream is the bench's mock)"
    return None, TokenizerInfo(info.model, UNKNOWN_VOCAB, 0), "unknown until the clean end (from the traffic)"


def inferred_tokenizer(name: str, largest_id: int, matched_stops: Counter[int]) -> TokenizerInfo:
    """What the traffic showed: every id is below the vocabulary size; the stop matched most often is the eos."""
    eos = matched_stops.most_common(1)[0][0] if matched_stops else 0
    return TokenizerInfo(name, max(largest_id, eos) + 1, eos)
