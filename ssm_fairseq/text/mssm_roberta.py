"""The ``mssm_roberta`` masked language model: a RoBERTa-style encoder of MSSM layers for long documents.

MSSM paper section 4.2 and Table 4. Each layer is the transducer encoder's MSSM layer over token embeddings (``x +
MSSM(LN x)``, ``x + FFN(LN x)``: bidirectional MSSM block of Eq. 10, 8 heads, inter-head gating, stack 2, ``D_sh =
32``), no positional embeddings; ``--encoder-layer-type local`` swaps the MSSM block for bidirectional
sliding-window attention (Table 4's baseline), which needs absolute positions since attention alone is blind to
order: learned ones (``--encoder-learned-pos``, Table 4's, ``max_positions x D`` parameters) or fixed sinusoidal
ones (``--encoder-sinusoidal-pos``, no parameters). Works unchanged with fairseq's ``masked_lm`` task and criterion
(LM head tied to the embeddings, logits only at masked positions) and its ``sentence_prediction`` task
(``register_classification_head``, classification on the ``<s>`` token), as RoBERTa does.
"""
import math
from dataclasses import dataclass, field
from typing import Optional

from fairseq import utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import FairseqEncoder, FairseqEncoderModel, register_model, register_model_architecture
from fairseq.models.roberta.model import RobertaClassificationHead, RobertaLMHead
from fairseq.modules import PositionalEmbedding
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from omegaconf import II
from torch import Tensor, nn

from ..layers.dropout import LeanDropout
from ..layers.encoder_layer import EncoderLayer, LayerConfig
from ..layers.feed_forward import ACTIVATIONS
from ..architecture import fill_config_defaults, set_defaults
from ..integrity.dictionary_digest import RemembersDictionaries
from ..integrity.task_check import require_text_task

LAYER_TYPES = ("mssm", "local")
SINUSOID_SCALE = 0.02 * math.sqrt(2)  # sinusoidal positions at the token embeddings' initial RMS (init_bert_params)


@dataclass
class MaskedLMConfig(FairseqDataclass):
    """Options of ``mssm_roberta``: encoder layer type (MSSM block or sliding-window attention), width, depth,
    heads and SSM shape; every field is a ``--flag`` of fairseq-train (``--encoder-layer-type``, ``--ssm-heads``,
    ...)."""

    encoder_layer_type: ChoiceEnum(list(LAYER_TYPES)) = field(
        default="mssm", metadata={"help": "mssm: bidirectional MSSM block; local: sliding-window attention"})
    encoder_layers: int = field(default=12, metadata={"help": "number of layers"})
    encoder_embed_dim: int = field(default=768, metadata={"help": "model width"})
    encoder_ffn_embed_dim: int = field(default=3072, metadata={"help": "FFN hidden width"})
    encoder_attention_heads: int = field(default=12, metadata={"help": "attention heads (local layers)"})
    attention_window: int = field(
        default=128, metadata={"help": "keys on each side of a query (local layers); 128 is Table 4's window of 256"})
    ssm_heads: int = field(default=8, metadata={"help": "MSSM heads"})
    ssm_state_size: int = field(default=32, metadata={"help": "MSSM state size D_sh"})
    ssm_stack: int = field(default=2, metadata={"help": "stacked MSSM stages per direction"})
    mssm_scale: str = field(
        default="0.5", metadata={"help": "MSSM init: z_Lambda ~ N(ln(scale), 1), smaller is a longer memory; one value, "
                                         "or one per head, comma-separated (heads of different memories)"})
    encoder_learned_pos: bool = field(
        default=False, metadata={"help": "learned absolute positions (local layers need these or sinusoidal ones)"})
    encoder_sinusoidal_pos: bool = field(
        default=False,
        metadata={"help": "fixed sinusoidal absolute positions, no parameters (instead of learned ones)"})
    activation_fn: ChoiceEnum(list(ACTIVATIONS)) = field(default="gelu", metadata={"help": "FFN activation"})
    dropout: float = field(default=0.1, metadata={"help": "dropout"})
    pooler_activation_fn: ChoiceEnum(utils.get_available_activation_fns()) = field(
        default="tanh", metadata={"help": "activation of classification heads"})
    pooler_dropout: float = field(default=0.0, metadata={"help": "dropout in classification heads"})
    load_checkpoint_heads: bool = field(
        default=False, metadata={"help": "keep the classification heads of a restored checkpoint"})
    quant_noise_pq: float = field(default=0.0, metadata={"help": "unused; read by fairseq's classification head"})
    quant_noise_pq_block_size: int = field(default=8, metadata={"help": "unused, as quant_noise_pq"})
    spectral_norm_classification_head: bool = field(default=False, metadata={"help": "spectral norm in heads"})
    max_positions: Optional[int] = II("task.tokens_per_sample")


