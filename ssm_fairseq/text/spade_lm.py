"""The ``spade_lm`` language model: SPADE global layers at the bottom, local-attention layers above.

SPADE paper sections 3.2 and 4.2, appendix C.3. No positional embeddings (the SSM supplies order; section 3.2).
The local-only baselines (``local_lm``, ``local_lm_wiki103``: no global layer) add sinusoidal positions, as the
paper's "Transformer (window)" (Baevski & Auli's model with window attention) does: without the SSM nothing else
tells a window-attention layer the order of the tokens in its window. Incremental decoding runs the SSM in step
mode and keeps only the attention window, so every generated token costs the same whatever the context length.
"""
import math
from dataclasses import dataclass, field
from typing import Optional

from fairseq import utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import (
    FairseqLanguageModel,
    register_model,
    register_model_architecture,
)
from fairseq.modules import AdaptiveInput, AdaptiveSoftmax, SinusoidalPositionalEmbedding
from omegaconf import II, DictConfig
from torch import Tensor, nn

from ..layers.state_space.causal_ssm import SSM_CHOICES
from ..layers.dropout import LeanDropout
from ..layers.feed_forward import ACTIVATIONS
from ..layers.spade_layer import SpadeLayer
from ..architecture import fill_config_defaults, set_defaults
from ..integrity.dictionary_digest import RemembersDictionaries
from .layer_cache_decoder import LayerCacheDecoder
from .token_store import WindowTokenStore
from ..integrity.task_check import require_text_task


@dataclass
class SpadeLMConfig(FairseqDataclass):
    """Options of ``spade_lm``: width, depth, local-attention window, which layers are global and their SSM
    (``--ssm s4|s4d|dss|mssm``), adaptive input and softmax; every field is a ``--flag`` of fairseq-train."""

    decoder_embed_dim: int = field(default=512, metadata={"help": "model width"})
    decoder_ffn_embed_dim: int = field(default=2048, metadata={"help": "FFN hidden width"})
    decoder_layers: int = field(default=6, metadata={"help": "number of layers"})
    decoder_attention_heads: int = field(default=8, metadata={"help": "local attention heads"})
    attention_window: int = field(default=128, metadata={"help": "window w (previous w tokens) or chunk size"})
    local_attention: ChoiceEnum(["window", "chunk"]) = field(default="window", metadata={"help": "local attention"})
    global_layers: int = field(default=1, metadata={"help": "the bottom k layers are global (SSM + local)"})
    ssm: ChoiceEnum(list(SSM_CHOICES)) = field(default="s4", metadata={"help": "SSM of the global layers"})
    ssm_state_size: int = field(default=64, metadata={"help": "SSM state size N"})
    ssm_heads: int = field(default=1, metadata={"help": "heads of the mssm kernel"})
    train_ssm_ab: bool = field(default=False, metadata={"help": "train S4's A and B (SPADE freezes them)"})
    positional_embeddings: ChoiceEnum(["none", "sinusoidal"]) = field(default="none", metadata={
        "help": "absolute positions added to the token embeddings: none (SPADE: the SSM supplies order) or "
                "sinusoidal (the local-only baselines)"})
    activation_fn: ChoiceEnum(list(ACTIVATIONS)) = field(default="gelu", metadata={"help": "FFN activation"})
    dropout: float = field(default=0.1, metadata={"help": "dropout"})
    attention_dropout: float = field(default=0.0, metadata={"help": "dropout on attention weights"})
    no_scale_embedding: bool = field(default=False, metadata={"help": "do not scale embeddings by sqrt(dim)"})
    share_decoder_input_output_embed: bool = field(default=False, metadata={"help": "tie input/output embeddings"})
    adaptive_input: bool = field(default=False, metadata={"help": "adaptive input embeddings"})
    adaptive_input_factor: float = field(default=4, metadata={"help": "adaptive input factor"})
    adaptive_input_cutoff: Optional[str] = field(default=None, metadata={"help": "comma separated cutoffs"})
    adaptive_softmax_cutoff: Optional[str] = field(default=None, metadata={"help": "comma separated cutoffs"})
    adaptive_softmax_dropout: float = field(default=0.0, metadata={"help": "adaptive softmax tail dropout"})
    adaptive_softmax_factor: float = field(default=4, metadata={"help": "adaptive softmax factor"})
    tie_adaptive_weights: bool = field(default=False, metadata={"help": "tie adaptive input and softmax weights"})
    tie_adaptive_proj: bool = field(default=False, metadata={"help": "tie adaptive projections too"})
    tokens_per_sample: int = II("task.tokens_per_sample")
    max_target_positions: Optional[int] = II("task.max_target_positions")


