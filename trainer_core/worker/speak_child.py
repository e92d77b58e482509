"""The text-to-speech Playground's child process (trainer_core/tryout/speak.py): ``python -m trainer_core.worker.speak_child``
reads {sources, text, speaker, max_seconds, seed, out_dir} on stdin, has each source speak the text into
``<out_dir>/<index>.wav`` and writes {"clips": [{seconds, ended, rate} or {error}]} as one JSON line. Sources are
loaded one after the other (one model in memory at a time), each as the tts method loads it: a base CSM folder or hub
id, a full run's ``model/`` folder (or checkpoint), or a LoRA ``adapter/`` applied on its base. The HF token (a gated
hub model) comes from the environment only."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path

from trainer_core.specs import model_source
from trainer_core.config import TrainConfig
from trainer_core.specs.model_source import ResolvedSource


def device() -> str:  # the dashboard's speak.py forces the CPU: a GPU belongs to the jobs the queue places
    import torch

    return "cuda" if torch.cuda.is_available() and os.environ.get("FINETUNE_STUDIO_FORCE_CPU") != "1" else "cpu"


def load(resolved: ResolvedSource, where: str):
    """(model, processor) of the source on ``where``, in eval mode; an adapter stays unmerged (PeftModel)."""
    from transformers import AutoProcessor

    from trainer_core.worker import sources
    from trainer_core.worker.methods import tts

    token = os.environ.get("HF_TOKEN") or None
    cfg = resolved.config or TrainConfig(model_name=resolved.base_model, method="tts", adapter="full")
    if resolved.model_dir is not None:  # a full fine-tune's weights, saved with the processor it trained with
        model, processor = tts.load_model(cfg, str(resolved.model_dir), token)
    else:
        base = sources.base_folder(resolved, log=lambda m: None)
        # a LoRA run's base loads as the run loaded it (its dtype rule); a plain base in fp32 like a full run
        model, processor = tts.load_model(cfg if resolved.adapter_dir else dataclasses.replace(cfg, adapter="full"),
                                          base, token)
        if resolved.adapter_dir is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(resolved.adapter_dir))
            processor = AutoProcessor.from_pretrained(sources.processor_folder(resolved, base), token=token)
    model.to(where)
    model.eval()
    return model, processor


def speak_all(request: dict) -> list[dict]:
    from trainer_core.worker.methods import tts
    from trainer_core.worker.model_files import ModelSourceError

    out_dir, where = Path(request["out_dir"]), device()
    clips = []
    for i, key in enumerate(request["sources"]):
        try:
            # again here: the folders may have changed
            resolved = model_source.resolve(model_source.ModelSource.from_key(key))
            model, processor = load(resolved, where)
            samples, ended = tts.speak(model, processor, request["text"], int(request["speaker"]),
                                       float(request["max_seconds"]), seed=int(request["seed"]))
            rate = tts.codec_rate(processor)
            (out_dir / f"{i}.wav").write_bytes(tts.wav_bytes(samples, rate))
            clips.append({"seconds": len(samples) / rate, "ended": ended, "rate": rate})
            del model
        except (model_source.SourceError, ModelSourceError, OSError, ValueError, RuntimeError) as exc:
            # one model's failure (a damaged adapter, not a CSM, out of memory) is its own column's message
            clips.append({"error": f"{type(exc).__name__}: {exc}"[:800]})
        except Exception as exc:  # noqa: BLE001 - each model is a boundary: a damaged config makes transformers
            # raise KeyError/TypeError/AttributeError; that model's column says so and the others still speak
            clips.append({"error": f"{type(exc).__name__} while loading or speaking: {exc}"[:800]})
    return clips


def main() -> int:
    try:
        print(json.dumps({"clips": speak_all(json.loads(sys.stdin.read()))}))
        return 0
    except Exception:  # noqa: BLE001 - process boundary: the parent shows the tail
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
