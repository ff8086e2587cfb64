"""The wire format of slime's retool example (`examples/retool/generate_with_retool.py`), as facts the bench
needs to replay it: how it renders a question into the prompt it sends, which tool call it parses, how it
runs the code and wraps the output into the next request.

retool does not take a rendered prompt: it receives the dataset's raw question and renders it itself (its own
system prompt and its one tool around it). A trace that drives it holds both (`prompt.raw`, `prompt.ids`), and
this module is what makes the pair for synthetic traces. `tests/test_target_slime_retool.py` checks every
piece against retool's own code at each slime commit the bench knows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

TOOL_NAME = "code_interpreter"  # the only tool retool registers; its argument `code` is Python source
CODE_ARGUMENT = "code"
# The tool spec retool announces (its registry's), key for key; the rendered prompt lists it as sorted JSON.
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": TOOL_NAME, "description": "A tool for executing Python code in a safe sandbox environment.",
    "parameters": {"type": "object",
                   "properties": {CODE_ARGUMENT: {"type": "string", "description": "The Python code to execute"}},
                   "required": [CODE_ARGUMENT]}}}]
# retool's default system prompt (it passes none of its own).
SYSTEM = ("You are a helpful assistant that can use Python tools to solve mathematical problems. When you need to "
          "perform calculations, use the code_interpreter tool to execute code and get results.")
CODE_TIMEOUT_S = 30.0


def render_prompt(question: str, tools: list[dict[str, Any]] = TOOLS, system: str = SYSTEM) -> str:
    """The text retool sends for `question`: its template's output, byte for byte (its whitespace trimming leaves
    no newline after the role names and none after the final `assistant`)."""
    listed = "".join(json.dumps(tool, sort_keys=True) for tool in tools)
    tool_block = (
        "\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    ) if tools else ""
    return (f"<|im_start|>system{system}{tool_block}\n<|im_end|>\n"
            f"<|im_start|>user{question}<|im_end|>\n<|im_start|>assistant")


def tool_call_text(code: str) -> str:
    """A code-interpreter call as the model writes it and retool parses it (one JSON line inside the tags:
    retool escapes raw newlines before parsing, so the call must carry its newlines escaped)."""
    return f'<tool_call>\n{{"name": "{TOOL_NAME}", "arguments": {json.dumps({CODE_ARGUMENT: code})}}}\n</tool_call>'


def answer_text(answer: str) -> str:
    """The final answer in the one form retool takes as the end of the conversation."""
    return f"Answer: \\boxed{{{answer}}}"


def observation(result: str) -> str:
    """What retool appends after the model's turn: the tool's result inside `<interpreter>` tags."""
    return f"\n\n<interpreter>\n{result}\n</interpreter>\n\n"


def run_code(code: str) -> str:
    """The code interpreter's result for `code`, computed the way retool's sandbox does: the code runs in a fresh
    Python process, its stdout comes back as `Output:` and the text, stderr as `Errors:`, the whole stripped.
    Synthetic traces only hold code that runs cleanly with allowed imports, so the sandbox's refusals and
    error tracebacks (which name temporary paths) never appear."""
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          timeout=CODE_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise ValueError(f"synthetic retool code failed ({done.returncode}): {code!r}: {done.stderr.strip()}")
    result = ""
    if done.stdout:
        result += f"Output:\n{done.stdout}"
    if done.stderr:
        result += f"\nErrors:\n{done.stderr}"
    return result.strip()
