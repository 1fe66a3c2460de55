"""The ``spade_transformer`` encoder-decoder: T5-base's shape with SPADE global layers (SPADE paper section 5.1).

Post-LayerNorm layers; T5's relative position bias (one table per stack, shared by its layers) in every
window self-attention and no absolute positions; the bottom layer of the encoder is a global layer with a
bidirectional frozen S4-LegS, the bottom layer of the decoder one with a causal frozen S4-LegS (A and B fixed
after the HiPPO initialisation, Eq. 5); full cross-attention. Incremental decoding runs the decoder's S4 in step
mode, keeps only the attention window and projects the encoder's keys and values once, so ``fairseq-generate``
pays the same per token whatever the target length.
"""
import logging
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import (
    FairseqEncoder,
    FairseqEncoderDecoderModel,
    register_model,
    register_model_architecture,
)
from torch import Tensor, nn

from ..layers.state_space.causal_ssm import SSM_CHOICES
from ..layers.dropout import LeanDropout
from ..layers.feed_forward import ACTIVATIONS
from ..layers.attention.relative_position import RelativePositionBias
from ..layers.spade_layer import SpadeLayer
from ..layers.state_space.ssm_ablation import zero_ssm_outputs
from ..architecture import fill_config_defaults, set_defaults
from ..integrity.dictionary_digest import RemembersDictionaries
from .layer_cache_decoder import LayerCacheDecoder
from ..integrity.task_check import require_text_task

logger = logging.getLogger(__name__)


@dataclass
class SpadeTransformerConfig(FairseqDataclass):
    """Options of ``spade_transformer`` (encoder and decoder alike): width, depths, window attention, T5 relative
    positions, the global SSM layer; every field is a ``--flag`` of fairseq-train."""

    embed_dim: int = field(default=512, metadata={"help": "model width (encoder and decoder)"})
    ffn_embed_dim: int = field(default=2048, metadata={"help": "FFN hidden width"})
    attention_heads: int = field(default=8, metadata={"help": "attention heads"})
    encoder_layers: int = field(default=6, metadata={"help": "encoder layers"})
    decoder_layers: int = field(default=6, metadata={"help": "decoder layers"})
    attention_window: int = field(default=128, metadata={"help": "window of every self-attention (keys each side; "
                                                                  "the previous w in the decoder)"})
    global_layers: int = field(default=1, metadata={"help": "the bottom k layers of each stack are global"})
    ssm: ChoiceEnum(list(SSM_CHOICES)) = field(default="s4", metadata={"help": "SSM of the global layers "
                                                                             "(encoder: s4 or mssm)"})
    ssm_state_size: int = field(default=64, metadata={"help": "SSM state size N"})
    ssm_heads: int = field(default=1, metadata={"help": "heads of the mssm kernel"})
    train_ssm_ab: bool = field(default=False, metadata={"help": "train S4's A and B (SPADE freezes them)"})
    global_merge_init_scale: float = field(default=1.0, metadata={
        "help": "multiplies the initial weights of the global layers' W (the merge of LN(local) and LN(SSM)); 1 is "
                "PyTorch's default, below 1 a token's own representation passes the global layer less mixed at "
                "the start of training"})
    relative_buckets: int = field(default=32, metadata={"help": "T5 relative position buckets"})
    relative_max_distance: int = field(default=128, metadata={"help": "T5 relative position max distance"})
    activation_fn: ChoiceEnum(list(ACTIVATIONS)) = field(default="relu", metadata={"help": "FFN activation"})
    dropout: float = field(default=0.1, metadata={"help": "dropout"})
    attention_dropout: float = field(default=0.0, metadata={"help": "dropout on attention weights"})
    share_all_embeddings: bool = field(default=False, metadata={
        "help": "one embedding for encoder input, decoder input and output (needs a joined dictionary)"})
    max_source_positions: int = field(default=4096, metadata={
        "help": "longest source: the encoder S4 kernel's l_max (no positional embeddings; a longer input "
                "stops with an error naming this flag)"})
    max_target_positions: int = field(default=1024, metadata={"help": "longest target: the decoder S4's l_max"})
    ssm_ablation: bool = field(default=False, metadata={
        "help": "evaluation only: every SSM sub-layer outputs zeros, in the full forward and in incremental "
                "decoding (fairseq-generate --model-overrides \"{'ssm_ablation': True}\"); refused for a model "
                "without SSM sub-layers"})


