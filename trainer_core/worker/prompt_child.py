"""``python -m trainer_core.worker.prompt_child``: reads {"config", "messages"} on stdin and writes one JSON
line, {"text", "tokens", "tokenizer"} or {"error"}: the conversation through the chat template training uses,
tokenized as the serve job does (a special-token string a user typed is text: worker/safe_prompt.py; see
trainer_core.tryout.chat_prompt)."""
from __future__ import annotations

import json
import os
import sys
import traceback

from trainer_core.config import ConfigError, TrainConfig
from trainer_core.protocol import paths
from trainer_core.worker import model_files, safe_prompt, token_cache


def render(cfg: TrainConfig, messages: list[dict]) -> dict:
    model_ref = model_files.resolve_model(cfg, log=lambda message: print(message, file=sys.stderr))
    tokenizer = token_cache.load_tokenizer(cfg, model_ref, os.environ.get("HF_TOKEN") or None)
    ids = safe_prompt.chat_ids(tokenizer, messages)  # as serve tokenizes it: message text as text
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return {"text": text, "tokens": len(ids), "tokenizer": f"{cfg.model_label} ({type(tokenizer).__name__})"}


def main() -> int:
    request = json.loads(sys.stdin.read())
    try:
        reply = render(TrainConfig.from_dict(request["config"]), request["messages"])
    except ConfigError as exc:
        reply = {"error": f"the run's config cannot be used: {exc}"}
    except (OSError, ValueError, model_files.ModelSourceError, paths.UnsafePathError) as exc:
        reply = {"error": f"could not load the tokenizer: {type(exc).__name__}: {exc}"}
    except Exception as exc:  # noqa: BLE001 - process boundary: report it; the traceback goes to stderr
        traceback.print_exc()
        reply = {"error": f"rendering the prompt failed: {type(exc).__name__}: {exc}"}
    print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
