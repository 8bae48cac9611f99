"""Write a tiny, weightless Qwen3-Omni model directory and a CPU deploy file for vLLM-Omni.

    python make_tiny_qwen3_omni.py OUT_DIR

OUT_DIR/model   config.json (Qwen3OmniMoeForConditionalGeneration: thinker -> talker ->
                code2wav, every size shrunk), a byte-level BPE tokenizer, the processor's
                configs and chat template. No weights: serve with ``--load-format dummy``.
OUT_DIR/deploy.yaml  vLLM-Omni's Qwen3-Omni deploy, made to run on the CPU (see below).

The token ids vLLM-Omni hard-codes for Qwen (im_start 151644 .. audio_pad 151675, "user"
872, "system" 8948, "assistant" 77091, "\\n" 198) are where the real tokenizer has them;
the rest of the 152064-row vocabulary is ``<|filler_N|>`` tokens, so random weights
generate filler text. Runs in a vLLM-Omni venv (transformers, tokenizers).
"""
from __future__ import annotations

import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (PreTrainedTokenizerFast, Qwen2VLImageProcessor, WhisperFeatureExtractor)
from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as qcfg

TEXT_VOCAB = 152064  # the thinker's vocabulary rows (Qwen3-Omni's)
REGULAR = 151643  # ids below are regular tokens; from here the special ones
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
           "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
           "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
           "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
           "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
           "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>",
           "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>",
           "<|audio_pad|>"]  # 151643 .. 151675
ROLE_WORDS = {"user": 872, "system": 8948, "assistant": 77091}

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ('audio', 'audio_url', 'input_audio') %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif part['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] in ('video', 'video_url') %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable-character table, in its vocabulary order (so "\\n" is 198)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {c: i for i, c in enumerate(_byte_chars())}
    merges: list[tuple[str, str]] = []
    free = iter(i for i in range(256, REGULAR) if i not in ROLE_WORDS.values())
    for word, wid in ROLE_WORDS.items():  # merges that spell each role word as one token
        for k in range(2, len(word) + 1):
            piece = word[:k]
            merges.append((word[:k - 1], word[k - 1]))
            if piece not in vocab:
                vocab[piece] = wid if k == len(word) else next(free)
    used = set(vocab.values())
    for i in range(REGULAR):
        if i not in used:
            vocab[f"<|filler_{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    assert tok.token_to_id("<|im_start|>") == 151644 and tok.token_to_id("<|audio_pad|>") == 151675
    extra = {"image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>",
             "video_token": "<|video_pad|>", "vision_bos_token": "<|vision_start|>",
             "vision_eos_token": "<|vision_end|>", "audio_bos_token": "<|audio_start|>",
             "audio_eos_token": "<|audio_end|>"}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   extra_special_tokens=extra, chat_template=CHAT_TEMPLATE,
                                   model_max_length=32768)
    ids = fast("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    assert ids[:3] == [151644, 872, 198] and 77091 in ids, ids
    return fast


def _text(vocab: int, hidden: int, **kw) -> dict:
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,  # vLLM's CPU attention: head_dim >= 32
                moe_intermediate_size=hidden // 2, num_experts=4, num_experts_per_tok=2,
                max_position_embeddings=32768, **kw)


def config() -> qcfg.Qwen3OmniMoeConfig:
    h = 128
    mrope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [6, 5, 5],
             "interleaved": True, "mrope_interleaved": True}
    thinker = dict(
        audio_config=dict(num_mel_bins=128, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                          d_model=64, output_dim=h, downsample_hidden_size=16, n_window=50,
                          n_window_infer=800, conv_chunksize=500, max_source_positions=1500),
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=h,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                           num_position_embeddings=2304, deepstack_visual_indexes=[0],
                           image_size=768, apply_vit_abs_pos_embed=True),
        text_config=_text(TEXT_VOCAB, h, rope_parameters=mrope),
        audio_token_id=151675, image_token_id=151655, video_token_id=151656,
        audio_start_token_id=151669, audio_end_token_id=151670, vision_start_token_id=151652,
        vision_end_token_id=151653, user_token_id=872, position_id_per_seconds=13)
    talker = dict(
        text_config=_text(3072, h, rope_parameters=mrope, shared_expert_intermediate_size=h),
        code_predictor_config=dict(vocab_size=2048, hidden_size=h, intermediate_size=2 * h, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=h // 4,
                                   num_code_groups=16),
        num_code_groups=16, thinker_hidden_size=h, accept_hidden_layer=1,
        codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_nothink_id=2155,
        codec_think_bos_id=2156, codec_think_eos_id=2157,
        audio_token_id=151675, image_token_id=151655, video_token_id=151656,
        vision_start_token_id=151652, audio_start_token_id=151669, position_id_per_seconds=13,
        speaker_id={"chelsie": 2301, "ethan": 2302, "aiden": 2303})
    code2wav = dict(codebook_size=2048, hidden_size=h, num_hidden_layers=1, num_attention_heads=4,
                    num_key_value_heads=4, intermediate_size=2 * h, num_quantizers=16,
                    upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=h,
                    sliding_window=72, max_position_embeddings=8000)
    cfg = qcfg.Qwen3OmniMoeConfig(thinker_config=thinker, talker_config=talker, code2wav_config=code2wav,
                                  enable_audio_output=True)
    cfg.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    cfg.dtype = "bfloat16"
    return cfg