def _stack(cfg: SpadeTransformerConfig, layers: int, causal: bool, l_max: int) -> nn.ModuleList:
    return nn.ModuleList(
        SpadeLayer(
            cfg.embed_dim, cfg.ffn_embed_dim, cfg.attention_heads, cfg.attention_window, "window", causal=causal,
            ssm=cfg.ssm if i < cfg.global_layers else None, ssm_state_size=cfg.ssm_state_size, l_max=l_max,
            frozen_ssm=not cfg.train_ssm_ab, ssm_heads=cfg.ssm_heads, dropout=cfg.dropout,
            attention_dropout=cfg.attention_dropout, activation=cfg.activation_fn, post_norm=True,
            cross_attention=causal, merge_init_scale=cfg.global_merge_init_scale,
        )
        for i in range(layers)
    )


def _embedding(dictionary, dim: int) -> nn.Embedding:
    embed = nn.Embedding(len(dictionary), dim, dictionary.pad())
    nn.init.normal_(embed.weight, mean=0, std=dim**-0.5)
    nn.init.constant_(embed.weight[dictionary.pad()], 0)
    return embed


@register_model("spade_transformer", dataclass=SpadeTransformerConfig)
class SpadeTransformerModel(RemembersDictionaries, FairseqEncoderDecoderModel):
    """Architecture ``spade_transformer`` (the config's defaults): 6+6 layers of 512, FFN 2048, 8 heads."""

    @classmethod
    def build_model(cls, cfg: SpadeTransformerConfig, task) -> "SpadeTransformerModel":
        require_text_task("spade_transformer", task, "translation or denoising")
        fill_config_defaults(cfg, SpadeTransformerConfig)  # a checkpoint of an earlier release
        source, target = task.source_dictionary, task.target_dictionary
        encoder_embed = _embedding(source, cfg.embed_dim)
        if cfg.share_all_embeddings:
            if source != target:
                raise ValueError("--share-all-embeddings needs a joined dictionary "
                                 "(fairseq-preprocess --joined-dictionary)")
            decoder_embed = encoder_embed
        else:
            decoder_embed = _embedding(target, cfg.embed_dim)
        model = cls(SpadeEncoder(cfg, source, encoder_embed), SpadeSeq2SeqDecoder(cfg, target, decoder_embed))
        model.remember_dictionaries(source=source, target=target)
        if cfg.ssm_ablation:
            zeroed, _ = zero_ssm_outputs(model)
            logger.info("--ssm-ablation: the outputs of %d SSM sub-layers are zeroed", zeroed)
        return model


class SpadeEncoder(FairseqEncoder):
    """``src_tokens`` ``B x S`` -> fairseq's encoder-out dict (``encoder_out``: ``[S x B x D]``)."""

    def __init__(self, cfg: SpadeTransformerConfig, dictionary, embed_tokens: nn.Embedding):
        super().__init__(dictionary)
        self.embed_tokens, self.padding_idx = embed_tokens, dictionary.pad()
        self.max_source_positions = cfg.max_source_positions
        self.dropout = LeanDropout(cfg.dropout)
        self.position_bias = RelativePositionBias(cfg.attention_heads, True, cfg.relative_buckets,
                                                  cfg.relative_max_distance)
        self.layers = _stack(cfg, cfg.encoder_layers, causal=False, l_max=cfg.max_source_positions)

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None, **unused) -> dict:
        if src_tokens.shape[1] > self.max_source_positions:
            raise ValueError(f"source of {src_tokens.shape[1]} tokens is longer than --max-source-positions "
                             f"{self.max_source_positions} (the encoder S4 kernel's length)")
        padding_mask = src_tokens.eq(self.padding_idx)
        x = self.dropout(self.embed_tokens(src_tokens))
        mask = padding_mask if padding_mask.any() else None
        for layer in self.layers:
            x = layer(x, mask, position_bias=self.position_bias)
        return {"encoder_out": [x.transpose(0, 1)], "encoder_padding_mask": [padding_mask],
                "src_tokens": [], "src_lengths": [] if src_lengths is None else [src_lengths]}

    def reorder_encoder_out(self, encoder_out: dict, new_order: Tensor) -> dict:
        return {key: [t.index_select(1 if key == "encoder_out" else 0, new_order) for t in value]
                for key, value in encoder_out.items()}

    def max_positions(self) -> int:
        return self.max_source_positions


