"""An LLM judge through any OpenAI-compatible chat endpoint (``POST <url>/chat/completions``): it grades
each answer against its reference on a 1-10 scale, following a rubric the user can edit. The API key is
read from the environment variable the spec names (one an admin declared, ``endpoint``), and only sent in the
Authorization header, to an address checked before every request (``endpoint.resolve``)."""
from __future__ import annotations

import json
import re

import httpx

from trainer_core.data.tool_calls import ToolFormatError, normalize_tools
from trainer_core.evaluation import endpoint

TIMEOUT_S = 60.0
_SCORE_RE = re.compile(r"(?<![\d.])(10|[1-9])(?:\.\d+)?(?![\d])")


class JudgeUnavailable(RuntimeError):
    """The endpoint cannot be reached or refuses the request: judging stops for this run."""


def render(rubric: str, prompt: str, reference: str, answer: str) -> str:
    """The rubric with its three fields filled in (replace, not str.format: user text may hold braces)."""
    return rubric.replace("{prompt}", prompt).replace("{reference}", reference).replace("{answer}", answer)


def with_tools(prompt: str, tools: str) -> str:
    """The question as the judge reads it: with the tools the model was offered (``tools``: JSON text of the row's
    tools, "" for none), one JSON line each, so the judge can tell a right call from a wrong one."""
    try:
        listed = normalize_tools(tools)
    except ToolFormatError:
        listed = []
    if not listed:
        return prompt
    lines = "\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in listed)
    return f"{prompt}\n\nTools the assistant may call (it writes a call as <tool_call>{{\"name\", \"arguments\"}}" \
           f"</tool_call>):\n{lines}"


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
        # Redirects are never followed: a redirect could lead to an address the check below refuses.
        self.client = client or httpx.Client(timeout=TIMEOUT_S, headers=headers, follow_redirects=False)

    def score(self, prompt: str, reference: str, answer: str) -> tuple[float | None, str]:
        """(score or None, the judge's reply); JudgeUnavailable when the endpoint is down, refuses, or may not
        be called. The endpoint's answer is never quoted in the message (it may be any service's page)."""
        body = {"model": self.model, "temperature": 0, "max_tokens": 16,
                "messages": [{"role": "user", "content": render(self.rubric, prompt, reference, answer)}]}
        try:  # checked before every request: the name may resolve elsewhere now than at validation
            target = endpoint.resolve(self.url)
        except endpoint.EndpointRefused as exc:
            raise JudgeUnavailable(f"the judge endpoint {self.url} is refused: {exc}") from None
        extensions = {"sni_hostname": target.hostname} if target.url.startswith("https:") else {}
        try:
            response = self.client.post(target.url, json=body, headers={"Host": target.host}, extensions=extensions)
        except httpx.HTTPError as exc:
            raise JudgeUnavailable(f"the judge endpoint {self.url} cannot be reached ({type(exc).__name__})") from None
        if response.is_redirect:
            raise JudgeUnavailable(f"the judge endpoint {self.url} answered HTTP {response.status_code}, a redirect "
                                   "(not followed): give the URL it redirects to")
        if response.status_code >= 400:
            raise JudgeUnavailable(f"the judge endpoint {self.url} answered HTTP {response.status_code}: check the "
                                   "URL, the model name and the key")
        try:
            reply = response.json()["choices"][0]["message"]["content"] or ""
            if not isinstance(reply, str):  # a number or a list of parts: parse_score would crash the whole eval
                raise TypeError(type(reply).__name__)
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeUnavailable(f"the judge endpoint {self.url} did not answer like an OpenAI-compatible chat "
                                   f"endpoint (HTTP {response.status_code}, no choices[0].message.content text)") from None
        return parse_score(reply), reply

    def close(self) -> None:
        self.client.close()
