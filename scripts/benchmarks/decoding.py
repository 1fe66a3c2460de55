#!/usr/bin/env python
"""Accuracy, real-time factor and peak memory of transducer decoding: our batched search against torchaudio's.

First a WER table (no timing): our greedy search and beam search at beams 1, 4 and 8, with at most 1, 3, 10 and
the default number of labels per frame, ranked by log-probability and by log-probability per step (length
normalised), with the mean log-probability of the best hypotheses (a search that finds more probable hypotheses
scores higher); one label per frame is icefall's "modified beam search". Then speed: for a trained checkpoint
(by default the one ``make demo`` leaves) and an evaluation subset, every utterance is decoded (encoder + search)
with

* ours: greedy, beam 4, modified beam 4 (one label per frame) and beam 8 (``ssm_fairseq.asr.search``), batched
  (all utterances of a ``--max-tokens`` batch at once, as ``fairseq-generate`` does) and one utterance at a time;
* torchaudio: ``torchaudio.models.RNNTBeamSearch`` (one utterance at a time, as it works) at beam 4,
  given the same model through torchaudio's ``transcribe``/``predict``/``join`` interface, with our default
  limit of labels per frame and our default ranking (length normalised).

With ``--lm-path LM.pt --lm-weight W`` the speed table adds our batched greedy, beam 4 and modified beam 4 fused
with that language model (shallow fusion, ``ssm_fairseq.asr.search.lm_fusion``; the LM loaded as
``fairseq-generate --lm-path`` loads it, with the data directory's ``dict.txt``).

RTF = decoding seconds / audio seconds (10 ms feature frames); lower is faster. WER is printed alongside so that
speed is not bought with accuracy. Time is the best of ``--repeats`` runs after a warm-up; peak memory as in
``measurement.py``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import editdistance
import torch
from measurement import add_measurement_arguments, in_subprocess, measure

import ssm_fairseq  # noqa: F401  (registers the task and model)
from fairseq import checkpoint_utils
from ssm_fairseq.asr.search import TransducerGenerator
from ssm_fairseq.asr.search.beam_search import beam_search
from ssm_fairseq.asr.search.greedy_search import greedy_search
from ssm_fairseq.asr.search.hypothesis import MAX_SYMBOLS_PER_FRAME
from ssm_fairseq.integrity.language_model_check import load_language_model

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CHECKPOINT = REPO / "exp/librispeech_mini/checkpoints/mssm_transducer/checkpoint_avg3.pt"
DEFAULT_DATA = REPO / "exp/librispeech_mini/data"
LIMITS = (1, 3, 10, MAX_SYMBOLS_PER_FRAME)  # 1: icefall's modified beam search (a blank or one label a frame)
BEAMS = (1, 4, 8)
LENGTH_NORM = 1.0  # the default of fairseq-generate (--lenpen 1), icefall and torchaudio
CONFIGS = [  # (label, implementation, beam, labels per frame, batched)
    ("greedy", "ours", 1, MAX_SYMBOLS_PER_FRAME, True), ("greedy", "ours", 1, MAX_SYMBOLS_PER_FRAME, False),
    ("beam 4", "ours", 4, MAX_SYMBOLS_PER_FRAME, True), ("beam 4", "ours", 4, MAX_SYMBOLS_PER_FRAME, False),
    ("beam 4", "torchaudio", 4, MAX_SYMBOLS_PER_FRAME, False),
    ("modified beam 4", "ours", 4, 1, True), ("modified beam 4", "ours", 4, 1, False),
    ("beam 8", "ours", 8, MAX_SYMBOLS_PER_FRAME, True), ("beam 8", "ours", 8, MAX_SYMBOLS_PER_FRAME, False),
]
FUSED_CONFIGS = [  # with --lm-path: the same searches fused with the LM
    ("greedy + LM", "ours+lm", 1, MAX_SYMBOLS_PER_FRAME, True),
    ("beam 4 + LM", "ours+lm", 4, MAX_SYMBOLS_PER_FRAME, True),
    ("modified beam 4 + LM", "ours+lm", 4, 1, True),
]


class TorchaudioInterface(torch.nn.Module):
    """Our ``TransducerModel`` behind torchaudio's ``RNNT`` methods, for ``RNNTBeamSearch``.

    ``RNNTBeamSearch`` takes the blank to be the last output unit (it scores labels as ``probs[:, :-1]``), while
    ours is ``<s>`` (index 0): ``order[j]`` is our unit for torchaudio's unit ``j``, with our blank moved last.
    torchaudio keeps predictor states as lists of ``[h, c]`` with the batch first; ours are LSTM ``(h, c)``
    pairs of ``1 x B x hidden``.
    """

    def __init__(self, model):
        super().__init__()
        self.model = model
        vocab = model.joiner.output.out_features
        self.order = torch.tensor([u for u in range(vocab) if u != model.blank] + [model.blank])

    def transcribe(self, sources, source_lengths):
        encoder = self.model.encoder(sources, source_lengths)
        return encoder["encoder_out"], encoder["encoder_lengths"]

    def predict(self, targets, target_lengths, state):
        ours = None if state is None else [(h.unsqueeze(0), c.unsqueeze(0)) for h, c in state]
        out, new_state = self.model.predictor(self.order[targets], ours)
        return out, target_lengths, [[h.squeeze(0), c.squeeze(0)] for h, c in new_state]

    def join(self, source_encodings, source_lengths, target_encodings, target_lengths):
        logits = self.model.joiner(source_encodings, target_encodings)[..., self.order]
        return logits, source_lengths, target_lengths


def load(checkpoint: Path, data: Path, subset: str, max_tokens: int):
    """The model, the subset's batches (fairseq's batching) and the SentencePiece decoder."""
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data)})
    model = models[0].eval()
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    batches = task.get_batch_iterator(dataset, max_tokens=max_tokens, max_positions=model.max_positions()
                                      ).next_epoch_itr(shuffle=False)
    return model, task, list(batches)


def words_and_references(task):
    """Functions: label ids -> words, and utterance ``i`` of a batch -> its reference words."""
    bpe, dictionary = task.build_bpe(None), task.target_dictionary

    def words(tokens) -> str:
        return bpe.decode(dictionary.string(torch.as_tensor(tokens), extra_symbols_to_ignore={dictionary.bos()}))

    def reference(batch, i) -> str:
        return words(batch["target"][i][batch["target"][i] != dictionary.pad()][:-1])  # no eos

    return words, reference


def build(args: argparse.Namespace) -> tuple[Callable[[], list[tuple[str, str]]], float]:
    """A function that decodes the whole subset -> (reference, hypothesis) word strings, and the audio seconds."""
    implementation, beam, limit, batched = args.one[0], int(args.one[1]), int(args.one[2]), args.one[3] == "batched"
    model, task, batches = load(args.checkpoint, args.data, args.subset, args.max_tokens)
    words, reference = words_and_references(task)
    seconds = sum(int(n) for batch in batches for n in batch["net_input"]["src_lengths"]) / 100
    if not batched:
        batches = [_single(batch, i) for batch in batches for i in range(len(batch["id"]))]

    if implementation == "torchaudio":
        from torchaudio.models import RNNTBeamSearch

        interface = TorchaudioInterface(model)  # torchaudio's default ranking: log-probability / length
        search = RNNTBeamSearch(interface, blank=len(interface.order) - 1, step_max_tokens=MAX_SYMBOLS_PER_FRAME)

        def run():
            pairs = []
            with torch.no_grad():
                for batch in batches:
                    net = batch["net_input"]
                    best = search(net["src_tokens"][0], net["src_lengths"], beam)[0]
                    labels = interface.order[torch.tensor(best[0][1:], dtype=torch.long)]  # it starts with the blank
                    pairs.append((reference(batch, 0), words(labels)))
            return pairs
        return run, seconds

    lm = load_language_model(args.lm_path, args.data, torch.device("cpu")) if implementation == "ours+lm" else None
    generator = TransducerGenerator([model], task.target_dictionary, beam=beam, max_symbols_per_frame=limit,
                                    length_norm=LENGTH_NORM, lm_model=lm, lm_weight=args.lm_weight if lm else 0.0)

    def run():
        pairs = []
        for batch in batches:
            for i, hypotheses in enumerate(generator.generate([model], batch)):
                pairs.append((reference(batch, i), words(hypotheses[0]["tokens"])))
        return pairs
    return run, seconds


def quality_table(args: argparse.Namespace) -> None:
    """WER % and mean best log-probability of greedy and beam search at each limit and ranking (no timing)."""
    model, task, batches = load(args.checkpoint, args.data, args.subset, args.max_tokens)
    words, reference = words_and_references(task)
    suppress = TransducerGenerator([model], task.target_dictionary).suppress
    with torch.no_grad():
        encoded = [model.encoder(b["net_input"]["src_tokens"], b["net_input"]["src_lengths"]) for b in batches]
    print("| search | labels per frame | ranking | WER % | mean log-prob of the best (nats) |")
    print("|---|---|---|---|---|")
    for beam in (None, *BEAMS):  # None: greedy search
        for limit in LIMITS:
            for length_norm in (0.0, LENGTH_NORM) if beam and beam > 1 else (0.0,):
                pairs, scores = [], []
                for batch, encoder in zip(batches, encoded):
                    out, lengths = encoder["encoder_out"], encoder["encoder_lengths"]
                    if beam is None:
                        best = greedy_search(model, out, lengths, limit, suppress)
                    else:
                        best = [h[0] for h in beam_search(model, out, lengths, beam, limit, 1, suppress, length_norm)]
                    pairs += [(reference(batch, i), words(h.tokens)) for i, h in enumerate(best)]
                    scores += [h.score for h in best]
                search = "greedy" if beam is None else f"beam {beam}"
                ranking = "log-prob / (len+1)" if length_norm else "log-prob"
                default = " (default)" if limit == MAX_SYMBOLS_PER_FRAME else ""
                print(f"| {search} | {limit}{default} | {ranking} | {word_error_rate(pairs):.1f} "
                      f"| {sum(scores) / len(scores):.2f} |", flush=True)


def _single(batch: dict, i: int) -> dict:
    """Utterance ``i`` of a batch as a batch of one, without padding."""
    length = int(batch["net_input"]["src_lengths"][i])
    return {"id": batch["id"][i : i + 1], "target": batch["target"][i : i + 1],
            "net_input": {"src_tokens": batch["net_input"]["src_tokens"][i : i + 1, :length],
                          "src_lengths": batch["net_input"]["src_lengths"][i : i + 1]}}


def word_error_rate(pairs: list[tuple[str, str]]) -> float:
    errors = sum(editdistance.eval(ref.split(), hyp.split()) for ref, hyp in pairs)
    return 100 * errors / sum(len(ref.split()) for ref, _ in pairs)


def measure_one(args: argparse.Namespace) -> dict:
    run, seconds = build(args)
    result = measure(run, "cpu", args.repeats, args.what)
    if args.what == "time":
        result.update(audio_seconds=seconds, wer=word_error_rate(run()))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--subset", default="test-mini")
    parser.add_argument("--max-tokens", type=int, default=20000, help="batched decoding: frames per batch")
    parser.add_argument("--lm-path", type=Path, default=None, help="also time the searches fused with this LM")
    parser.add_argument("--lm-weight", type=float, default=0.3, help="the fused LM's weight (default 0.3)")
    parser.add_argument("--tables", nargs="+", choices=("quality", "speed"), default=["quality", "speed"])
    add_measurement_arguments(parser, repeats=2)
    parser.set_defaults(device="cpu")
    parser.add_argument("--one", nargs=4, metavar=("IMPLEMENTATION", "BEAM", "LIMIT", "BATCHING"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device != "cpu":
        parser.error("decoding.py measures on the CPU only (the search's per-frame bookkeeping is Python)")
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(measure_one(args)))
        return
    if not args.checkpoint.is_file():
        parser.error(f"no checkpoint at {args.checkpoint}: run `make demo` first or pass --checkpoint")
    print(f"# Transducer decoding of {args.subset} ({args.checkpoint.name}), CPU, {args.threads} threads, "
          f"best of {args.repeats}, torch {torch.__version__}\n")
    if "quality" in args.tables:
        quality_table(args)
        print()
    if "speed" in args.tables:
        speed_table(args)


def speed_table(args: argparse.Namespace) -> None:
    """RTF, peak memory and WER of our default search (batched and not) and torchaudio's, each in a child."""
    print("| search | implementation | batching | RTF | vs ours greedy batched | peak MiB | WER % |")
    print("|---|---|---|---|---|---|---|")
    common = ["--checkpoint", str(args.checkpoint), "--data", str(args.data), "--subset", args.subset,
              "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats), "--threads", str(args.threads)]
    if args.lm_path:
        common += ["--lm-path", str(args.lm_path), "--lm-weight", str(args.lm_weight)]
    baseline = None
    for label, implementation, beam, limit, batched in CONFIGS + (FUSED_CONFIGS if args.lm_path else []):
        batching = "batched" if batched else "one at a time"
        r = in_subprocess(__file__, ["--one", implementation, str(beam), str(limit), "batched" if batched else "single",
                                     *common])
        rtf = r["seconds"] / r["audio_seconds"]
        baseline = baseline or rtf
        print(f"| {label} | {implementation} | {batching} | {rtf:.4f} | {rtf / baseline:.2f}x | {r['peak_mib']:.0f} "
              f"| {r['wer']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
