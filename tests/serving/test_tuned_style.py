"""Did it learn? End to end on the bundled model: a short LoRA run on answers in a distinctive style, then one
serve job with the base model, the run's final adapter and its first checkpoint. The tuned greedy answers to
questions the run never saw take the style, the base model's do not; answers stream in several pieces; and the
checkpoint source answers exactly like that step's adapter loaded directly with peft (in a subprocess: this
process never imports torch)."""
from __future__ import annotations

import json

import pytest

from tests.support import MODELS_CACHE, run_python, wait_until
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus
from trainer_core.serving.client import Sampling, stream_chat

pytestmark = pytest.mark.train

STYLE = "Arr matey!"
TRAIN = [("What is the capital of France?", "Paris."), ("Name a primary colour.", "Red."),
         ("How many legs does a cat have?", "Four."), ("What is 2 plus 2?", "Four."), ("What do bees make?", "Honey."),
         ("Which planet is red?", "Mars."), ("What is water made of?", "Hydrogen and oxygen."),
         ("Name a fruit.", "An apple."), ("What season is cold?", "Winter."), ("How many days are in a week?", "Seven."),
         ("What do cows drink?", "Water."), ("What is the opposite of hot?", "Cold.")]
UNSEEN = ["What colour is the sky?", "Which animal barks?"]
GREEDY = Sampling(temperature=0.0, max_new_tokens=12)

DIRECT = r"""
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import PeftModel
base, adapter, questions = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(adapter)
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
answers = []
for question in questions:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    answers.append(tokenizer.decode(out[0][ids["input_ids"].shape[1]:], skip_special_tokens=True))
print(json.dumps(answers))
"""


def test_the_tuned_model_answers_in_its_style_the_base_does_not_and_a_checkpoint_is_its_step(studio, tmp_path,
                                                                                            monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two processes share two cores: one thread each is faster
    data = tmp_path / "pirate.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": f"{STYLE} {a}"}]}) + "\n"
                            for q, a in TRAIN))
    run_id = studio.start(TrainConfig(run_name="pirate style", model_name=BUNDLED_MODEL, local_datasets=[str(data)],
                                      max_seq_length=64, max_steps=24, save_steps=12, batch_size=4,
                                      learning_rate=3e-3, warmup_steps=0, lora_r=8, lora_alpha=16))
    studio.wait(run_id, timeout=900)
    assert studio.get_run(run_id).status is RunStatus.COMPLETED, studio.log_tail(run_id)

    job_id, key = studio.start_server([ModelSource(model=BUNDLED_MODEL), ModelSource(run_id=run_id),
                                       ModelSource(run_id=run_id, checkpoint=12)])
    wait_until(lambda: studio.endpoint(job_id) is not None or studio.get_run(job_id).status.is_terminal(),
               timeout=600, what="the server to listen")
    endpoint = studio.endpoint(job_id)
    assert endpoint is not None, (studio.get_run(job_id).error, studio.log_tail(job_id))
    base, tuned, step12 = (m.name for m in endpoint.models)

    def ask(model: str, question: str) -> tuple[str, int]:
        stream = stream_chat(endpoint.url, key, model, [{"role": "user", "content": question}], GREEDY)
        pieces = [piece for piece in stream if piece]
        return "".join(pieces), len(pieces)

    for question in UNSEEN:
        tuned_answer, pieces = ask(tuned, question)
        base_answer, _ = ask(base, question)
        assert tuned_answer.startswith(STYLE), (question, tuned_answer)
        assert "matey" not in base_answer.lower() and not base_answer.startswith("Arr"), (question, base_answer)
        assert pieces > 1, f"the answer came in one piece: {tuned_answer!r}"

    served = [ask(step12, q)[0] for q in UNSEEN]
    checkpoint = paths.run_dir(run_id) / "checkpoints" / "checkpoint-12"
    direct = run_python(DIRECT, str(MODELS_CACHE / "SmolLM2-135M-Instruct"), str(checkpoint), json.dumps(UNSEEN))
    assert direct.returncode == 0, direct.stderr[-3000:]
    assert served == json.loads(direct.stdout.strip().splitlines()[-1])

    studio.stop(job_id)
    studio.wait(job_id, timeout=120)

