"""The export's verify (trainer_core/worker/export.py): what was written is loaded back and must behave as the run's
model — greedy answers token for token (merged, GGUF; llama.cpp's own answers where it is installed; the chat template
in each GGUF's metadata, tools included: export_template_check), transcripts of
the run's clips (speech), spoken clips sample for sample (text-to-speech), answers to the run's image rows (vision),
embeddings within a cosine tolerance (embedding models)."""
from __future__ import annotations

from pathlib import Path

from trainer_core.config import promptsets
from trainer_core.protocol import events as ev
from trainer_core.worker import export_template_check
from trainer_core.worker.export_plan import ExportError, Plan
from trainer_core.worker.export_probes import (answer_image, chat_prompt, embedding_texts, generate, generate_ids,
                                               has_llama_cpp, llama_cpp_answers, llama_cpp_image_answers,
                                               processor_prompt, speak_sentences,
                                               speech_clips, transcribe_clip, vision_prompts)

# A vision model's language GGUF is compared with the merged model (itself compared with the adapter on image rows).
VISION_TEXT_UNIT = "text answers identical to the merged model's"


# The verify stage of each model kind (trainer_core.kinds): what "the exported model behaves as the run's" means
# for it. A kind without its own replays prompts as a text model. tests/kinds checks every kind has an entry.
VERIFIERS = {"text": "verify_text", "vision": "verify_vision", "speech": "verify_speech", "tts": "verify_audio",
             "embedding": "verify_embedding", "reward": "verify_text"}


