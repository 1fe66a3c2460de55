"""The ``transducer`` model: speech encoder, LSTM predictor and additive joiner (MSSM paper section 4.1).

The encoder is chosen by architecture; every row of the paper's Tables 1-3 is one of the architectures below
plus flags (``--encoder-layers``, ``--ssm-heads``, ``--ssm-gating``, ``--ssm-stack``, ``--subsampler``,
``--ssm-state-size``, ...).
"""

from dataclasses import dataclass, field

import torch
from omegaconf import II
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import BaseFairseqModel, register_model, register_model_architecture
from torch import Tensor, nn

from ...layers.compiled import compile_layers
from ...layers.encoder_layer import LAYER_TYPES, LayerConfig
from ...layers.feed_forward import ACTIVATIONS
from .joiner import ACTIVATIONS as JOINER_ACTIVATIONS, Joiner
from ...layers.state_space.multihead_ssm import GATINGS
from .predictor import Predictor
from ..encoder.lookahead import MIXINGS as LOOKAHEAD_MIXINGS
from ..encoder.speech_encoder import SpeechEncoder
from ..encoder.subsampling import SUBSAMPLERS, subsampling_stride
from ...architecture import fill_config_defaults, set_defaults
from ...integrity.task_check import require_speech_task

# the paper's encoder layers; ``local`` (sliding window, the masked LM's baseline) has no positions to offer speech
ENCODER_TYPES = tuple(t for t in LAYER_TYPES if t != "local")


@dataclass
class TransducerConfig(FairseqDataclass):
    """Options of the ``transducer`` model: encoder (layer type, depth, width, MSSM heads, gating and stack,
    sub-sampler, auxiliary CTC), LSTM predictor and joiner; every field is a ``--flag`` of fairseq-train."""

    # encoder (defaults: mssm_transducer)
    encoder_type: ChoiceEnum(ENCODER_TYPES) = field(default="mssm", metadata={"help": "encoder layer type"})
    encoder_layers: int = field(default=16, metadata={"help": "number of encoder layers"})
    encoder_embed_dim: int = field(default=512, metadata={"help": "encoder width D"})
    encoder_ffn_embed_dim: int = field(default=2048, metadata={"help": "encoder FFN hidden width"})
    encoder_ffn_activation: ChoiceEnum(list(ACTIVATIONS)) = field(default="gelu", metadata={"help": "FFN activation"})
    encoder_attention_heads: int = field(default=8, metadata={"help": "self-attention heads"})
    ssm_heads: int = field(default=4, metadata={"help": "MSSM heads H"})
    ssm_gating: ChoiceEnum(list(GATINGS)) = field(
        default="ihg", metadata={"help": "ihg: inter-head gating (Eq. 9); glu: gating within a channel; gelu"}
    )
    ssm_stack: int = field(default=2, metadata={"help": "stacked SSM stages per MSSM block (Fig. 1b)"})
    ssm_state_size: int = field(default=32, metadata={"help": "state size D_sh of the MSSM and S4 kernels"})
    mssm_scale: float = field(default=0.5, metadata={"help": "MSSM init: z_Lambda ~ N(ln(scale), 1)"})
    conv_kernel_size: int = field(default=31, metadata={"help": "Conformer depthwise kernel size"})
    subsampler: ChoiceEnum(SUBSAMPLERS) = field(default="ms", metadata={"help": "conv, tr or ms (multi-scale)"})
    conv_subsampler_channels: int = field(
        default=64, metadata={"help": "channels of the conv sub-sampler's two Conv2d (its output is always D)"}
    )
    tr_stride: int = field(default=4, metadata={"help": "frames stacked by the tr sub-sampler"})
    encoder_positions: bool = field(default=False, metadata={"help": "add sinusoidal positions after sub-sampling"})
    causal_encoder: bool = field(
        default=False, metadata={"help": "no encoder output depends on a later frame (forward-only MSSM blocks, "
                                         "attention masked to the past); mssm layers on the tr or ms sub-sampler "
                                         "then also stream chunk by chunk"})
    lookahead_frames: int = field(
        default=0, metadata={"help": "K: sub-sampled frames of look-ahead for a causal encoder (a per-channel "
                                     "convolution over frames t .. t+K after the sub-sampler, "
                                     "asr/encoder/lookahead.py): encoder frame t sees the input up to frame t+K, "
                                     "and a stream gives it K frames (K x 40 ms at stride 4) later; 0: none "
                                     "(the model of earlier releases). Needs --causal-encoder"})
    lookahead_mixing: ChoiceEnum(LOOKAHEAD_MIXINGS) = field(
        default="channel", metadata={"help": "channel: the look-ahead is per-channel taps over frames t .. t+K "
                                             "(D x (K+1) parameters); full: also a projection of frames t+1 .. t+K's "
                                             "every channel (K D^2 more, initialised to 0)"})
    input_feat_per_channel: int = field(default=80, metadata={"help": "filterbank bins"})
    dropout: float = field(default=0.1, metadata={"help": "encoder dropout"})
    aux_ctc_every: int = field(
        default=0, metadata={"help": "auxiliary CTC classifier on every k-th encoder layer's output; 0: none"}
    )
    compile_encoder: bool = field(
        default=False, metadata={"help": "torch.compile the encoder layers (inductor; opt-in): each batch is padded "
                                         "to a length bucket, compiled at its first batch (minutes on a CPU); the "
                                         "state dict is the eager model's, so checkpoints load either way. "
                                         "fairseq-generate: --model-overrides "
                                         "\"{'model': {'compile_encoder': True}}\"; "
                                         "see ssm_fairseq/layers/compiled.py"})
    # predictor and joiner
    predictor_embed_dim: int = field(default=512, metadata={"help": "predictor embedding width"})
    predictor_hidden_dim: int = field(default=512, metadata={"help": "predictor LSTM width"})
    predictor_layers: int = field(default=3, metadata={"help": "predictor LSTM layers"})
    predictor_dropout: float = field(default=0.3, metadata={"help": "predictor dropout"})
    joint_dim: int = field(default=1024, metadata={"help": "joiner projection width"})
    joiner_activation: ChoiceEnum(list(JOINER_ACTIVATIONS)) = field(default="tanh", metadata={"help": "joiner act"})
    max_source_positions: int = II("task.max_source_positions")  # longest input in feature frames
    max_target_positions: int = II("task.max_target_positions")


