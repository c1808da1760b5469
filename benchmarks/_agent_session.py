"""A recorded agent session: the request bodies a real agent sent, in order, by turn.

A recording is a gzipped JSON-lines file. Its first line is the `Session`
header (agent, its version, the dialect, the model the server served, the
server's command and the user prompts); every later line is one `Recorded`
request as the agent sent it: method, path, query, the headers that decide
how a server reads the body, and the body itself, untouched. A turn is one
user prompt; the agent may send several requests during it (a title, a
token count, the answer), all kept with that turn's number.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The routes that generate, by dialect; every other request (a model list,
# a token count) is recorded but not replayed.
GENERATION_PATHS = {
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/chat/completions": "chat",
}
# The key a body that is not JSON is kept under, as text.
RAW_TEXT = "__raw_text__"
# Headers that change how a server reads a body (the rest are transport).
KEPT_HEADERS = ("content-type", "anthropic-version", "anthropic-beta", "openai-beta")


@dataclass(slots=True)
class Session:
    """The header line: what was recorded, against what."""

    agent: str  # "codex", "claude-code"
    agent_version: str
    dialect: str  # "responses" (Codex), "messages" (Claude Code)
    model: str  # the model the server served, as /v1/models named it
    server_command: str  # the recording server's command line
    prompts: list[str]  # the user prompt of each turn, turn 1 first
    recorded_at: str  # ISO 8601, UTC


@dataclass(slots=True)
class Recorded:
    """One request the agent sent."""

    turn: int  # 1-based: the user prompt it was sent for
    method: str
    path: str  # without the query
    query: str  # "beta=true", or ""
    headers: dict[str, str]
    body: Any  # the JSON body as sent; None for a request without one
    status: int = 0  # what the recording server answered
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dialect(self) -> str | None:
        """The generation dialect of the request, None for any other route."""
        if self.method != "POST" or not isinstance(self.body, dict) or RAW_TEXT in self.body:
            return None
        return GENERATION_PATHS.get(self.path)


def kept_headers(headers: dict[str, str]) -> dict[str, str]:
    lowered = {name.lower(): value for name, value in headers.items()}
    return {name: lowered[name] for name in KEPT_HEADERS if name in lowered}


def write_recording(path: Path, session: Session, requests: list[Recorded]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write(json.dumps({"session": asdict(session)}, ensure_ascii=False) + "\n")
        for request in requests:
            out.write(json.dumps({"request": asdict(request)}, ensure_ascii=False) + "\n")


def read_recording(path: Path) -> tuple[Session, list[Recorded]]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    if not rows or "session" not in rows[0]:
        raise ValueError(f"{path}: the first line is not a session header")
    session = Session(**rows[0]["session"])
    return session, [Recorded(**row["request"]) for row in rows[1:]]


def generation_turns(requests: list[Recorded]) -> dict[int, list[Recorded]]:
    """The generation requests grouped by turn, turns ascending, each in sent order."""
    turns: dict[int, list[Recorded]] = {}
    for request in requests:
        if request.dialect is not None:
            turns.setdefault(request.turn, []).append(request)
    return dict(sorted(turns.items()))