class Verification:
    """ExportWorker's verify stage, one method per kind of model."""

    def verify(self, plan: Plan) -> None:
        """Reload every exported format and compare it with the unmerged run, as the model's kind behaves."""
        getattr(self, VERIFIERS.get(plan.resolved.kind.name, "verify_text"))(plan)

    def verify_text(self, plan: Plan) -> None:
        """Reload every exported format and replay the prompt set greedily next to the unmerged adapter."""
        import torch

        from trainer_core.worker.sources import load_source

        prompts = list(promptsets.load(plan.spec.prompt_set).prompts)
        model, tokenizer = load_source(plan.resolved, "cpu", log=self.log)
        reference = [generate(model, tokenizer, p, plan.spec.max_new_tokens) for p in prompts]
        del model
        formats: list[tuple[str, Path, str | None]] = []
        if "merged" in plan.spec.targets:
            formats.append(("merged", plan.merged_dir, None))
        formats += [(f"gguf {s.detail}", plan.staging, s.name) for s in plan.staged if s.artifact == "gguf"]
        from transformers import AutoModelForCausalLM, AutoTokenizer

        for label, folder, gguf_file in formats:
            self.check_control()
            try:
                model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_file, dtype=torch.float32)
                tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
            except Exception as exc:  # noqa: BLE001 - any load failure fails the export, with its reason
                what = f"the GGUF {gguf_file}" if gguf_file else "the merged model"
                raise ExportError(f"{what} cannot be loaded back ({type(exc).__name__}: {str(exc)[:300]}): the "
                                  "export failed and nothing was published") from None
            model.eval()
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            answers = [generate(model, tok, p, plan.spec.max_new_tokens) for p in prompts]
            del model
            result = compare(label, prompts, reference, answers, tokenizer)
            self.report_verify(plan, result)
            if gguf_file is not None and has_llama_cpp():
                texts = [tokenizer.decode(r, skip_special_tokens=True) for r in reference]
                self.check_control()
                answers = llama_cpp_answers(folder / gguf_file, [chat_prompt(tok, p) for p in prompts],
                                            plan.spec.max_new_tokens)
                self.report_verify(plan, compare_texts(f"{label} (llama.cpp)", prompts, texts, answers))
        for label, folder, gguf_file in formats:  # the jinja template llama.cpp and Ollama read from each GGUF
            if gguf_file is not None:
                self.check_control()
                self.report_verify(plan, export_template_check.check(
                    label, export_template_check.read_template(folder / gguf_file), tokenizer.chat_template,
                    tokenizer.bos_token or "", tokenizer.eos_token or ""))

    def verify_speech(self, plan: Plan) -> None:
        """A speech model: the merged folder reloaded (with its processor) transcribes the run's own clips (its eval
        clips, else its first training clips) exactly as the source does."""
        import torch
        from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

        from trainer_core.worker.sources import load_source, processor_folder

        names, clips = speech_clips(plan.resolved.config)
        source_processor = AutoProcessor.from_pretrained(processor_folder(plan.resolved, plan.base_dir))
        model, _ = load_source(plan.resolved, "cpu", log=self.log)
        reference = [transcribe_clip(model, source_processor, clip, plan.spec.max_new_tokens) for clip in clips]
        del model
        self.check_control()
        try:
            merged = AutoModelForSpeechSeq2Seq.from_pretrained(str(plan.merged_dir), dtype=torch.float32).eval()
            processor = AutoProcessor.from_pretrained(str(plan.merged_dir))
        except Exception as exc:  # noqa: BLE001 - any load failure fails the export, with its reason
            raise ExportError(f"the merged model cannot be loaded back with its processor ({type(exc).__name__}: "
                              f"{str(exc)[:300]}): the export failed and nothing was published") from None
        answers = [transcribe_clip(merged, processor, clip, plan.spec.max_new_tokens) for clip in clips]
        self.report_verify(plan, compare_texts("merged", names, reference, answers))

    def verify_audio(self, plan: Plan) -> None:
        """A text-to-speech model: the merged folder reloaded with its processor speaks the verify sentences, with the
        same seed, sample for sample as the model did before it was saved (merge_speaker)."""
        import torch
        from transformers import AutoProcessor

        from trainer_core.worker.sources import auto_class

        self.check_control()
        folder = str(plan.merged_dir)
        try:
            model = auto_class(folder).from_pretrained(folder, dtype=torch.float32).eval()
            processor = AutoProcessor.from_pretrained(folder)
        except Exception as exc:  # noqa: BLE001 - any load failure fails the export, with its reason
            raise ExportError(f"the merged model cannot be loaded back with its processor ({type(exc).__name__}: "
                              f"{str(exc)[:300]}): the export failed and nothing was published") from None
        spoken = speak_sentences(model, processor, plan.resolved.config)
        rate = int(processor.feature_extractor.sampling_rate)
        self.log("verify: the reloaded folder spoke " + ", ".join(f"{text[:40]!r} for {len(clip) / rate:.2f} s"
                                                                  for text, clip, _ in spoken))
        self.report_verify(plan, compare_clips("merged", plan.spoken, spoken, rate))

    def verify_vision(self, plan: Plan) -> None:
        """A vision-language model: the merged folder reloaded with its processor answers the run's own image rows
        (their questions and images, greedily) token for token as the run's model does."""
        import torch
        from transformers import AutoProcessor

        from trainer_core.worker.sources import auto_class, load_source, processor_folder

        names, prompts = vision_prompts(plan.resolved.config)
        model, _ = load_source(plan.resolved, "cpu", log=self.log)
        processor = AutoProcessor.from_pretrained(processor_folder(plan.resolved, plan.base_dir))
        reference = [answer_image(model, processor, p, plan.spec.max_new_tokens) for p in prompts]
        del model
        self.check_control()
        try:
            merged = auto_class(str(plan.merged_dir)).from_pretrained(str(plan.merged_dir), dtype=torch.float32).eval()
            merged_processor = AutoProcessor.from_pretrained(str(plan.merged_dir))
        except Exception as exc:  # noqa: BLE001 - any load failure fails the export, with its reason
            raise ExportError(f"the merged model cannot be loaded back with its processor ({type(exc).__name__}: "
                              f"{str(exc)[:300]}): the export failed and nothing was published") from None
        answers = [answer_image(merged, merged_processor, p, plan.spec.max_new_tokens) for p in prompts]
        self.report_verify(plan, compare("merged", names, reference, answers, processor.tokenizer))
        ggufs = [s for s in plan.staged if s.artifact == "gguf"]
        if ggufs:
            self.verify_vision_gguf(plan, merged, merged_processor, ggufs)
            self.verify_mmproj(plan)
            mmproj = next((s for s in plan.staged if s.artifact == "mmproj"), None)
            if has_llama_cpp() and mmproj is not None:  # the pair as llama.cpp runs it, on the run's image rows
                expected = [merged_processor.tokenizer.decode(a, skip_special_tokens=True) for a in answers]
                for item in ggufs:
                    self.check_control()
                    said = llama_cpp_image_answers(plan.staging / item.name, plan.staging / mmproj.name, prompts,
                                                   plan.spec.max_new_tokens)
                    result = compare_texts(f"gguf {item.detail} + mmproj (llama.cpp)", names, expected, said)
                    self.report_verify(plan, {**result, "unit": "image answers identical to the merged model's"})

    def verify_vision_gguf(self, plan: Plan, merged, processor, ggufs: list) -> None:
        """A vision-language model's language GGUF, loaded back with its own tokenizer, answers the prompt set's text
        prompts token for token as the merged model does (the images are the mmproj's, checked after)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        prompts = list(promptsets.load(plan.spec.prompt_set).prompts)
        texts = [processor_prompt(processor, p) for p in prompts]
        reference = [generate_ids(merged, processor.tokenizer, t, plan.spec.max_new_tokens) for t in texts]
        for item in ggufs:
            self.check_control()
            try:
                model = AutoModelForCausalLM.from_pretrained(str(plan.staging), gguf_file=item.name,
                                                             dtype=torch.float32).eval()
                tok = AutoTokenizer.from_pretrained(str(plan.staging), gguf_file=item.name)
            except Exception as exc:  # noqa: BLE001 - any load failure fails the export, with its reason
                raise ExportError(f"the GGUF {item.name} cannot be loaded back ({type(exc).__name__}: "
                                  f"{str(exc)[:300]}): the export failed and nothing was published") from None
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            answers = [generate_ids(model, tok, t, plan.spec.max_new_tokens) for t in texts]
            del model
            result = compare(f"gguf {item.detail}", prompts, reference, answers, processor.tokenizer)
            self.report_verify(plan, {**result, "unit": VISION_TEXT_UNIT})
            if has_llama_cpp():
                self.check_control()
                said = llama_cpp_answers(plan.staging / item.name, texts, plan.spec.max_new_tokens)
                expected = [processor.tokenizer.decode(r, skip_special_tokens=True) for r in reference]
                self.report_verify(plan, {**compare_texts(f"gguf {item.detail} (llama.cpp)", prompts, expected, said),
                                          "unit": VISION_TEXT_UNIT})

    def verify_embedding(self, plan: Plan) -> None:
        """An embedding model: each exported folder reloaded with sentence-transformers (the ONNX one with
        backend="onnx", in the embedding venv) embeds the run's own texts as the run's PyTorch model does (cosine
        similarity of each pair of vectors at least EMBED_TOLERANCE)."""
        from sentence_transformers import SentenceTransformer

        texts = embedding_texts(plan.resolved.config)
        source = SentenceTransformer(str(plan.resolved.model_dir), device="cpu")
        reference = source.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        del source
        if "merged" in plan.spec.targets:
            self.check_control()
            self.verify_merged_embedding(plan, texts, reference)
        if "onnx" in plan.spec.targets:
            self.check_control()
            vectors = self.onnx_vectors(plan, texts)
            self.report_verify(plan, compare_vectors("onnx", texts, reference, vectors))

    def verify_merged_embedding(self, plan: Plan, texts: list[str], reference) -> None:
        from sentence_transformers import SentenceTransformer

        try:
            exported = SentenceTransformer(str(plan.merged_dir), device="cpu")
        except Exception as exc:  # noqa: BLE001 - any load failure fails the export, with its reason
            raise ExportError(f"the exported folder cannot be loaded back with sentence-transformers "
                              f"({type(exc).__name__}: {str(exc)[:300]}): the export failed and nothing was "
                              "published") from None
        vectors = exported.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        self.report_verify(plan, compare_vectors("merged", texts, reference, vectors))

    def report_verify(self, plan: Plan, result: dict) -> None:
        plan.verify.append(result)
        self.events.emit(ev.VerifyEvent(**result))
        self.log(f"verify {result['format']}: {result['identical']}/{result['total']} identical")
        if result["identical"] < result["total"] and result.get("unit"):
            self.warn(f"{result['format']}: only {result['identical']}/{result['total']} {result['unit']}; first "
                      f"difference: {result['first_difference']}")
        elif result["identical"] < result["total"]:
            self.warn(f"{result['format']} drifts from the adapter: {result['identical']}/{result['total']} greedy "
                      f"answers identical; first difference: {result['first_difference']}")






def compare(label: str, prompts: list[str], reference: list[list[int]], answers: list[list[int]],
            tokenizer) -> dict:
    """VerifyEvent fields: how many answers are token for token the adapter's, and where the first one parts."""
    identical = sum(a == r for a, r in zip(answers, reference))
    first = ""
    for i, (a, r) in enumerate(zip(answers, reference)):
        if a == r:
            continue
        at = next((j for j, (x, y) in enumerate(zip(a, r)) if x != y), min(len(a), len(r)))
        ref_tok = tokenizer.decode(r[at:at + 1]) if at < len(r) else "(end)"
        got_tok = tokenizer.decode(a[at:at + 1]) if at < len(a) else "(end)"
        first = f"prompt {i + 1} ({prompts[i][:40]!r}), token {at + 1}: adapter {ref_tok!r}, {label} {got_tok!r}"
        break
    return dict(format=label, identical=identical, total=len(reference), first_difference=first)