@register_model("transducer", dataclass=TransducerConfig)
class TransducerModel(BaseFairseqModel):
    """RNN-T model. The blank is the dictionary's ``<s>`` (bos) symbol, which never occurs in targets.

    ``forward`` returns the encoder dict and the predictor output; the criterion builds the joint lattice
    from them with ``self.joiner`` (see ``ssm_fairseq.asr.transducer.rnnt_loss.transducer_loss``).
    """

    def __init__(self, cfg: TransducerConfig, dictionary, encoder: SpeechEncoder, predictor: Predictor, joiner: Joiner):
        super().__init__()
        self.cfg = cfg
        self.encoder, self.predictor, self.joiner = encoder, predictor, joiner
        self.blank, self.pad = dictionary.bos(), dictionary.pad()
        self.aux_ctc = nn.Linear(cfg.encoder_embed_dim, len(dictionary)) if cfg.aux_ctc_every else None

    @classmethod
    def build_model(cls, cfg: TransducerConfig, task) -> "TransducerModel":
        require_speech_task("transducer", task)
        fill_config_defaults(cfg, TransducerConfig)  # a checkpoint of an earlier release
        if cfg.causal_encoder and cfg.subsampler == "conv":
            raise ValueError("--causal-encoder needs --subsampler tr or ms: the conv sub-sampler looks ahead")
        if cfg.lookahead_frames < 0:
            raise ValueError(f"--lookahead-frames must be 0 or more, got {cfg.lookahead_frames}")
        if cfg.lookahead_frames and not cfg.causal_encoder:
            raise ValueError(f"--lookahead-frames {cfg.lookahead_frames} needs --causal-encoder: a bidirectional "
                             "encoder already sees the whole utterance")
        if cfg.aux_ctc_every and cfg.aux_ctc_every >= cfg.encoder_layers:
            raise ValueError(f"--aux-ctc-every {cfg.aux_ctc_every} takes outputs below the top layer: it needs more "
                             f"than {cfg.aux_ctc_every} encoder layers, got --encoder-layers {cfg.encoder_layers}")
        dictionary = task.target_dictionary
        encoder = cls.build_encoder(cfg)
        predictor = Predictor(
            len(dictionary), cfg.predictor_embed_dim, cfg.predictor_hidden_dim, cfg.predictor_layers,
            cfg.predictor_dropout, padding_idx=dictionary.pad(),
        )
        joiner = Joiner(cfg.encoder_embed_dim, cfg.predictor_hidden_dim, cfg.joint_dim, len(dictionary),
                        cfg.joiner_activation)
        return cls(cfg, dictionary, encoder, predictor, joiner)

    @staticmethod
    def build_encoder(cfg: TransducerConfig) -> SpeechEncoder:
        """The speech encoder that ``cfg`` describes (also what the encoder benchmarks build)."""
        layer_cfg = LayerConfig(
            dim=cfg.encoder_embed_dim,
            ffn_dim=cfg.encoder_ffn_embed_dim,
            ffn_activation=cfg.encoder_ffn_activation,
            attention_heads=cfg.encoder_attention_heads,
            ssm_heads=cfg.ssm_heads,
            ssm_gating=cfg.ssm_gating,
            ssm_stack=cfg.ssm_stack,
            ssm_state_size=cfg.ssm_state_size,
            mssm_scale=cfg.mssm_scale,
            s4_l_max=-(-cfg.max_source_positions // subsampling_stride(cfg.subsampler, cfg.tr_stride)),
            conv_kernel_size=cfg.conv_kernel_size,
            dropout=cfg.dropout,
            causal=cfg.causal_encoder,
        )
        encoder = SpeechEncoder(
            cfg.encoder_type,
            cfg.encoder_layers,
            layer_cfg,
            input_dim=cfg.input_feat_per_channel,
            subsampler=cfg.subsampler,
            conv_channels=cfg.conv_subsampler_channels,
            tr_stride=cfg.tr_stride,
            positions=cfg.encoder_positions,
            intermediate_every=cfg.aux_ctc_every,
            lookahead_frames=cfg.lookahead_frames,
            lookahead_mixing=cfg.lookahead_mixing,
        )
        if cfg.compile_encoder:
            compile_layers(encoder.layers)
        return encoder

    def compile_encoder_layers(self, **options) -> None:
        """``torch.compile`` this model's encoder layers in place (``layers.compiled.compile_layers``; ``options`` go
        to ``torch.compile``): what ``--compile-encoder`` does at build time, for a model already built (e.g. loaded
        for transcription). Parameters and state dict keys are unchanged."""
        compile_layers(self.encoder.layers, **options)

    def max_positions(self) -> tuple[int, int]:
        return self.cfg.max_source_positions, self.cfg.max_target_positions

    def predictor_input(self, targets: Tensor, target_lengths: Tensor) -> Tensor:
        """``B x U`` labels -> ``B x (U+1)``: blank first, then the labels, ``pad`` past each length."""
        tokens = torch.cat([targets.new_full((targets.shape[0], 1), self.blank), targets], dim=1)
        padded = torch.arange(tokens.shape[1], device=tokens.device) > target_lengths.unsqueeze(1)
        return tokens.masked_fill(padded, self.pad)

    def forward(
        self, src_tokens: Tensor, src_lengths: Tensor, targets: Tensor, target_lengths: Tensor
    ) -> tuple[dict, Tensor]:
        """``src_tokens``: ``B x T x F`` features; ``targets``: ``B x U`` labels without eos.

        Returns the encoder dict (``encoder_out`` ``B x T' x D``, ``encoder_lengths``, ``padding_mask``,
        ``intermediate``) and the predictor output ``B x (U+1) x hidden``.
        """
        encoder_out = self.encoder(src_tokens, src_lengths)
        predictor_out, _ = self.predictor(self.predictor_input(targets, target_lengths))
        return encoder_out, predictor_out


@register_model_architecture("transducer", "mssm_transducer")
def mssm_transducer(args):
    """Table 2, 79.2M: 16 MSSM layers, 4 heads, inter-head gating, stack 2, multi-scale sub-sampler."""
    set_defaults(args, encoder_type="mssm", encoder_layers=16, ssm_heads=4, ssm_gating="ihg", ssm_stack=2,
                  subsampler="ms")


@register_model_architecture("transducer", "mssm_transducer_streaming")
def mssm_transducer_streaming(args):
    """Causal MSSM transducer for streaming recognition, at Table 2's size (79.2M): 21 forward-only MSSM layers
    (one direction's stacked MSSM with its own Linear: 11 D x D matrices per layer to the bidirectional layer's
    14) on the ms sub-sampler, whose MSSM layers are forward-only too. No look-ahead unless ``--lookahead-frames K``
    (each encoder frame then sees K sub-sampled frames ahead, and streams K x 40 ms later)."""
    set_defaults(args, causal_encoder=True, encoder_layers=21)
    mssm_transducer(args)


@register_model_architecture("transducer", "mssm_transducer_large")
def mssm_transducer_large(args):
    """Table 3, 140.3M: 32 MSSM layers, auxiliary CTC classifiers every 4 layers."""
    set_defaults(args, encoder_layers=32, aux_ctc_every=4)
    mssm_transducer(args)


@register_model_architecture("transducer", "stateformer_transducer")
def stateformer_transducer(args):
    """Table 2, 96.1M: 16 Stateformer layers (MSSM block as mssm_transducer, then 8-head attention)."""
    set_defaults(args, encoder_type="stateformer", encoder_attention_heads=8)
    mssm_transducer(args)


@register_model_architecture("transducer", "stateformer_transducer_large")
def stateformer_transducer_large(args):
    """Table 3, 139.8M: 25 Stateformer layers, auxiliary CTC classifiers every 4 layers."""
    set_defaults(args, encoder_layers=25, aux_ctc_every=4)
    stateformer_transducer(args)


@register_model_architecture("transducer", "transformer_transducer")
def transformer_transducer(args):
    """Table 2, 77.5M: 20 transformer layers, 8 heads, conv sub-sampler, sinusoidal positions."""
    set_defaults(args, encoder_type="transformer", encoder_layers=20, encoder_attention_heads=8, subsampler="conv",
                  encoder_positions=True)


@register_model_architecture("transducer", "conformer_transducer")
def conformer_transducer(args):
    """Table 2, 92.7M: 20 Conformer layers (convolution before attention, kernel 31, no macaron)."""
    set_defaults(args, encoder_type="conformer")
    transformer_transducer(args)


@register_model_architecture("transducer", "s4_transducer")
def s4_transducer(args):
    """Table 2, 78.8M: 20 layers, a bidirectional single-head S4-LegS block (stack 2, N = 32) for attention."""
    set_defaults(args, encoder_type="s4", encoder_layers=20, subsampler="conv")
