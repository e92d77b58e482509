"""Helpers for speech tests: a tiny Whisper built offline and spoken clips made with espeak-ng.

The model (WhisperForConditionalGeneration, d_model 64, two encoder and two decoder layers, 0.3M parameters) has a
byte-level BPE tokenizer trained with the ``tokenizers`` library on the test phrases and saved as a
WhisperTokenizer with Whisper's special tokens (``<|startoftranscript|>``, ``<|en|>``, ``<|transcribe|>``,
``<|notimestamps|>``...), so language and task settings work as on a real Whisper; its feature extractor takes
4-second windows (real Whisper: 30) to keep the encoder small. Built in a subprocess (this process plays the
dashboard, which never imports torch) and cached per checkout under .test-cache, like tests/support/models.py's tiny
Llama.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

from tests.support.env import ROOT, run_python
from tests.support.models import built_once

TINY_WHISPER = ROOT / ".test-cache" / "tiny-whisper"
WINDOW_S = 4  # the tiny model's feature extractor window (chunk_length)
PHRASES = ("open the door", "close the window", "turn on the light", "play some music")
ESPEAK = shutil.which("espeak-ng")
NO_ESPEAK = "espeak-ng is not installed (apt-get install espeak-ng; .ci/run installs it)"

BUILD_TINY_WHISPER = textwrap.dedent("""
    import json, shutil, sys
    from pathlib import Path
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration,
                              WhisperProcessor, WhisperTokenizer)

    target, phrases, window = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    work = target.parent / (target.name + ".bpe")
    work.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(phrases * 4, trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.model.save(str(work))
    end = "<|endoftext|>"
    tokenizer = WhisperTokenizer(str(work / "vocab.json"), str(work / "merges.txt"), unk_token=end, bos_token=end,
                                 eos_token=end, pad_token=end)
    specials = ["<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
                "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in specials}
    extractor = WhisperFeatureExtractor(feature_size=80, chunk_length=window)
    torch.manual_seed(0)
    config = WhisperConfig(vocab_size=len(tokenizer), num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                           decoder_ffn_dim=128, max_source_positions=extractor.nb_max_frames // 2,
                           max_target_positions=64, pad_token_id=tokenizer.pad_token_id,
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                           decoder_start_token_id=ids["<|startoftranscript|>"], suppress_tokens=[],
                           begin_suppress_tokens=[])
    model = WhisperForConditionalGeneration(config)
    generation = model.generation_config
    generation.lang_to_id = {"<|en|>": ids["<|en|>"]}
    generation.task_to_id = {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}
    generation.no_timestamps_token_id = ids["<|notimestamps|>"]
    generation.is_multilingual = True
    generation.decoder_start_token_id = ids["<|startoftranscript|>"]
    generation.max_length = 64
    generation._from_model_config = False  # else loading rebuilds it from config.json, without these ids
    model.save_pretrained(target)
    WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(target)
    shutil.rmtree(work)
    print("ok", target)
""")


@built_once
def build_tiny_whisper(target: Path = TINY_WHISPER) -> Path:
    """The tiny Whisper folder (config, weights, generation config, processor), built once per checkout."""
    if (target / "model.safetensors").exists() and (target / "tokenizer_config.json").exists():
        return target
    result = run_python(BUILD_TINY_WHISPER, str(target), json.dumps(list(PHRASES)), str(WINDOW_S))
    assert result.returncode == 0, result.stderr[-3000:]
    return target


TINY_CSM = ROOT / ".test-cache" / "tiny-csm"

BUILD_TINY_CSM = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (CsmConfig, CsmForConditionalGeneration, CsmProcessor, EncodecFeatureExtractor,
                              MimiConfig, PreTrainedTokenizerFast)
    from trainer_core.worker.methods.stt import decode

    target, phrases, clips = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>", "<|pad|>"]
    bpe.train_from_iterator(phrases * 4, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|begin_of_text|>",
                                        eos_token="<|end_of_text|>", pad_token="<|pad|>")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in specials}
    torch.manual_seed(0)
    codebooks, size = 4, 64
    # Mimi's own strides (8, 6, 5, 4 and the 2x downsample: 12.5 frames a second at 24 kHz), tiny widths
    mimi = MimiConfig(hidden_size=32, num_filters=4, num_residual_layers=1, upsampling_ratios=[8, 6, 5, 4],
                      codebook_size=size, codebook_dim=16, num_quantizers=codebooks, num_semantic_quantizers=1,
                      vector_quantization_hidden_dimension=16, upsample_groups=32, num_hidden_layers=1,
                      intermediate_size=64, num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    depth = dict(num_codebooks=codebooks, backbone_hidden_size=64, vocab_size=size, hidden_size=32,
                 intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                 max_position_embeddings=codebooks + 1)
    config = CsmConfig(num_codebooks=codebooks, vocab_size=size, codebook_size=size, text_vocab_size=len(tokenizer),
                       hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=512, pad_token_id=ids["<|pad|>"],
                       codebook_pad_token_id=size - 1, codebook_eos_token_id=0, bos_token_id=ids["<|begin_of_text|>"],
                       audio_token_id=ids["<|AUDIO|>"], audio_eos_token_id=ids["<|audio_eos|>"],
                       depth_decoder_config=depth, codec_config=mimi.to_dict())
    model = CsmForConditionalGeneration(config)
    # A fresh Mimi's codebooks are all zero (every frame would be code 0, the end frame): each quantizer's codebook
    # is drawn from what it sees on real speech, layer by layer (the residual of one is the input of the next).
    codec, waves = model.codec_model, [torch.tensor(decode(c, 24000)) for c in clips]
    quantizers = [*codec.quantizer.semantic_residual_vector_quantizer.layers,
                  *codec.quantizer.acoustic_residual_vector_quantizer.layers]
    for layer in quantizers:
        seen, original = [], layer.codebook.encode
        def record(hidden, original=original, seen=seen):
            seen.append(hidden.reshape(-1, hidden.shape[-1]).detach().clone())
            return original(hidden)
        layer.codebook.encode = record
        with torch.no_grad():
            for wave in waves:
                codec.encode(wave[None, None])
        del layer.codebook.encode
        vectors = torch.cat(seen)
        picked = vectors[torch.randint(len(vectors), (size,))]
        layer.codebook.embed_sum.copy_(picked + 0.01 * vectors.std() * torch.randn(picked.shape))
        layer.codebook.cluster_usage.fill_(1.0)
    template = ("{%- for message in messages -%}"
                "{{- '<|begin_of_text|>[' + message['role'] + ']' -}}"
                "{%- for c in message['content'] -%}{%- if c['type'] == 'text' -%}{{- c['text'] -}}{%- endif -%}"
                "{%- endfor -%}{{- '<|end_of_text|>' -}}"
                "{%- for c in message['content'] -%}{%- if c['type'] == 'audio' -%}{{- '<|AUDIO|><|audio_eos|>' -}}"
                "{%- endif -%}{%- endfor -%}{%- endfor -%}")
    model.generation_config.max_length = 512
    model.save_pretrained(target)
    CsmProcessor(feature_extractor=EncodecFeatureExtractor(feature_size=1, sampling_rate=24000), tokenizer=tokenizer,
                 chat_template=template).save_pretrained(target)
    print("ok", target, sum(p.numel() for p in model.parameters()))
""")


@built_once
def build_tiny_csm(target: Path = TINY_CSM) -> Path:
    """A tiny Sesame CSM (backbone 64 wide, 2 layers; depth decoder 1 layer; a Mimi codec with Mimi's strides and
    4 codebooks of 64 codes drawn from espeak-ng speech; a byte-level BPE tokenizer with CSM's special tokens and
    chat template), built once per checkout. Needs espeak-ng (its codebooks are drawn from spoken phrases)."""
    if (target / "model.safetensors").exists() and (target / "tokenizer_config.json").exists():
        return target
    clips = [speak(p, target.parent / "tiny-csm.clips" / f"{i}.wav", speed=150 + 20 * i)
             for i, p in enumerate(PHRASES)]
    result = run_python(BUILD_TINY_CSM, str(target), json.dumps(list(PHRASES)), json.dumps([str(c) for c in clips]))
    assert result.returncode == 0, result.stderr[-3000:]
    shutil.rmtree(target.parent / "tiny-csm.clips", ignore_errors=True)
    return target


def speak(text: str, path: Path, speed: int = 175, pitch: int = 50, voice: str = "en") -> Path:
    """``text`` spoken by espeak-ng into a WAV file (22.05 kHz mono, 16-bit)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([ESPEAK, "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(path), text], check=True,
                   capture_output=True, timeout=60)
    return path


def spoken_rows(folder: Path, phrases=PHRASES, variants=((175, 50), (150, 40), (200, 60))) -> list[dict]:
    """Every phrase spoken at a few speeds and pitches, saved under ``folder``: rows {audio (relative path), text}."""
    rows = []
    for p, phrase in enumerate(phrases):
        for v, (speed, pitch) in enumerate(variants):
            name = f"clip-{p}-{v}.wav"
            speak(phrase, folder / name, speed=speed, pitch=pitch)
            rows.append({"audio": name, "text": phrase})
    return rows
