"""Write a tiny, weightless Qwen3-TTS model directory and a CPU deploy file for vLLM-Omni.

    python make_tiny_qwen3_tts.py OUT_DIR

OUT_DIR/model   config.json (Qwen3-TTS 12 Hz CustomVoice: talker -> code2wav, every size
                shrunk, one speaker "vivian"), the byte-level BPE tokenizer of
                make_tiny_qwen3_omni.py (the ids vLLM-Omni hard-codes for Qwen --
                im_start 151644, tts_pad/bos/eos 151671-151673, "assistant" 77091 -- where
                the real tokenizer has them) and speech_tokenizer/ (the 12 Hz codec's config
                and feature extractor). No weights: serve with ``--load-format dummy``.
OUT_DIR/deploy.yaml  vLLM-Omni's Qwen3-TTS deploy, made to run on the CPU (see below).

Runs in a vLLM-Omni venv (transformers, tokenizers).
"""
from __future__ import annotations

import json
import os
import sys

from transformers import EncodecFeatureExtractor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_qwen3_omni import TEXT_VOCAB, tokenizer  # noqa: E402  (the same Qwen ids)

HIDDEN, HEAD_DIM = 128, 32  # vLLM's CPU attention needs head_dim >= 32
SPEAKER, SPEAKER_ID = "vivian", 3065
CODEC_IDS = dict(codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154,
                 codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157)


def _talker() -> dict:
    return dict(
        model_type="qwen3_tts_talker", vocab_size=3072, text_vocab_size=TEXT_VOCAB, hidden_size=HIDDEN,
        text_hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=HEAD_DIM, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000, hidden_act="silu", num_code_groups=16, position_id_per_seconds=13,
        rope_scaling={"interleaved": True, "mrope_section": [6, 5, 5], "rope_type": "default"},
        code_predictor_config=dict(
            model_type="qwen3_tts_talker_code_predictor", vocab_size=2048, hidden_size=HIDDEN,
            intermediate_size=2 * HIDDEN, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            head_dim=HEAD_DIM, max_position_embeddings=65536, num_code_groups=16, rms_norm_eps=1e-6,
            rope_theta=1000000, hidden_act="silu"),
        spk_id={SPEAKER: SPEAKER_ID}, spk_is_dialect={SPEAKER: False},
        codec_language_id={"chinese": 2055, "english": 2050, "auto": 2050},
        **CODEC_IDS)


def config() -> dict:
    return dict(
        architectures=["Qwen3TTSForConditionalGeneration"], model_type="qwen3_tts",
        tokenizer_type="qwen3_tts_tokenizer_12hz", tts_model_size="0b6", tts_model_type="custom_voice",
        im_start_token_id=151644, im_end_token_id=151645, assistant_token_id=77091,
        tts_pad_token_id=151671, tts_bos_token_id=151672, tts_eos_token_id=151673,
        talker_config=_talker(),
        speaker_encoder_config=dict(mel_dim=128, enc_dim=HIDDEN, enc_channels=[64, 64, 64, 64, 192],
                                    enc_attention_channels=32, enc_se_channels=32, sample_rate=24000),
        torch_dtype="bfloat16")


def speech_tokenizer_config() -> dict:
    """The 12 Hz codec: a Mimi encoder (ref audio -> codes) and the code2wav decoder.
    24 kHz, 1920 samples per codec frame (encoder 8*6*5*4 * 2; decoder 8*5*4*3 * 2*2)."""
    encoder = dict(model_type="mimi", hidden_size=64, num_filters=8, num_residual_layers=1,
                   upsampling_ratios=[8, 6, 5, 4], codebook_size=2048, codebook_dim=64, num_quantizers=16,
                   vector_quantization_hidden_dimension=64, num_semantic_quantizers=1, upsample_groups=64,
                   num_hidden_layers=1, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2,
                   head_dim=32, sliding_window=250, _frame_rate=12.5)
    decoder = dict(codebook_size=2048, codebook_dim=64, hidden_size=64, latent_dim=64,
                   max_position_embeddings=8000, num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                   sliding_window=72, intermediate_size=128, num_hidden_layers=1, num_quantizers=16,
                   upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=64)
    return dict(architectures=["Qwen3TTSTokenizerV2Model"], model_type="qwen3_tts_tokenizer_12hz",
                encoder_config=encoder, decoder_config=decoder, encoder_valid_num_quantizers=16,
                input_sample_rate=24000, output_sample_rate=24000, decode_upsample_rate=1920,
                encode_downsample_rate=1920)


