"""The model zoo: models nobody here wrote, built from configs with random weights, for tests and benchmarks.

    from kiln.testing import zoo
    model, inputs = zoo.build("llama", size="ci", attn="eager")   # (model.eval(), tuple of input tensors)
    out = model(*inputs)                                          # the transformers ModelOutput, cache included
    zoo.assert_close(compiled(*inputs), out)                      # every tensor leaf, by path

Two sources: ``transformers``' model code (BERT, GPT-2, LLaMA, T5, ViT, ResNet, ... from their configs: nothing
is downloaded, ``HF_HUB_OFFLINE=1``) and ``torch.nn``'s own attention modules (``nn.MultiheadAttention``,
``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``) on and off their inference fast path.

Sizes: ``"ci"`` (2 layers, hidden 64, batch 2 x sequence 16 with padding in the second row, 32x32 images: a few
seconds to compile) and ``"full"`` (the published base configs: BERT-base, GPT-2 small, T5-small, ViT-base,
ResNet-50, ...; batch 1, sequence 64, 224x224 images).  Weights are random (seeded), and every parameter a
config initializes to a constant (biases at 0, norms at 1) gets noise, so that a kernel reading the wrong bias
or scale cannot hide behind zeros and ones.  Each model is wrapped so it takes its inputs positionally
(``Call``): the benchmark runner and the tests call ``model(*inputs)``.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from kiln.testing.zoo_base import ATTENTIONS, SEED, SIZES, Spec, finish, text_shape  # noqa: F401  (zoo.SIZES etc.)

class Call(nn.Module):
    """``model(**dict(zip(names, inputs)), **fixed)``: a keyword-argument model called with positional tensors."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], **fixed: Any) -> None:
        super().__init__()
        self.model, self.names, self.fixed = model, names, fixed

    def forward(self, *inputs: Tensor) -> Any:
        return self.model(**dict(zip(self.names, inputs)), **self.fixed)


# ------------------------------------------------------------------------------------------- weights


# -------------------------------------------------------------------------------------------- inputs


def token_ids(vocab: int, batch: int, seq: int, generator: torch.Generator, pad: int | None = None,
              lengths: list[int] | None = None) -> Tensor:
    """Random token ids in ``[3, vocab)`` (clear of the usual special tokens 0-2), ``pad`` after each row's
    length."""
    ids = torch.randint(3, vocab, (batch, seq), generator=generator)
    if pad is not None and lengths is not None:
        for row, length in enumerate(lengths):
            ids[row, length:] = pad
    return ids


