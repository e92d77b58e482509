"""transformers serve's sequential generation, made to stop when its request is cancelled.

transformers serve (5.24) stops a *streamed* answer whose client went away (its streamer raises on the next
token), but a non-streaming answer runs ``model.generate`` on the inference thread to ``max_new_tokens``
whatever happens to the request: one abandoned ``max_tokens: 8000`` request held the endpoint for over ten
minutes. The key gate cancels a request's task when its client disconnects or its timeout passes
(serving/gate.py); here that cancellation sets an event a stopping criterion checks after every token.
"""
from __future__ import annotations

import asyncio
import threading

import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.cli.serving.utils import GenerateManager, GenerationState


class StopWhenSet(StoppingCriteria):
    """Ends every sequence of a ``generate`` call once ``event`` is set (checked after each new token)."""

    def __init__(self, event: threading.Event):
        self.event = event
        self.steps = 0  # how many tokens generate() produced before it asked (tests read it)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        self.steps += 1
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


class CancellableGenerateManager(GenerateManager):
    """GenerateManager whose non-streaming generation ends when the awaiting task is cancelled."""

    def __init__(self):
        super().__init__()
        self.running: dict[str, StopWhenSet] = {}  # request id -> its criterion, while it generates

    async def generate_non_streaming(self, model, processor, inputs: dict, gen_config, request_id: str):
        # As GenerateManager.generate_non_streaming, plus the stopping criterion.
        stop = StopWhenSet(threading.Event())
        kwargs = {**inputs, "generation_config": gen_config, "tokenizer": processor,
                  "stopping_criteria": StoppingCriteriaList([stop])}
        if hasattr(model, "has_talker"):
            kwargs["generation_mode"] = "text"
        self.running[request_id] = stop
        future = self.async_submit(model.generate, **kwargs)
        try:
            # shield: the inference thread sets the future's result later, which a cancelled future refuses
            sequences = await asyncio.shield(future)
        except asyncio.CancelledError:
            stop.event.set()  # generate() returns after its next token; the thread is free for the next request
            raise
        finally:
            self.running.pop(request_id, None)
        input_len = inputs["input_ids"].shape[-1]
        generated_ids = sequences[0, input_len:]
        return processor.decode(generated_ids, skip_special_tokens=True), input_len, generated_ids


class CancellableGenerationState(GenerationState):
    """GenerationState handing out CancellableGenerateManager for sequential generation."""

    def get_manager(self, model_id: str, use_cb: bool = False):
        if not use_cb and model_id not in self._generate_managers:
            self._generate_managers[model_id] = CancellableGenerateManager()
        return super().get_manager(model_id, use_cb=use_cb)