EMBED_TOLERANCE = 0.9999  # cosine similarity of a text's vectors from the run's model and the export: "identical"


def compare_vectors(label: str, texts: list[str], reference, vectors) -> dict:
    """VerifyEvent fields for normalized embeddings: how many texts' vectors are within EMBED_TOLERANCE of the
    reference's, and the first that is not."""
    if vectors.shape != reference.shape:
        return dict(format=label, identical=0, total=len(texts),
                    first_difference=f"vectors of shape {tuple(vectors.shape)}, expected {tuple(reference.shape)}")
    similarity = (reference * vectors).sum(axis=1)
    same = [bool(s >= EMBED_TOLERANCE) for s in similarity]
    first = next((f"text {i + 1} ({texts[i][:40]!r}): cosine {similarity[i]:.6f}"
                  for i, ok in enumerate(same) if not ok), "")
    return dict(format=label, identical=sum(same), total=len(texts), first_difference=first)




















def compare_clips(label: str, reference: list[tuple[str, object, bool]], spoken: list[tuple[str, object, bool]],
                  rate: int) -> dict:
    """VerifyEvent fields for spoken clips: how many are sample for sample the reference's, and where the first one
    parts (in seconds)."""
    import numpy as np

    identical, first = 0, ""
    for i, ((text, ref, ref_ended), (_, got, got_ended)) in enumerate(zip(reference, spoken)):
        if ref_ended == got_ended and np.array_equal(ref, got):
            identical += 1
            continue
        if not first:
            apart = np.flatnonzero(ref[:len(got)] != got[:len(ref)])
            at = int(apart[0]) if len(apart) else min(len(ref), len(got))
            first = (f"sentence {i + 1} ({text[:40]!r}): apart from {at / rate:.2f} s; {len(ref) / rate:.2f} s before "
                     f"saving, {len(got) / rate:.2f} s reloaded")
    return dict(format=label, identical=identical, total=len(reference), first_difference=first)






def compare_texts(label: str, prompts: list[str], reference: list[str], answers: list[str]) -> dict:
    """VerifyEvent fields for a runtime that returns text: identical answers, and where the first one parts."""
    identical = sum(a == r for a, r in zip(answers, reference))
    first = ""
    for i, (a, r) in enumerate(zip(answers, reference)):
        if a != r:
            at = next((j for j, (x, y) in enumerate(zip(a, r)) if x != y), min(len(a), len(r)))
            first = (f"prompt {i + 1} ({prompts[i][:40]!r}), character {at + 1}: adapter {r[at:at + 12]!r}, "
                     f"{label} {a[at:at + 12]!r}")
            break
    return dict(format=label, identical=identical, total=len(reference), first_difference=first)

