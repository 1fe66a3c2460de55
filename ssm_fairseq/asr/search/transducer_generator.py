"""The generator that ``fairseq-generate`` drives: encoder, then greedy (beam 1) or beam search."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .beam_search import BeamSearch
from .greedy_search import GreedySearch
from .hypothesis import MAX_SYMBOLS_PER_FRAME, Hypothesis, SearchSettings
from .bigram_lm import BigramLM, check_ilm_weight
from .lm_fusion import LanguageModelFusion, check_is_language_model, check_lm_weight, check_same_units


class NonFiniteScoreError(ValueError):
    """A hypothesis scored NaN or inf; ``ids`` are the sample ids of the utterances, ``reason`` says why."""

    def __init__(self, ids: list[int], reason: str):
        super().__init__(f"sample ids {ids}: {reason}")
        self.ids, self.reason = ids, reason


class TransducerGenerator:
    """Decodes a fairseq speech batch with one transducer model.

    Returns fairseq's hypothesis dicts (``tokens``, ``score``, ``positional_scores``, ``alignment``), so
    ``fairseq-generate`` prints ``H-``/``D-``/``P-`` lines (and ``A-`` lines of ``frame-label`` index pairs with
    ``--print-alignment hard``) and scores them unchanged. ``score`` is the natural-log probability of the
    hypothesis under the model (fairseq prints it in base 2), whatever the ranking; ``positional_scores`` are the
    labels' emission log-probabilities. As fairseq's own hypotheses, ``tokens`` end with ``</s>``, whose positional
    score is the rest of ``score`` (the blanks' share), so that the positional scores sum to it; an all-blank
    decode is ``[</s>]``, which every fairseq scorer accepts. The search itself never emits ``<pad>``, ``<unk>``
    or ``</s>``.

    Args:
        models: a list with one ``TransducerModel`` (average checkpoints rather than ensembling).
        tgt_dict: the target dictionary.
        beam: 1 for greedy search, more for beam search.
        nbest: hypotheses per utterance (<= beam).
        max_symbols_per_frame: labels allowed within one encoder frame before the search moves on.
        length_norm: beam search ranks its final hypotheses by ``score / (len + 1) ** length_norm``.
        blank_penalty: subtracted from the blank's logit before the softmax (icefall's ``--blank-penalty``); the
            scores are then those of the penalised distribution. 0 (the default) keeps the model's.
        lm_model: a fairseq language model over the same dictionary, fused into the search (``lm_fusion``): every
            emitted label scores ``log p_asr + lm_weight * log p_lm``, and the scores, ``H-`` and ``P-`` lines
            included, are fused scores. None (the default) decodes with the transducer alone.
        lm_weight: the LM's weight; 0 searches without the LM (it is never run).
        lm_eos: add ``lm_weight * log p_lm(</s> | hypothesis)`` when a hypothesis is finished.
        ilm, ilm_weight: LODR: a ``BigramLM`` of the training transcripts (``bigram_lm``, ``--ilm-path``) whose
            ``ilm_weight * log p_bigram(label | previous label)`` every emitted label's fused score loses, estimating
            the transducer's internal LM; ``ilm_weight`` above 0 needs ``lm_model`` and ``lm_weight`` above 0.
        dtype: the floating-point type to decode in; the model is converted to it (``torch.bfloat16`` for
            ``fairseq-generate --bf16``, which, unlike ``--fp16``, fairseq leaves to the generator). None keeps the
            model's dtype. Either way the features are cast to the model's dtype before the encoder; kernels and
            FFTs still compute in float32 inside it, and the joiner's log-softmax runs in float32.
    """

    def __init__(self, models, tgt_dict, beam: int = 1, nbest: int = 1,
                 max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME, length_norm: float = 0.0,
                 blank_penalty: float = 0.0, lm_model=None, lm_weight: float = 0.0, lm_eos: bool = True,
                 dtype: torch.dtype | None = None, ilm: BigramLM | None = None, ilm_weight: float = 0.0):
        if len(models) != 1:
            raise ValueError(f"transducer search decodes with one model, got {len(models)}; "
                             "average the checkpoints (scripts/average_checkpoints.py) instead of ensembling")
        if nbest > beam:
            raise ValueError(f"--nbest {nbest} needs --beam >= {nbest}")
        self.model = models[0] if dtype is None else models[0].to(dtype)
        self.beam, self.nbest, self.length_norm = beam, nbest, length_norm
        self.eos = tgt_dict.eos()
        self.suppress = sorted({tgt_dict.pad(), tgt_dict.unk(), tgt_dict.eos()} - {self.model.blank})
        self.settings = SearchSettings(max_symbols_per_frame, tuple(self.suppress), blank_penalty)
        self.symbols_to_strip_from_output = {tgt_dict.bos(), tgt_dict.eos()}
        check_lm_weight(lm_weight)
        if lm_weight and lm_model is None:
            raise ValueError(f"--lm-weight {lm_weight} needs a language model (--lm-path)")
        if lm_model is not None:
            check_is_language_model(lm_model)
            check_same_units(lm_model.decoder.dictionary, tgt_dict)
        self.lm_model = lm_model
        if lm_model is not None:
            lm_model.eval()  # not chained: after fairseq's make_generation_fast_, eval() returns None
        self.lm_weight, self.lm_eos = lm_weight, lm_eos
        check_ilm_weight(ilm_weight)
        if ilm_weight and not lm_weight:
            raise ValueError(f"--ilm-weight {ilm_weight} needs a fused language model (--lm-path and --lm-weight "
                             f"above 0): LODR corrects shallow fusion")
        if ilm_weight and ilm is None:
            raise ValueError(f"--ilm-weight {ilm_weight} needs the bigram of the training transcripts (--ilm-path)")
        if ilm is not None:
            check_same_units(ilm.dictionary(), tgt_dict, "the --ilm-path bigram",
                             "scripts/build_bigram.py --data DATA, with the transducer's data directory")
        self.ilm, self.ilm_weight = ilm, ilm_weight

    @torch.no_grad()
    def generate(self, models, sample: dict, **unused) -> list[list[dict]]:
        """``sample["net_input"]``: ``src_tokens`` ``B x T x F`` and ``src_lengths`` ``B``."""
        self.model.eval()
        net_input = sample["net_input"]
        features = net_input["src_tokens"].to(self.model_dtype())
        encoder = self.model.encoder(features, net_input["src_lengths"])
        encoder_out, encoder_lengths = encoder["encoder_out"], encoder["encoder_lengths"]
        search = self.search(encoder_out.shape[0], encoder_out.device)
        search.advance(encoder_out, encoder_lengths)
        results = search.finish(self.nbest, self.length_norm)
        self._check_finite(results, sample)
        device = encoder_out.device
        return [[self._as_fairseq(h, device) for h in hypotheses] for hypotheses in results]

    def search(self, batch: int, device: torch.device) -> GreedySearch | BeamSearch:
        """A new search over ``batch`` utterances with this generator's settings (greedy for beam 1), fused with
        its language model if it has one and a weight above 0; feed it encoder frames with ``advance``, in one call
        or in chunks."""
        fusion = None if self.lm_model is None or not self.lm_weight else LanguageModelFusion(
            self.lm_model, self.lm_weight, self.model.blank, self.eos, self.lm_eos, self.ilm, self.ilm_weight)
        if self.beam == 1:
            return GreedySearch(self.model, batch, device, self.settings, fusion)
        return BeamSearch(self.model, batch, device, self.beam, self.settings, fusion)

    def model_dtype(self) -> torch.dtype:
        """The dtype of the model's floating-point parameters, which the features are cast to."""
        return next(p.dtype for p in self.model.parameters() if p.is_floating_point())

    def _check_finite(self, results: list[list[Hypothesis]], sample: dict) -> None:
        """Stop, naming the sample ids, at a hypothesis whose score is NaN or inf: the model computed NaN or inf
        somewhere (features are checked finite before; in float16, an activation beyond its range of 65504)."""
        bad = [b for b, hypotheses in enumerate(results) if not all(math.isfinite(h.score) for h in hypotheses)]
        if bad:
            ids = sample["id"][bad].tolist() if "id" in sample else bad
            dtype = self.model_dtype()
            hint = "; decode in float32 or bfloat16 (without --fp16)" if dtype == torch.float16 else ""
            if self.lm_model is not None and self.lm_weight:
                hint += (f"; or the fused scores overflowed: --lm-weight {self.lm_weight} times the language model's "
                         f"log-probabilities (decode without --lm-path, or with a weight of the order of 0.1 to 1, "
                         f"to tell)")
            raise NonFiniteScoreError(ids, f"hypothesis scores are not finite (NaN or inf): the {dtype} model "
                                           f"computed NaN or inf{hint}")

    def _as_fairseq(self, hypothesis: Hypothesis, device: torch.device) -> dict[str, Tensor | float | list]:
        rest = hypothesis.score - sum(hypothesis.token_scores)
        return {
            "tokens": torch.tensor(hypothesis.tokens + [self.eos], dtype=torch.long, device=device),
            "score": hypothesis.score,
            "positional_scores": torch.tensor(hypothesis.token_scores + [rest], device=device),
            "alignment": list(zip(hypothesis.frames, range(len(hypothesis.tokens)))),
        }