DEPLOY = """\
# vLLM-Omni's Qwen3-Omni deploy (thinker -> talker -> code2wav, async chunks over the
# SharedMemoryConnector), sized for a tiny random-weight model on a CPU-only machine.
# Per-stage max_model_len lives here only: a top-level --max-model-len overrides every
# stage, and code2wav needs 16 quantizers x (25 left + 25 new frames) = 800 positions.
async_chunk: true

connectors:
  connector_of_shared_memory:
    name: SharedMemoryConnector
    extra:
      initial_codec_chunk_frames: 4
      codec_chunk_frames: 25
      codec_left_context_frames: 25

stages:
  - stage_id: 0
    max_model_len: 4096
    # a step takes every waiting prompt whole (16 x 4096 tokens): no chunked prefill, so
    # a request's thinker steps (and save_async calls) are its output tokens
    max_num_batched_tokens: 65536
    max_num_seqs: 32
    kv_cache_memory_bytes: 134217728
    moe_backend: auto
    load_format: dummy
    enforce_eager: true
    trust_remote_code: true
    enable_prefix_caching: false
    default_sampling_params:
      temperature: 0.0
      max_tokens: 2048

  - stage_id: 1
    max_model_len: 4096
    max_num_batched_tokens: 65536
    max_num_seqs: 32
    kv_cache_memory_bytes: 134217728
    moe_backend: auto
    load_format: dummy
    enforce_eager: true
    trust_remote_code: true
    enable_prefix_caching: false
    input_connectors:
      from_stage_0: connector_of_shared_memory
    default_sampling_params:
      # no per-request seed: a seeded request gets its own torch.Generator, and a CPU
      # generator has no offset to rewind when a chunked prefill's sample is discarded
      # ("CPU Generator does not use offset" kills the stage on prompts > 4096 tokens in
      # flight)
      temperature: 0.9
      top_k: 50
      # random weights never sample the codec EOS on purpose: 60 codec frames = 4 audio
      # chunks (4 + 25 + 25 + 6 frames, 2.4 s of audio) per request
      max_tokens: 60
      repetition_penalty: 1.05

  - stage_id: 2
    max_model_len: 8192
    max_num_batched_tokens: 65536
    max_num_seqs: 32
    kv_cache_memory_bytes: 134217728
    load_format: dummy
    enforce_eager: true
    trust_remote_code: true
    enable_prefix_caching: false
    enable_chunked_prefill: false
    async_scheduling: false
    input_connectors:
      from_stage_1: connector_of_shared_memory
    default_sampling_params:
      temperature: 0.0
      top_p: 1.0
      top_k: -1
      max_tokens: 65536
      repetition_penalty: 1.1
"""


def main(out: str) -> None:
    model = os.path.join(out, "model")
    os.makedirs(model, exist_ok=True)
    config().save_pretrained(model)
    tok = tokenizer()
    tok.save_pretrained(model)
    WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300,
                            return_attention_mask=True).save_pretrained(model)
    image = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2,
                                  min_pixels=3136, max_pixels=12845056)
    image_cfg = image.to_dict()
    with open(os.path.join(model, "preprocessor_config.json")) as f:  # Whisper's, written above
        merged = {**json.load(f), **image_cfg,
                  "processor_class": "Qwen3OmniMoeProcessor",
                  "feature_extractor_type": "WhisperFeatureExtractor",
                  "image_processor_type": "Qwen2VLImageProcessor"}
    with open(os.path.join(model, "preprocessor_config.json"), "w") as f:
        json.dump(merged, f, indent=2)
    with open(os.path.join(model, "video_preprocessor_config.json"), "w") as f:
        json.dump({**image_cfg, "video_processor_type": "Qwen2VLVideoProcessor",
                   "processor_class": "Qwen3OmniMoeProcessor"}, f, indent=2)
    with open(os.path.join(model, "chat_template.json"), "w") as f:
        json.dump({"chat_template": CHAT_TEMPLATE}, f)
    with open(os.path.join(model, "generation_config.json"), "w") as f:
        json.dump({"do_sample": False, "eos_token_id": [151645, 151643], "pad_token_id": 151643}, f)
    with open(os.path.join(out, "deploy.yaml"), "w") as f:
        f.write(DEPLOY)
    print(f"tiny Qwen3-Omni: {model}; deploy: {os.path.join(out, 'deploy.yaml')}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_qwen3_omni.py OUT_DIR")
    main(sys.argv[1])
