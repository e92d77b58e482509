"""The export's weight stages (trainer_core/worker/export.py): the adapter zipped as it is, and the merged 16-bit
folder — an adapter merged into its base (or a full fine-tune re-saved) with its tokenizer or processor; a
text-to-speech model speaks its verify sentences before it is saved, so verify can compare the reloaded folder."""
from __future__ import annotations

import shutil

from trainer_core.worker.export_plan import Plan, Staged
from trainer_core.worker.export_probes import speak_sentences

# the child between fork and exec calls only what is already resolved























# The merge of each model kind whose folder is more than a transformers model with its tokenizer (trainer_core.kinds);
# the others merge their adapter into the base, or save a full fine-tune again, in the export's dtype.
OWN_MERGES = {"embedding": "merge_sentence_transformers", "tts": "merge_speaker"}


class Merging:
    """ExportWorker's adapter and merged stages."""

    # ------------------------------------------------------------------ stages
    def zip_weights(self, plan: Plan) -> None:
        folder = plan.resolved.weights_dir
        kind = "adapter" if plan.resolved.adapter_dir else "model"
        name = f"{plan.stem}-{kind}"
        shutil.make_archive(str(plan.staging / name), "zip", root_dir=folder)
        what = "the LoRA adapter folder (apply it to the base model with PEFT)" if kind == "adapter" else \
            "the full fine-tuned model folder"
        plan.staged.append(Staged(f"{name}.zip", "adapter", kind, what))

    def merge(self, plan: Plan) -> None:
        """16-bit weights: the adapter merged into the base loaded in 16 bits (never into 4-bit weights, also
        for a QLoRA run: load_source loads the base unquantized)."""
        from trainer_core.worker.sources import MERGED_MARKER, merge_adapter

        own = OWN_MERGES.get(plan.resolved.kind.name)  # a kind whose folder is not a transformers model's alone
        if own is not None:
            getattr(self, own)(plan)
            return
        dtype = plan.spec.merged_dtype
        target = plan.merged_dir
        if plan.resolved.adapter_dir is not None:
            merge_adapter(plan.resolved, target, dtype, log=self.log)
            (target / MERGED_MARKER).unlink(missing_ok=True)  # a cache stamp, not part of the model
        else:
            import torch

            from trainer_core.worker.sources import auto_class

            folder = str(plan.resolved.model_dir)
            model = auto_class(folder).from_pretrained(folder, dtype=getattr(torch, dtype))
            model.save_pretrained(target, safe_serialization=True)
            plan.tokenizer.save_pretrained(target)
            if plan.resolved.kind.processor:  # images or audio: the processor belongs to the model
                from transformers import AutoProcessor

                AutoProcessor.from_pretrained(folder).save_pretrained(target)
            del model
        if "merged" in plan.spec.targets:
            what = "with its processor: load with WhisperForConditionalGeneration and WhisperProcessor" \
                if plan.resolved.output == "speech" else "with the tokenizer: load with transformers"
            plan.staged.append(Staged("merged", "merged", dtype, f"merged weights ({dtype} safetensors) {what}"))

    def merge_sentence_transformers(self, plan: Plan) -> None:
        """An embedding run: a full fine-tune's sentence-transformers folder, saved again (a LoRA one is refused
        before start: kinds' lora_merge_refusal)."""
        from sentence_transformers import SentenceTransformer

        SentenceTransformer(str(plan.resolved.model_dir), device="cpu").save(str(plan.merged_dir))
        if "merged" in plan.spec.targets:
            plan.staged.append(Staged("merged", "merged", "sentence-transformers", "the sentence-transformers "
                                      "folder (modules, pooling, tokenizer): SentenceTransformer(path) loads it"))

    def merge_speaker(self, plan: Plan) -> None:
        """A text-to-speech model (Sesame CSM): a LoRA run's adapter merged into CsmForConditionalGeneration (PEFT's
        merge_and_unload), a full fine-tune's model as it is; in the export's dtype, saved with the run's processor.
        With verify on, the model speaks the verify sentences before the folder is used again: the reloaded folder
        must speak them sample for sample alike (verify_audio)."""
        import torch
        from transformers import AutoProcessor

        from trainer_core.worker.sources import load_source, processor_folder

        dtype = plan.spec.merged_dtype
        target = plan.merged_dir
        model, _ = load_source(plan.resolved, "cpu", log=self.log)  # the base from the run's config, not the
        if plan.resolved.adapter_dir is not None:  # adapter_config's base_model_name_or_path
            self.log(f"merging the adapter {plan.resolved.adapter_dir} into its base model")
            model = model.merge_and_unload()
        processor = AutoProcessor.from_pretrained(processor_folder(plan.resolved, plan.base_dir))
        if plan.spec.verify:
            # Spoken in float32 from the weights as they are saved (rounded to the export's dtype in place), as the
            # reloaded folder is loaded: a CPU has no fast half-precision kernels. Only the saved tensors are
            # rounded; buffers that are not saved (rotary frequencies) stay as a fresh load computes them.
            with torch.no_grad():
                for tensor in model.state_dict().values():
                    if tensor.is_floating_point():
                        tensor.copy_(tensor.to(getattr(torch, dtype)))
            plan.spoken = speak_sentences(model, processor, plan.resolved.config)
        model.to(getattr(torch, dtype)).save_pretrained(target, safe_serialization=True)
        processor.save_pretrained(target)
        del model
        plan.staged.append(Staged("merged", "merged", dtype, f"merged weights ({dtype} safetensors, the Mimi codec "
                                  "inside) with the processor: load with transformers' CsmForConditionalGeneration "
                                  "and AutoProcessor (llama.cpp cannot run CSM)"))

