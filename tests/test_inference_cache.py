"""Values kept between inference passes (``ssm/inference_cache.py``): a bidirectional MSSM block's stage spectra and
stacked weights equal fresh ones, and are recomputed exactly when a parameter changes (an optimiser step, a loaded
state dict), in train mode or with autograd, and at another length."""
import pytest
import torch

from ssm_fairseq.layers.state_space import bidirectional_ssm
from ssm_fairseq.layers.state_space.bidirectional_ssm import BidirectionalSSM
from ssm_fairseq.ssm.fft_conv import two_way_spectrum


def _block() -> BidirectionalSSM:
    torch.manual_seed(0)
    return BidirectionalSSM(8, heads=2, stack=2, gating="ihg", state_size=4).eval()


def _kept_values(block: BidirectionalSSM) -> dict:
    return block.__dict__.get("_inference_values", {})


def _fresh_spectrum(block: BidirectionalSSM, stage: int, L: int) -> torch.Tensor:
    kernels = [ssm.kernels[stage] for ssm in (block.forward_ssm, block.backward_ssm)]
    with torch.no_grad():
        return two_way_spectrum(*((k.kernel(L), k.D) for k in kernels), L)


def _spectra(block: BidirectionalSSM) -> list[torch.Tensor]:
    return [_kept_values(block)[f"spectrum {i}"][1] for i in range(2)]


def test_kept_spectra_equal_fresh_ones_and_outputs_equal_the_uncached_forward():
    block = _block()
    x = torch.randn(2, 13, 8)
    padding_mask = torch.zeros(2, 13, dtype=torch.bool)
    padding_mask[1, 9:] = True
    with torch.enable_grad():  # the uncached path (autograd on: nothing is kept)
        expected = block(x, padding_mask).detach()
    assert not _kept_values(block)
    with torch.no_grad():
        first = block(x, padding_mask)
        spectra = _spectra(block)
        second = block(x, padding_mask)  # from the kept spectra
    for i, spectrum in enumerate(spectra):
        torch.testing.assert_close(spectrum, _fresh_spectrum(block, i, 13), rtol=0, atol=0)
    assert all(a is b for a, b in zip(spectra, _spectra(block)))  # reused, not recomputed
    real = ~padding_mask.unsqueeze(-1)
    torch.testing.assert_close(first * real, expected * real, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(second, first, rtol=0, atol=0)


def test_kept_values_are_recomputed_after_an_optimiser_step_and_a_loaded_state_dict():
    block = _block()
    x = torch.randn(1, 11, 8)
    with torch.no_grad():
        block(x)
    before = _spectra(block)
    in_proj_before = _kept_values(block)["in_proj"][1][0]
    block.train()
    block(x).square().mean().backward()
    torch.optim.SGD(block.parameters(), lr=0.1).step()
    block.eval()
    with torch.no_grad():
        y = block(x)
    after = _spectra(block)
    for i in range(2):
        assert not torch.equal(after[i], before[i])
        torch.testing.assert_close(after[i], _fresh_spectrum(block, i, 11), rtol=0, atol=0)
    assert not torch.equal(_kept_values(block)["in_proj"][1][0], in_proj_before)
    with torch.enable_grad():
        torch.testing.assert_close(y, block(x).detach(), rtol=1e-6, atol=1e-6)
    other = _block()
    with torch.no_grad():
        other.forward_ssm.kernels[1].C.mul_(2.0)  # a different stage-1 kernel, loaded into the block below
        block.load_state_dict(other.state_dict())
        block(x)
    torch.testing.assert_close(_spectra(block)[1], _fresh_spectrum(block, 1, 11), rtol=0, atol=0)


def test_nothing_is_kept_in_train_mode_or_with_autograd_and_another_length_replaces_the_spectra():
    block = _block()
    with torch.no_grad():
        block(torch.randn(1, 11, 8))
    assert "spectrum 0" in _kept_values(block)
    block.train()
    with torch.no_grad():
        block(torch.randn(1, 11, 8))
    assert not _kept_values(block)  # train() drops what inference kept
    block.eval()
    block(torch.randn(1, 11, 8))
    assert not _kept_values(block)  # so does autograd
    with torch.no_grad():
        block(torch.randn(1, 11, 8))
        block(torch.randn(1, 7, 8))
    spectrum = _spectra(block)[0]
    assert spectrum.shape[-1] == 9  # fft_size(2 * 7 - 1) = 16: 9 bins, length 7's spectrum (11's has 13)
    # the kernels' own cache gives length 11's first 7 taps: equal to length 7's kernel up to float32 rounding
    torch.testing.assert_close(spectrum, _fresh_spectrum(block, 0, 7), rtol=1e-5, atol=1e-6)


def test_spectra_above_the_limit_are_not_kept(monkeypatch):
    monkeypatch.setattr(bidirectional_ssm, "KEPT_SPECTRUM_BYTES", 0)
    block = _block()
    with torch.no_grad():
        block(torch.randn(1, 11, 8))
    assert "spectrum 0" not in _kept_values(block) and "in_proj" in _kept_values(block)


@pytest.mark.parametrize("frozen_kernels", [False, True])
def test_the_block_gives_the_same_outputs_padding_included_with_and_without_autograd(frozen_kernels):
    """In train mode (dropout 0), with a padding mask: the stages' spectra shared through one FFT give what they give
    without autograd, at padded positions too (zeroed after each stage either way); with the kernels frozen and an
    input that needs a gradient as well."""
    torch.manual_seed(0)
    block = BidirectionalSSM(8, heads=2, stack=2, gating="ihg", state_size=4).train()
    if frozen_kernels:
        for ssm in (block.forward_ssm, block.backward_ssm):
            ssm.kernels.requires_grad_(False)
    x = torch.randn(2, 11, 8, requires_grad=True)
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[1, 7:] = True
    with torch.no_grad():
        expected = block(x, mask)
    y = block(x, mask)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    y.square().sum().backward()
    assert x.grad is not None and x.grad[1, 7:].abs().max() == 0  # padding never reaches a real frame


def test_a_kept_spectrum_is_refused_with_autograd():
    block = _block()
    kernels = [(k.kernel(5), k.D) for k in (block.forward_ssm.kernels[0], block.backward_ssm.kernels[0])]
    with torch.no_grad():
        spectrum = two_way_spectrum(*kernels, 5)
    from ssm_fairseq.ssm import two_way_fft_conv
    with pytest.raises(ValueError, match="for inference"):
        two_way_fft_conv(torch.randn(1, 16, 5), *kernels, spectrum=spectrum)