def head_scales(value) -> float | tuple[float, ...]:
    """``--mssm-scale``: ``"0.5"`` (or a float, as configurations store it) -> 0.5; ``"0.5,0.05"`` -> per head."""
    try:
        scales = tuple(float(v) for v in str(value).split(","))
    except ValueError:
        raise ValueError(f"--mssm-scale takes a number or one per head, comma-separated, got {value!r}") from None
    return scales[0] if len(scales) == 1 else scales


@register_model("mssm_roberta", dataclass=MaskedLMConfig)
class MaskedSSMLanguageModel(RemembersDictionaries, FairseqEncoderModel):
    """Architecture ``mssm_roberta`` (the config's defaults): ``mssm_roberta_base``."""

    def __init__(self, cfg: MaskedLMConfig, encoder: "MaskedLMEncoder"):
        super().__init__(encoder)
        self.args = cfg  # fairseq's sentence_prediction criterion reads model.args, as for RoBERTa
        self.apply(init_bert_params)  # RoBERTa's initialisation of Linear and Embedding; SSM kernels keep theirs
        self.classification_heads = nn.ModuleDict()

    @classmethod
    def build_model(cls, cfg: MaskedLMConfig, task) -> "MaskedSSMLanguageModel":
        require_text_task("mssm_roberta", task, "masked_lm or sentence_prediction")
        fill_config_defaults(cfg, MaskedLMConfig)  # a checkpoint of an earlier release
        if cfg.encoder_learned_pos and cfg.encoder_sinusoidal_pos:
            raise ValueError("--encoder-learned-pos and --encoder-sinusoidal-pos exclude each other: give one")
        if cfg.encoder_layer_type == "local" and not (cfg.encoder_learned_pos or cfg.encoder_sinusoidal_pos):
            raise ValueError("--encoder-layer-type local needs --encoder-learned-pos or --encoder-sinusoidal-pos: "
                             "windowed attention alone does not see token order")
        model = cls(cfg, MaskedLMEncoder(cfg, task.source_dictionary))
        model.remember_dictionaries(source=task.source_dictionary)
        return model

    def forward(self, src_tokens: Tensor, features_only: bool = False, return_all_hiddens: bool = False,
                classification_head_name: Optional[str] = None, **kwargs):
        """``src_tokens`` ``B x L`` -> (``B x L x V`` logits, or ``M x V`` at the ``masked_tokens``, or
        ``B x D`` features with ``features_only``, or ``B x classes`` with a classification head; extra dict)."""
        if classification_head_name is not None:
            features_only = True
        x, extra = self.encoder(src_tokens, features_only, return_all_hiddens, **kwargs)
        if classification_head_name is not None:
            x = self.classification_heads[classification_head_name](x)
        return x, extra

    def register_classification_head(self, name: str, num_classes: int, inner_dim: Optional[int] = None, **kwargs):
        """Add (or replace) a sentence classification head on the ``<s>`` token, as RoBERTa's."""
        self.classification_heads[name] = RobertaClassificationHead(
            self.args.encoder_embed_dim, inner_dim or self.args.encoder_embed_dim, num_classes,
            self.args.pooler_activation_fn, self.args.pooler_dropout,
            do_spectral_norm=self.args.spectral_norm_classification_head,
        )

    def upgrade_state_dict_named(self, state_dict: dict, name: str) -> None:
        """Reconcile classification heads between a checkpoint and this model (fine-tuning a pre-trained
        checkpoint adds a head; a head the model lacks is dropped unless ``--load-checkpoint-heads``)."""
        super().upgrade_state_dict_named(state_dict, name)
        prefix = f"{name}.classification_heads." if name else "classification_heads."
        for head in {k[len(prefix):].split(".")[0] for k in state_dict if k.startswith(prefix)}:
            if head in self.classification_heads:
                continue
            if self.args.load_checkpoint_heads:
                self.register_classification_head(head, state_dict[f"{prefix}{head}.out_proj.weight"].shape[0],
                                                   state_dict[f"{prefix}{head}.dense.weight"].shape[0])
            else:
                for k in [k for k in state_dict if k.startswith(f"{prefix}{head}.")]:
                    del state_dict[k]
        for k, v in self.classification_heads.state_dict().items():
            state_dict.setdefault(prefix + k, v)