DEPLOY = """\
# vLLM-Omni's Qwen3-TTS deploy (talker -> code2wav, async chunks over the
# SharedMemoryConnector), sized for a tiny random-weight model on a CPU-only machine.
# Model runner v1 (vLLM-Omni's default for this model on CUDA is v2, which needs Triton);
# no talker_first_audio (CUDA only); both stages eager.
model_runner: v1
async_chunk: true

connectors:
  connector_of_shared_memory:
    name: SharedMemoryConnector
    extra:
      codec_streaming: true
      connector_get_sleep_s: 0.01
      connector_get_max_wait_first_chunk: 3000
      connector_get_max_wait: 300
      # must match the decoder's sliding attention window (72)
      codec_chunk_frames: 25
      codec_left_context_frames: 72
      initial_codec_chunk_frames: 4

stages:
  - stage_id: 0
    max_num_seqs: 32
    max_model_len: 4096
    max_num_batched_tokens: 65536
    kv_cache_memory_bytes: 134217728
    load_format: dummy
    enforce_eager: true
    trust_remote_code: true
    enable_prefix_caching: false
    async_scheduling: false
    output_connectors:
      to_stage_1: connector_of_shared_memory
    # no text-derived codec ceiling: a request without max_new_tokens that reaches
    # max_tokens (random weights always do) is served its audio, not failed for a
    # missing codec EOS
    additional_config:
      codec_budget_frames_per_text_token: 0
    default_sampling_params:
      temperature: 0.9
      top_k: 50
      # random weights never sample the codec EOS on purpose: at most 60 codec frames
      # (4 + 25 + 25 + 6: four audio chunks, 4.8 s at 12.5 frames/s) per request
      max_tokens: 60
      min_tokens: 2
      repetition_penalty: 1.05
    subtalker_sampling_params:
      do_sample: true
      temperature: 0.9
      top_k: 50
      top_p: 1.0

  - stage_id: 1
    dtype: bfloat16
    max_num_seqs: 32
    max_model_len: 65536
    max_num_batched_tokens: 65536
    kv_cache_memory_bytes: 134217728
    load_format: dummy
    enforce_eager: true
    trust_remote_code: true
    enable_prefix_caching: false
    async_scheduling: false
    input_connectors:
      from_stage_0: connector_of_shared_memory
    default_sampling_params:
      temperature: 0.0
      top_p: 1.0
      top_k: -1
      max_tokens: 65536
      repetition_penalty: 1.0
"""


def main(out: str) -> None:
    model = os.path.join(out, "model")
    speech = os.path.join(model, "speech_tokenizer")
    os.makedirs(speech, exist_ok=True)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(config(), f, indent=2)
    tokenizer().save_pretrained(model)
    with open(os.path.join(model, "generation_config.json"), "w") as f:
        json.dump({"do_sample": True, "temperature": 0.9, "top_k": 50, "max_new_tokens": 60}, f)
    with open(os.path.join(speech, "config.json"), "w") as f:
        json.dump(speech_tokenizer_config(), f, indent=2)
    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0).save_pretrained(speech)
    with open(os.path.join(out, "deploy.yaml"), "w") as f:
        f.write(DEPLOY)
    print(f"tiny Qwen3-TTS: {model}; deploy: {os.path.join(out, 'deploy.yaml')}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_qwen3_tts.py OUT_DIR")
    main(sys.argv[1])