class SpadeSeq2SeqDecoder(LayerCacheDecoder):
    """``prev_output_tokens`` ``B x T`` and the encoder output -> logits ``B x T x V``, with incremental decoding."""

    def __init__(self, cfg: SpadeTransformerConfig, dictionary, embed_tokens: nn.Embedding):
        super().__init__(dictionary)
        self.embed_tokens, self.padding_idx = embed_tokens, dictionary.pad()
        self.max_target_positions = cfg.max_target_positions
        self.dropout = LeanDropout(cfg.dropout)
        self.position_bias = RelativePositionBias(cfg.attention_heads, False, cfg.relative_buckets,
                                                  cfg.relative_max_distance)
        self.layers = _stack(cfg, cfg.decoder_layers, causal=True, l_max=cfg.max_target_positions)
        self.output_projection = nn.Linear(cfg.embed_dim, len(dictionary), bias=False)
        self.output_projection.weight = embed_tokens.weight  # tied, as T5

    def forward(self, prev_output_tokens: Tensor, encoder_out: Optional[dict] = None, incremental_state=None,
                features_only: bool = False, **unused):
        x = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        return (x if features_only else self.output_projection(x)), {"attn": [None], "inner_states": [x]}

    def extract_features(self, tokens: Tensor, encoder_out: dict, incremental_state=None) -> Tensor:
        """Incrementally ``tokens`` is the whole prefix so far (fairseq's convention); only the positions not
        seen before are computed."""
        tokens, caches = self.unseen(tokens, incremental_state)
        padding_mask = tokens.eq(self.padding_idx)
        padding_mask = padding_mask if caches is None and padding_mask.any() else None
        memory = encoder_out["encoder_out"][0].transpose(0, 1)
        memory_mask = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        x = self.dropout(self.embed_tokens(tokens))
        for i, layer in enumerate(self.layers):
            x = layer(x, padding_mask, None if caches is None else caches[i], self.position_bias, memory, memory_mask)
        return x

    def max_positions(self) -> int:
        return self.max_target_positions


@register_model_architecture("spade_transformer", "spade_t5_base")
def spade_t5_base(args):
    """SPADE section 5.1: T5-base with post-LN, 768 wide, FFN 3072, 12 heads, 12 + 12 layers, window 128,
    relative positions (32 buckets, max distance 128), frozen S4-LegS global layer at the bottom of each stack,
    one embedding shared by encoder, decoder and output."""
    set_defaults(args, embed_dim=768, ffn_embed_dim=3072, attention_heads=12, encoder_layers=12, decoder_layers=12,
                 attention_window=128, global_layers=1, ssm="s4", share_all_embeddings=True)


@register_model_architecture("spade_transformer", "t5_base_local")
def t5_base_local(args):
    """The same-shape baseline: ``spade_t5_base`` without the S4 global layers (window attention only)."""
    set_defaults(args, global_layers=0)
    spade_t5_base(args)


@register_model_architecture("spade_transformer", "spade_t5_small")
def spade_t5_small(args):
    """For tests and the CPU recipe: 4 + 4 layers of 256, FFN 1024, 4 heads, window 64."""
    set_defaults(args, embed_dim=256, ffn_embed_dim=1024, attention_heads=4, encoder_layers=4, decoder_layers=4,
                 attention_window=64, global_layers=1, ssm="s4")


@register_model_architecture("spade_transformer", "t5_small_local")
def t5_small_local(args):
    """``spade_t5_small`` without the S4 global layers."""
    set_defaults(args, global_layers=0)
    spade_t5_small(args)