@register_model("spade_lm", dataclass=SpadeLMConfig)
class SpadeLanguageModel(RemembersDictionaries, FairseqLanguageModel):
    """Architecture ``spade_lm`` (the config's defaults): 6 layers of 512, FFN 2048, 8 heads, window 128, a
    frozen S4-LegS (N = 64) global layer at the bottom."""

    @classmethod
    def build_model(cls, cfg: SpadeLMConfig, task) -> "SpadeLanguageModel":
        require_text_task("spade_lm", task, "language_modeling")
        fill_config_defaults(cfg, SpadeLMConfig)  # a checkpoint of an earlier release
        dictionary = task.source_dictionary
        if cfg.adaptive_input:
            embed_tokens = AdaptiveInput(
                len(dictionary), dictionary.pad(), cfg.decoder_embed_dim, cfg.adaptive_input_factor,
                cfg.decoder_embed_dim, utils.eval_str_list(cfg.adaptive_input_cutoff, type=int),
            )
        else:
            embed_tokens = nn.Embedding(len(dictionary), cfg.decoder_embed_dim, dictionary.pad())
            nn.init.normal_(embed_tokens.weight, mean=0, std=cfg.decoder_embed_dim**-0.5)
            nn.init.constant_(embed_tokens.weight[dictionary.pad()], 0)
        model = cls(SpadeDecoder(cfg, task.target_dictionary, embed_tokens))
        model.remember_dictionaries(source=dictionary, target=task.target_dictionary)
        return model


class SpadeDecoder(LayerCacheDecoder):
    """Tokens ``B x L`` -> logits ``B x L x V`` (or adaptive-softmax features), with incremental decoding."""

    def __init__(self, cfg: SpadeLMConfig, dictionary, embed_tokens: nn.Module):
        super().__init__(dictionary)
        dim = cfg.decoder_embed_dim
        self.embed_tokens = embed_tokens
        self.embed_scale = 1.0 if cfg.no_scale_embedding else math.sqrt(dim)
        self.padding_idx = dictionary.pad()
        self.max_target_positions = cfg.max_target_positions or cfg.tokens_per_sample
        self.dropout = LeanDropout(cfg.dropout)
        self.embed_positions = None
        if cfg.positional_embeddings == "sinusoidal":
            self.embed_positions = SinusoidalPositionalEmbedding(
                dim, self.padding_idx, init_size=self.max_target_positions + self.padding_idx + 1)
        self.layers = nn.ModuleList(
            SpadeLayer(
                dim, cfg.decoder_ffn_embed_dim, cfg.decoder_attention_heads, cfg.attention_window,
                cfg.local_attention, causal=True, ssm=cfg.ssm if i < cfg.global_layers else None,
                ssm_state_size=cfg.ssm_state_size, l_max=cfg.tokens_per_sample, frozen_ssm=not cfg.train_ssm_ab,
                ssm_heads=cfg.ssm_heads, dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
                activation=cfg.activation_fn,
            )
            for i in range(cfg.decoder_layers)
        )
        self.final_norm = nn.LayerNorm(dim)
        self.adaptive_softmax = None
        if cfg.adaptive_softmax_cutoff is not None:
            self.adaptive_softmax = AdaptiveSoftmax(
                len(dictionary), dim, utils.eval_str_list(cfg.adaptive_softmax_cutoff, type=int),
                dropout=cfg.adaptive_softmax_dropout, adaptive_inputs=embed_tokens if cfg.tie_adaptive_weights else None,
                factor=cfg.adaptive_softmax_factor, tie_proj=cfg.tie_adaptive_proj,
            )
        elif cfg.share_decoder_input_output_embed:
            self.output_projection = nn.Linear(dim, len(dictionary), bias=False)
            self.output_projection.weight = embed_tokens.weight
        else:
            self.output_projection = nn.Linear(dim, len(dictionary), bias=False)
            nn.init.normal_(self.output_projection.weight, mean=0, std=dim**-0.5)

    def forward(self, prev_output_tokens: Tensor, encoder_out=None, incremental_state=None, features_only=False,
                **kwargs):
        x = self.extract_features(prev_output_tokens, incremental_state)
        return (x if features_only else self.output_layer(x)), {"attn": [None], "inner_states": [x]}

    def extract_features(self, tokens: Tensor, incremental_state=None) -> Tensor:
        """``B x L`` tokens -> ``B x L x D``. Incrementally, ``tokens`` is the whole prefix so far (fairseq's
        convention) and only the positions not seen before are computed."""
        prefix = tokens
        tokens, caches = self.unseen(tokens, incremental_state)
        padding_mask = tokens.eq(self.padding_idx)
        padding_mask = padding_mask if caches is None and padding_mask.any() else None
        x = self.embed_scale * self.embed_tokens(tokens)
        if self.embed_positions is not None:  # the new tokens' positions in the whole prefix
            x = x + self.embed_positions(prefix)[:, prefix.shape[1] - tokens.shape[1]:]
        x = self.dropout(x)
        for i, layer in enumerate(self.layers):
            x = layer(x, padding_mask, None if caches is None else caches[i])
        return self.final_norm(x)

    def token_store(self) -> WindowTokenStore:
        """Rows of incremental states for a search that branches and drops many hypotheses (``text/token_store.py``:
        each token's keys stored once, a row's window a list of indices into them)."""
        return WindowTokenStore(self)

    def step_rows(self, tokens: Tensor, seen: Tensor, stores: list[Tensor], first: int, slots: Tensor,
                  key_ok: Tensor, ssm_caches: list[Optional[dict]]) -> Tensor:
        """One new token per row from a ``WindowTokenStore``: ``tokens`` ``B``, each after ``seen`` (``B``) tokens of
        its own -> ``B x 1 x V`` logits (or adaptive-softmax features), as ``forward`` with each row's own incremental
        state. ``stores``, ``first``, ``slots``, ``key_ok``: each layer's keys and values and the rows' windows
        (``LocalAttention.step_stored``); ``ssm_caches``: each layer's SSM state of the rows (None for a local layer),
        updated in place."""
        x = self.embed_scale * self.embed_tokens(tokens[:, None])
        if self.embed_positions is not None:  # fairseq's positions count a row's own tokens from padding_idx + 1
            x = x + self._position_table(int(seen.max()) + 1)[seen + 1 + self.padding_idx, None]
        x = self.dropout(x)
        for layer, store, ssm_cache in zip(self.layers, stores, ssm_caches):
            x = layer.step_stored(x, store, first, slots, key_ok, ssm_cache)
        return self.output_layer(self.final_norm(x))

    def _position_table(self, positions: int) -> Tensor:
        """The sinusoidal embeddings of positions up to ``positions`` (and the padding index's below them), grown as
        ``SinusoidalPositionalEmbedding.forward`` grows them."""
        table = self.embed_positions
        needed = self.padding_idx + 1 + positions
        if needed > table.weights.size(0):
            table.weights = SinusoidalPositionalEmbedding.get_embedding(needed, table.embedding_dim,
                                                                        self.padding_idx).to(table.weights)
        return table.weights

    def output_layer(self, features: Tensor) -> Tensor:
        return features if self.adaptive_softmax is not None else self.output_projection(features)

    def max_positions(self) -> int:
        return self.max_target_positions


