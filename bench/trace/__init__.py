"""Trace format v1: schema, streaming reader, validator and writer (see traces/README.md)."""

from .errors import Problem, TraceFormatError, TraceVersionError
from .reader import TraceReader, open_trace, read_header, validate_trace
from .schema import (
    SCHEMA_VERSION,
    Latency,
    Prompt,
    Request,
    Response,
    ResponseError,
    TokenizerInfo,
    ToolCall,
    ToolOutput,
    TraceHeader,
    TraceSource,
    Trajectory,
    Turn,
)
from .writer import TraceWriter, write_trace

__all__ = [
    "SCHEMA_VERSION", "Latency", "Problem", "Prompt", "Request", "Response", "ResponseError", "TokenizerInfo",
    "ToolCall", "ToolOutput", "TraceFormatError", "TraceHeader", "TraceReader", "TraceSource", "TraceVersionError",
    "TraceWriter", "Trajectory", "Turn", "open_trace", "read_header", "validate_trace", "write_trace",
]
