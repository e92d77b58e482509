"""An LLM judge through any OpenAI-compatible chat endpoint (``POST <url>/chat/completions``): it grades
each answer against its reference on a 1-10 scale, following a rubric the user can edit. The API key is
read from the environment variable the spec names, and only sent in the Authorization header."""
from __future__ import annotations

import re

import httpx

TIMEOUT_S = 60.0
_SCORE_RE = re.compile(r"(?<![\d.])(10|[1-9])(?:\.\d+)?(?![\d])")


class JudgeUnavailable(RuntimeError):
    """The endpoint cannot be reached or refuses the request: judging stops for this run."""


def render(rubric: str, prompt: str, reference: str, answer: str) -> str:
    """The rubric with its three fields filled in (replace, not str.format: user text may hold braces)."""
    return rubric.replace("{prompt}", prompt).replace("{reference}", reference).replace("{answer}", answer)


def parse_score(reply: str) -> float | None:
    """The first number from 1 to 10 in the judge's reply, or None when it gave none."""
    match = _SCORE_RE.search(reply or "")
    return float(match.group(1)) if match else None


class Judge:
    def __init__(self, url: str, model: str, rubric: str, api_key: str = "", client: httpx.Client | None = None):
        self.url = url.rstrip("/") + "/chat/completions"
        self.model = model
        self.rubric = rubric
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.Client(timeout=TIMEOUT_S, headers=headers)

    def score(self, prompt: str, reference: str, answer: str) -> tuple[float | None, str]:
        """(score or None, the judge's reply); JudgeUnavailable when the endpoint is down or refuses."""
        body = {"model": self.model, "temperature": 0, "max_tokens": 16,
                "messages": [{"role": "user", "content": render(self.rubric, prompt, reference, answer)}]}
        try:
            response = self.client.post(self.url, json=body)
        except httpx.HTTPError as exc:
            raise JudgeUnavailable(f"the judge endpoint {self.url} cannot be reached ({type(exc).__name__}: "
                                   f"{exc})") from None
        if response.status_code >= 400:
            raise JudgeUnavailable(f"the judge endpoint {self.url} answered HTTP {response.status_code}: "
                                   f"{response.text[:200]}")
        try:
            reply = response.json()["choices"][0]["message"]["content"] or ""
            if not isinstance(reply, str):  # a number or a list of parts: parse_score would crash the whole eval
                raise TypeError(type(reply).__name__)
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeUnavailable(f"the judge endpoint {self.url} did not answer like an OpenAI-compatible chat "
                                   f"endpoint: {response.text[:200]}") from None
        return parse_score(reply), reply

    def close(self) -> None:
        self.client.close()