@register_model_architecture("spade_lm", "spade_lm_wiki103")
def spade_lm_wiki103(args):
    """SPADE appendix C.3 on Baevski & Auli (2019): 16 layers of 1024, FFN 4096, 8 heads, adaptive input and
    softmax (cutoffs 20000,60000), dropout 0.3, window 512, frozen S4-LegS (N = 64) in the bottom layer."""
    set_defaults(
        args, decoder_layers=16, decoder_embed_dim=1024, decoder_ffn_embed_dim=4096, decoder_attention_heads=8,
        attention_window=512, dropout=0.3, attention_dropout=0.1, adaptive_input=True, tie_adaptive_weights=True,
        tie_adaptive_proj=True, adaptive_input_cutoff="20000,60000", adaptive_softmax_cutoff="20000,60000",
        adaptive_softmax_dropout=0.2, no_scale_embedding=True, global_layers=1, ssm="s4", ssm_state_size=64,
    )


def _local_positions(args) -> str:
    """The local baselines' positions: sinusoidal, except in a model configuration saved before the option existed
    (a ``DictConfig`` read from a checkpoint of an earlier release, whose local models had no positions); a new
    configuration gets the field from the command line's arch defaults before it is ever saved."""
    return "none" if isinstance(args, DictConfig) and "positional_embeddings" not in args else "sinusoidal"


@register_model_architecture("spade_lm", "local_lm_wiki103")
def local_lm_wiki103(args):
    """The local-only baseline, the paper's "Transformer (window)": ``spade_lm_wiki103`` without global layers
    (window attention only), with sinusoidal positions."""
    set_defaults(args, global_layers=0, positional_embeddings=_local_positions(args))
    spade_lm_wiki103(args)


@register_model_architecture("spade_lm", "local_lm")
def local_lm(args):
    """The local-only counterpart of ``spade_lm``: no global layer (window attention only), sinusoidal positions."""
    set_defaults(args, global_layers=0, positional_embeddings=_local_positions(args))