class MaskedLMEncoder(FairseqEncoder):
    """Token embeddings (plus learned or sinusoidal positions if asked), encoder layers, final LayerNorm and the
    tied LM head."""

    def __init__(self, cfg: MaskedLMConfig, dictionary):
        super().__init__(dictionary)
        dim = cfg.encoder_embed_dim
        self.padding_idx = dictionary.pad()
        self.max_source_positions = cfg.max_positions
        self.embed_tokens = nn.Embedding(len(dictionary), dim, self.padding_idx)
        self.embed_positions = None
        if cfg.encoder_learned_pos or cfg.encoder_sinusoidal_pos:
            if not cfg.max_positions:
                raise ValueError("absolute positions need --max-positions (or the task's --tokens-per-sample)")
            # learned: (max_positions + padding_idx + 1) x D parameters; sinusoidal: a buffer, not saved
            self.embed_positions = PositionalEmbedding(cfg.max_positions, dim, self.padding_idx,
                                                       learned=cfg.encoder_learned_pos)
        # sin/cos coordinates have an RMS of 1/sqrt(2); scaled to the RMS of the token embeddings at initialisation
        # (RoBERTa's N(0, 0.02), as learned positions start), so that positions do not drown the tokens
        self.position_scale = SINUSOID_SCALE if cfg.encoder_sinusoidal_pos else 1.0
        self.dropout = LeanDropout(cfg.dropout)
        layer_cfg = LayerConfig(
            dim=dim, ffn_dim=cfg.encoder_ffn_embed_dim, ffn_activation=cfg.activation_fn,
            attention_heads=cfg.encoder_attention_heads, ssm_heads=cfg.ssm_heads, ssm_stack=cfg.ssm_stack,
            ssm_state_size=cfg.ssm_state_size, mssm_scale=head_scales(cfg.mssm_scale), attention_window=cfg.attention_window,
            dropout=cfg.dropout,
        )
        self.layers = nn.ModuleList(EncoderLayer(cfg.encoder_layer_type, layer_cfg) for _ in range(cfg.encoder_layers))
        self.final_norm = nn.LayerNorm(dim)
        self.lm_head = RobertaLMHead(dim, len(dictionary), cfg.activation_fn, weight=self.embed_tokens.weight)

    def forward(self, src_tokens: Tensor, features_only: bool = False, return_all_hiddens: bool = False,
                masked_tokens: Optional[Tensor] = None, **unused):
        """``src_tokens`` ``B x L`` -> (``B x L x D`` features or LM logits, ``{"inner_states": [L x B x D]}``).

        Padding (``<pad>`` tokens) never reaches a real position: the layers honour the padding mask.
        """
        if self.embed_positions is not None and src_tokens.shape[1] > self.max_source_positions:
            raise ValueError(f"input of {src_tokens.shape[1]} tokens is longer than --max-positions "
                             f"{self.max_source_positions} of the positional embeddings")
        padding_mask = src_tokens.eq(self.padding_idx)
        padding_mask = padding_mask if padding_mask.any() else None
        x = self.embed_tokens(src_tokens)
        if self.embed_positions is not None:
            x = x + self.position_scale * self.embed_positions(src_tokens)
        x = self.dropout(x)
        inner_states = [x.transpose(0, 1)] if return_all_hiddens else []
        for layer in self.layers:
            x = layer(x, padding_mask)
            if return_all_hiddens:
                inner_states.append(x.transpose(0, 1))
        x = self.final_norm(x)
        if not features_only:
            x = self.lm_head(x, masked_tokens)
        return x, {"inner_states": inner_states}

    def max_positions(self) -> Optional[int]:
        return self.max_source_positions


def _large(args) -> None:
    set_defaults(args, encoder_layers=24, encoder_embed_dim=1024, encoder_ffn_embed_dim=4096,
                 encoder_attention_heads=16)


@register_model_architecture("mssm_roberta", "mssm_roberta_base")
def mssm_roberta_base(args):
    """12 layers of 768, FFN 3072, MSSM with 8 heads (inter-head gating, stack 2, ``D_sh`` 32), no positions."""
    set_defaults(args, encoder_layer_type="mssm", encoder_learned_pos=False)


@register_model_architecture("mssm_roberta", "mssm_roberta_large")
def mssm_roberta_large(args):
    """MSSM paper Table 4: 24 layers of 1024, FFN 4096, MSSM with 8 heads, ``D_sh`` 32, no positions."""
    _large(args)
    mssm_roberta_base(args)


@register_model_architecture("mssm_roberta", "local_roberta_base")
def local_roberta_base(args):
    """``mssm_roberta_base`` with sliding-window attention (12 heads, 128 keys per side) and learned positions
    (sinusoidal ones instead with ``--encoder-sinusoidal-pos``)."""
    set_defaults(args, encoder_layer_type="local", encoder_sinusoidal_pos=False)
    set_defaults(args, encoder_learned_pos=not args.encoder_sinusoidal_pos)


@register_model_architecture("mssm_roberta", "local_roberta_large")
def local_roberta_large(args):
    """Table 4's sliding-window baseline: ``mssm_roberta_large``'s shape, 16 heads, window 256 (128 per side)."""
    _large(args)
    local_roberta_base(args)