def padding_mask(batch: int, seq: int, lengths: list[int]) -> Tensor:
    """An ``int64`` attention mask: 1 for the first ``lengths[row]`` positions of each row, 0 after (right
    padding)."""
    return (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()


def text_inputs(config: Any, size: str, generator: torch.Generator) -> dict[str, Tensor]:
    """``input_ids`` and ``attention_mask`` for an encoder or decoder-only language model."""
    batch, seq, lengths = text_shape(size, generator.initial_seed())
    pad = getattr(config, "pad_token_id", None)
    return {"input_ids": token_ids(config.vocab_size, batch, seq, generator, pad, lengths),
            "attention_mask": padding_mask(batch, seq, lengths)}


def seq2seq_inputs(config: Any, size: str, generator: torch.Generator) -> dict[str, Tensor]:
    """Encoder ids and mask, and decoder ids half as long (teacher forcing)."""
    inputs = text_inputs(config, size, generator)
    batch, seq, _ = text_shape(size, generator.initial_seed())
    inputs["decoder_input_ids"] = token_ids(config.vocab_size, batch, seq // 2, generator)
    return inputs


def image_inputs(config: Any, size: str, generator: torch.Generator) -> dict[str, Tensor]:
    """``pixel_values``: standard-normal images (normalized pixels) of the config's size."""
    batch = 2 if size == "ci" else 1
    side = getattr(config, "image_size", 32 if size == "ci" else 224)
    return {"pixel_values": torch.randn(batch, config.num_channels, side, side, generator=generator)}


def clip_inputs(config: Any, size: str, generator: torch.Generator) -> dict[str, Tensor]:
    """CLIP: padded token ids for the text tower, images for the vision tower."""
    inputs = text_inputs(config.text_config, size, generator)
    inputs.update(image_inputs(config.vision_config, size, generator))
    return inputs


def whisper_inputs(config: Any, size: str, generator: torch.Generator) -> dict[str, Tensor]:
    """Log-mel features (the encoder's conv stem halves 2 x max_source_positions frames) and decoder ids."""
    batch = 2 if size == "ci" else 1
    frames = 2 * config.max_source_positions
    return {"input_features": torch.randn(batch, config.num_mel_bins, frames, generator=generator),
            "decoder_input_ids": token_ids(config.vocab_size, batch, 8 if size == "ci" else 32, generator)}


def audio_inputs(config: Any, size: str, generator: torch.Generator) -> dict[str, Tensor]:
    """Raw waveforms: 1600 samples in CI, one second at 16 kHz at full size."""
    batch, samples = (2, 1600) if size == "ci" else (1, 16000)
    return {"input_values": torch.randn(batch, samples, generator=generator)}


# ----------------------------------------------------------------------------------- transformers models


def transformers_module() -> Any:
    """``import transformers`` with the Hugging Face Hub offline: the zoo never downloads anything."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before the import: huggingface_hub reads it once
    import transformers
    return transformers


def hf_spec(name: str, family: str, model: str, ci: dict[str, Any], full: dict[str, Any],
            inputs: Callable[[Any, str, torch.Generator], dict[str, Tensor]],
            attns: tuple[str | None, ...] = ATTENTIONS) -> Spec:
    """A zoo entry for ``transformers.<model>`` built from ``<model's config class>(**ci or **full)``."""

    def build(size: str, attn: str | None, input_seed: int) -> tuple[nn.Module, tuple[Tensor, ...]]:
        transformers = transformers_module()
        cls = getattr(transformers, model)
        # use_cache=False: one forward pass, no key/value cache built for a later decoding step (building it is
        # not model work, and some transformers versions build it with a deepcopy Dynamo cannot trace)
        options = {"use_cache": False, **(ci if size == "ci" else full),
                   **({"attn_implementation": attn} if attn else {})}
        config = cls.config_class(**options)
        torch.manual_seed(SEED)
        net = cls(config)
        named = inputs(config, size, torch.Generator().manual_seed(input_seed))
        return finish(Call(net, tuple(named)), tuple(named.values()))

    return Spec(name, family, build, attns)


def _encoder(hidden: int, layers: int, heads: int, **extra: Any) -> dict[str, Any]:
    """BERT-style config keywords: hidden size, layers, heads, a 4x (CI: 2x) feed-forward."""
    return {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "intermediate_size": 4 * hidden if hidden >= 256 else 2 * hidden, **extra}


CI_TEXT = {"vocab_size": 1000, "max_position_embeddings": 128}
CI_TOKENS = {"bos_token_id": 1, "eos_token_id": 2}  # special tokens inside the CI vocabulary
CI_ENCODER = _encoder(64, 2, 4, **CI_TEXT)
CI_DECODER = {**_encoder(64, 2, 4), "vocab_size": 1000, "max_position_embeddings": 128, "num_key_value_heads": 2}
LLAMA_FULL = {**_encoder(512, 4, 8), "intermediate_size": 1376, "num_key_value_heads": 2, "vocab_size": 32000}


def _text_specs() -> list[Spec]:
    """Encoders (BERT family) and decoder-only language models (GPT-2 and LLaMA families)."""
    return [
        hf_spec("bert", "bert", "BertModel", CI_ENCODER, {}, text_inputs),
        hf_spec("roberta", "bert", "RobertaModel", {**CI_ENCODER, "pad_token_id": 1}, {}, text_inputs),
        hf_spec("distilbert", "bert", "DistilBertModel",
                {"vocab_size": 1000, "dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128}, {}, text_inputs),
        hf_spec("albert", "bert", "AlbertModel", {**CI_ENCODER, "embedding_size": 32},
                {"embedding_size": 128, **_encoder(768, 12, 12)}, text_inputs),
        hf_spec("electra", "bert", "ElectraModel", {**CI_ENCODER, "embedding_size": 32}, {}, text_inputs),
        hf_spec("gpt2", "gpt2", "GPT2LMHeadModel",
                {"vocab_size": 1000, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, **CI_TOKENS}, {},
                text_inputs),
        # a global and a local (sliding-window 8) layer; GPT-Neo has eager attention only
        hf_spec("gpt_neo", "gpt2", "GPTNeoForCausalLM",
                {"vocab_size": 1000, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "window_size": 8,
                 "attention_types": [[["global", "local"], 1]], "max_position_embeddings": 128},
                {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "window_size": 256,
                 "attention_types": [[["global", "local"], 6]], "max_position_embeddings": 2048},
                text_inputs, attns=("eager",)),
        hf_spec("opt", "gpt2", "OPTForCausalLM",
                {**CI_DECODER, "ffn_dim": 128, "word_embed_proj_dim": 64, "pad_token_id": 1},
                {"pad_token_id": 1}, text_inputs),
        hf_spec("bloom", "gpt2", "BloomForCausalLM",  # ALiBi position biases; eager attention only
                {"vocab_size": 1000, "hidden_size": 64, "n_layer": 2, "n_head": 4},
                {"hidden_size": 768, "n_layer": 12, "n_head": 12}, text_inputs, attns=("eager",)),
        hf_spec("falcon", "gpt2", "FalconForCausalLM",  # multi-query attention, rotary, parallel attention+MLP
                {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
                {"vocab_size": 32000, "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8},
                text_inputs),
        hf_spec("llama", "llama", "LlamaForCausalLM", CI_DECODER, LLAMA_FULL, text_inputs),
        hf_spec("mistral", "llama", "MistralForCausalLM", {**CI_DECODER, "sliding_window": 8},
                {**LLAMA_FULL, "sliding_window": 32}, text_inputs),
        hf_spec("qwen2", "llama", "Qwen2ForCausalLM", CI_DECODER, LLAMA_FULL, text_inputs),
    ]


def _seq2seq_specs() -> list[Spec]:
    """Encoder-decoders: T5 (relative position buckets, RMS norm), BART, Whisper (audio in, conv stem)."""
    return [
        hf_spec("t5", "t5", "T5Model",
                {"vocab_size": 1000, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4},
                {}, seq2seq_inputs),
        hf_spec("bart", "bart", "BartModel",
                {"vocab_size": 1000, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
                 "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
                 "decoder_ffn_dim": 128, "max_position_embeddings": 128},
                {"d_model": 768, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 12,
                 "decoder_attention_heads": 12, "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072},  # bart-base
                seq2seq_inputs),
        hf_spec("whisper", "audio", "WhisperModel",
                {"vocab_size": 1000, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
                 "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
                 "decoder_ffn_dim": 128, "max_source_positions": 32, "max_target_positions": 64, **CI_TOKENS,
                 "pad_token_id": 0, "decoder_start_token_id": 1},
                {"encoder_layers": 4, "decoder_layers": 4, "d_model": 384, "encoder_attention_heads": 6,
                 "decoder_attention_heads": 6, "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536},
                whisper_inputs),
    ]


def _vision_specs() -> list[Spec]:
    """Vision transformers, CLIP, ConvNets and a speech encoder."""
    vit_ci = {**_encoder(64, 2, 4), "image_size": 32, "patch_size": 8}
    conv_ci = {"hidden_sizes": [16, 32, 48, 64], "depths": [1, 1, 1, 1], "image_size": 64}  # 2x2 at the end
    return [
        hf_spec("vit", "vit", "ViTModel", vit_ci, {}, image_inputs),
        hf_spec("deit", "vit", "DeiTModel", vit_ci, {}, image_inputs),
        hf_spec("swin", "vit", "SwinModel",
                {"image_size": 32, "patch_size": 2, "embed_dim": 16, "depths": [2, 1], "num_heads": [2, 4],
                 "window_size": 4},
                {}, image_inputs),
        hf_spec("clip", "vit", "CLIPModel",
                {"text_config": {**CI_ENCODER, "max_position_embeddings": 32, **CI_TOKENS},
                 "vision_config": vit_ci, "projection_dim": 32}, {}, clip_inputs),
        hf_spec("resnet", "convnet", "ResNetModel",
                {**conv_ci, "embedding_size": 16, "layer_type": "bottleneck"}, {}, image_inputs, attns=(None,)),
        hf_spec("convnext", "convnet", "ConvNextModel", conv_ci, {}, image_inputs, attns=(None,)),
        hf_spec("mobilenet_v2", "convnet", "MobileNetV2Model", {"image_size": 64, "depth_multiplier": 0.35},
                {}, image_inputs, attns=(None,)),
        hf_spec("wav2vec2", "audio", "Wav2Vec2Model",
                {**_encoder(64, 2, 4), "conv_dim": (32, 32, 32), "conv_kernel": (10, 3, 3),
                 "conv_stride": (5, 2, 2), "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4},
                {}, audio_inputs),
    ]


# ------------------------------------------------------------------------------------------- registry


def specs() -> dict[str, Spec]:
    """Every zoo architecture by name: transformers' models, then torch.nn's attention modules."""
    from kiln.testing import zoo_torch
    return {s.name: s for s in _text_specs() + _seq2seq_specs() + _vision_specs() + zoo_torch.specs()}


def cases() -> list[tuple[str, str | None]]:
    """``(name, attn)`` for every architecture and each attention implementation it supports."""
    return [(s.name, attn) for s in specs().values() for attn in s.attns]


def build(name: str, size: str = "ci", attn: str | None = None,
          input_seed: int = SEED) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Model ``name`` at ``size`` ("ci" or "full") with attention ``attn`` (default: its first one); the weights
    are always drawn from ``SEED``, the inputs from ``input_seed`` (a second seed gives fresh inputs)."""
    table = specs()
    if name not in table:
        raise KeyError(f"unknown zoo model {name!r}; known models are {sorted(table)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; sizes are {list(SIZES)}")
    spec = table[name]
    attn = spec.attns[0] if attn is None else attn
    if attn not in spec.attns:
        raise ValueError(f"{name} has attention implementations {list(spec.attns)}, not {attn!r}")
    return spec.build(size, attn, input_seed)


# ------------------------------------------------------------------------------------------ comparison


def leaves(value: Any, path: str = "out") -> Iterator[tuple[str, Tensor]]:
    """Every tensor in a model's output with its path: tensors, tuples, lists, dicts and ModelOutputs, and
    objects holding tensors in attributes (transformers' caches: ``out.cache.layers[0].keys``)."""
    if isinstance(value, Tensor):
        yield path, value
    elif isinstance(value, dict):  # ModelOutput is an OrderedDict of its non-None fields
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}")
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
    elif hasattr(value, "__dict__") and not isinstance(value, (type, nn.Module)):
        for key, item in vars(value).items():
            yield from leaves(item, f"{path}.{key}")


def assert_close(actual: Any, expected: Any, rtol: float = 1e-3, atol: float = 1e-4) -> int:
    """Compare every tensor leaf of ``actual`` with ``expected`` (same paths, shapes, dtypes, values within
    ``rtol``/``atol``); returns how many leaves were compared.  The message names the first leaf that differs."""
    got, want = dict(leaves(actual)), dict(leaves(expected))
    if list(got) != list(want):
        raise AssertionError(f"output structure differs: compiled has {sorted(set(got) - set(want))} extra, "
                             f"misses {sorted(set(want) - set(got))}")
    for path, ref in want.items():
        torch.testing.assert_close(got[path], ref, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m, p=path: f"{p}: {m}")
    return len(want)


def max_errors(actual: Any, expected: Any) -> tuple[float, float]:
    """Max absolute error, and max over leaves of (max abs error / max |reference|), over floating leaves."""
    worst_abs = worst_rel = 0.0
    got = dict(leaves(actual))
    for path, ref in leaves(expected):
        if not ref.is_floating_point() or ref.numel() == 0:
            continue
        diff = (got[path].double() - ref.double()).abs().max().item()
        scale = ref.double().abs().max().item()
        worst_abs = max(worst_abs, diff) if not math.isnan(diff) else math.nan
        worst_rel = max(worst_rel, diff / scale if scale else (0.0 if diff == 0 else math.inf))
    return worst_abs, worst_rel
