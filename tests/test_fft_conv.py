import pytest
import torch

from ssm_fairseq.ssm import bidirectional_fft_conv, fft_conv, two_way_fft_conv
from ssm_fairseq.ssm.fft_conv import fft_size, two_way_spectra, two_way_spectrum


def direct_causal(u, K, D=None):
    """``y[b,c,h,k] = sum_{j<=k} K[c,h,k-j] u[b,h,j] (+ D u)`` by explicit sums."""
    B, H, L = u.shape
    y = torch.zeros(B, K.shape[0], H, L, dtype=u.dtype)
    for k in range(L):
        for j in range(k + 1):
            y[..., k] += K[None, :, :, k - j] * u[:, None, :, j]
    if D is not None:
        y += D[None, :, :, None] * u[:, None]
    return y


@pytest.mark.parametrize("L", [1, 5, 16])
def test_causal_equals_direct_sum(L):
    u = torch.randn(2, 3, L, dtype=torch.float64)
    K, D = torch.randn(2, 3, L + 4, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(fft_conv(u, K, D), direct_causal(u, K[..., :L], D), rtol=1e-10, atol=1e-10)


def test_reverse_is_reversed_causal():
    u = torch.randn(2, 3, 11, dtype=torch.float64)
    K = torch.randn(1, 3, 11, dtype=torch.float64)
    naive = direct_causal(u.flip(-1), K).flip(-1)
    torch.testing.assert_close(fft_conv(u, K, reverse=True), naive, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("L", [1, 2, 9])
def test_bidirectional_equals_forward_plus_reversed_backward(L):
    u = torch.randn(2, 3, L, dtype=torch.float64)
    Kf, Kb = torch.randn(2, 3, L, dtype=torch.float64), torch.randn(2, 3, L, dtype=torch.float64)
    D = torch.randn(2, 3, dtype=torch.float64)
    naive = direct_causal(u, Kf, D) + direct_causal(u.flip(-1), Kb).flip(-1)
    torch.testing.assert_close(bidirectional_fft_conv(u, Kf, Kb, D), naive, rtol=1e-10, atol=1e-10)


def test_padding_never_reaches_real_frames():
    lengths = [7, 4, 1]
    L = max(lengths)
    Kf, Kb = torch.randn(1, 3, L, dtype=torch.float64), torch.randn(1, 3, L, dtype=torch.float64)
    D = torch.randn(1, 3, dtype=torch.float64)
    u = torch.randn(3, 3, L, dtype=torch.float64) * 100  # garbage in the padding
    mask = torch.arange(L)[None, :] >= torch.tensor(lengths)[:, None]
    y_bi = bidirectional_fft_conv(u, Kf, Kb, D, padding_mask=mask)
    y_rev = fft_conv(u, Kb, D, padding_mask=mask, reverse=True)
    for b, n in enumerate(lengths):
        alone = u[b : b + 1, :, :n]
        torch.testing.assert_close(y_bi[b : b + 1, ..., :n], bidirectional_fft_conv(alone, Kf, Kb, D))
        torch.testing.assert_close(y_rev[b : b + 1, ..., :n], fft_conv(alone, Kb, D, reverse=True))
        assert (y_bi[b, ..., n:] == 0).all() and (y_rev[b, ..., n:] == 0).all()


def test_low_precision_input_is_convolved_in_float32():
    u = torch.randn(1, 2, 64)
    K = torch.randn(1, 2, 64)
    y = fft_conv(u.to(torch.bfloat16), K)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), fft_conv(u.to(torch.bfloat16).float(), K), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    "u, K, D, mask, message",
    [
        (torch.randn(2, 4, 8), torch.randn(1, 3, 8), None, None, r"u must have shape \(batch, 3, length\), got \(2, 4, 8\)"),
        (torch.randn(4, 8), torch.randn(1, 4, 8), None, None, r"u must have shape \(batch, 4, length\), got \(4, 8\)"),
        (torch.randn(2, 3, 8), torch.randn(3, 8), None, None, r"kernel must have shape \(C, H, L\), got \(3, 8\)"),
        (torch.randn(2, 3, 9), torch.randn(1, 3, 8), None, None, r"kernel must have shape \(C, 3, >=9\)"),
        (torch.randn(2, 3, 8), torch.randn(1, 3, 8), torch.randn(3), None, r"skip D must have shape \(1, 3\), got \(3,\)"),
        (torch.randn(2, 3, 8), torch.randn(1, 3, 8), None, torch.zeros(2, 7, dtype=torch.bool), r"padding_mask must have shape \(2, 8\), got \(2, 7\)"),
        (torch.zeros(2, 3, 8, dtype=torch.long), torch.randn(1, 3, 8), None, None, "real floating-point tensor, got dtype torch.int64"),
    ],
)
def test_bad_input(u, K, D, mask, message):
    with pytest.raises(ValueError, match=message):
        fft_conv(u, K, D, padding_mask=mask)


@pytest.mark.parametrize("L", [1, 5, 12])
def test_gradients_equal_finite_differences(L):
    """The circular convolution's own backward (real FFT correlations), causal, anti-causal and bidirectional."""
    torch.manual_seed(L)
    u = torch.randn(2, 3, L, dtype=torch.float64, requires_grad=True)
    K = torch.randn(2, 3, L + 2, dtype=torch.float64, requires_grad=True)
    K2 = torch.randn(1, 3, L, dtype=torch.float64, requires_grad=True)
    D = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, L, dtype=torch.bool)
    mask[1, L // 2 + 1:] = True
    for reverse in (False, True):
        assert torch.autograd.gradcheck(lambda u, K, D: fft_conv(u, K, D, mask, reverse), (u, K, D))
    assert torch.autograd.gradcheck(lambda u, K, K2: bidirectional_fft_conv(u, K[:1], K2, None, mask), (u, K, K2))


@pytest.mark.parametrize("L", [1, 6, 13])
def test_two_way_convolution_equals_each_half_convolved_its_own_way(L):
    """Both directions of a bidirectional block in one FFT pair: outputs, padding and gradients as two convolutions."""
    torch.manual_seed(L)
    u = torch.randn(2, 6, L, dtype=torch.float64, requires_grad=True)
    Kf, Kb = (torch.randn(2, 3, L + 1, dtype=torch.float64, requires_grad=True) for _ in range(2))
    Df, Db = (torch.randn(2, 3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    mask = torch.zeros(2, L, dtype=torch.bool)
    mask[1, L // 2 + 1:] = True
    y = two_way_fft_conv(u, (Kf, Df), (Kb, Db), mask)
    expected = torch.stack([fft_conv(u[:, :3], Kf, Df, mask), fft_conv(u[:, 3:], Kb, Db, mask, reverse=True)], dim=1)
    real = ~mask[:, None, None, None, :]
    torch.testing.assert_close(y, expected, rtol=1e-10, atol=1e-10)
    assert (y[1, ..., L // 2 + 1:] == 0).all()
    noisy = u.detach().clone()
    noisy[1, :, L // 2 + 1:] = 1e3 * torch.randn_like(noisy[1, :, L // 2 + 1:])  # padding never reaches a real frame
    torch.testing.assert_close(two_way_fft_conv(noisy, (Kf, Df), (Kb, Db), mask) * real, y * real, rtol=0, atol=0)
    with torch.no_grad():  # a kept spectrum gives what the convolution computes itself, bit for bit
        spectrum = two_way_spectrum((Kf, Df), (Kb, Db), L, torch.float64)
        kept = two_way_fft_conv(u, (Kf, Df), (Kb, Db), mask, spectrum=spectrum)  # padded outputs not zeroed
        torch.testing.assert_close(kept * real, y.detach(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="for inference"):
        two_way_fft_conv(u, (Kf, Df), (Kb, Db), mask, spectrum=spectrum)
    assert torch.autograd.gradcheck(lambda u, Kf, Df, Kb, Db: two_way_fft_conv(u, (Kf, Df), (Kb, Db), mask),
                                    (u, Kf, Df, Kb, Db))
    assert torch.autograd.gradcheck(lambda u, Kf, Kb: two_way_fft_conv(u, (Kf, None), (Kb, None)), (u, Kf, Kb))


def test_several_stages_spectra_in_one_transform_give_each_stages_convolution_and_gradients():
    """A block's stages' spectra as one FFT (``two_way_spectra``): each stage's convolution as with its own kernels,
    and the kernels' gradients through the shared transform by finite differences."""
    torch.manual_seed(0)
    L, S = 7, 3
    u = torch.randn(2, 6, L, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, L, dtype=torch.bool)
    mask[1, 5:] = True
    flat = [torch.randn(*shape, dtype=torch.float64, requires_grad=True)
            for _ in range(S) for shape in ((2, 3, L + 2), (2, 3), (2, 3, L), (2, 3))]

    def stages(flat):
        return [((flat[i], flat[i + 1]), (flat[i + 2], flat[i + 3])) for i in range(0, len(flat), 4)]

    def through_spectra(u, *flat):
        spectra = two_way_spectra(stages(flat), L, torch.float64).unbind(0)
        return torch.stack([two_way_fft_conv(u, padding_mask=mask, shared_spectrum=spectrum) for spectrum in spectra])

    expected = torch.stack([two_way_fft_conv(u, *stage, mask) for stage in stages(flat)])
    torch.testing.assert_close(through_spectra(u, *flat), expected, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(through_spectra, (u, *flat))


def test_shared_spectra_of_frozen_kernels_still_give_the_inputs_gradient_and_zero_padded_outputs():
    """Kernels without autograd (frozen) but inputs with it: the shared spectra carry no gradient, and the convolution
    is still differentiated with respect to its input and masks its padded outputs, as with the kernels given."""
    torch.manual_seed(0)
    L = 6
    u = torch.randn(2, 4, L, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, L, dtype=torch.bool)
    mask[0, 4:] = True
    stage = ((torch.randn(2, 2, L, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)),
             (torch.randn(2, 2, L, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)))
    (spectrum,) = two_way_spectra([stage], L, torch.float64).unbind(0)
    assert not spectrum.requires_grad
    y = two_way_fft_conv(u, padding_mask=mask, shared_spectrum=spectrum)
    assert (y[0, ..., 4:] == 0).all()
    torch.testing.assert_close(y, two_way_fft_conv(u, *stage, mask), rtol=0, atol=0)
    assert torch.autograd.gradcheck(lambda u: two_way_fft_conv(u, padding_mask=mask, shared_spectrum=spectrum), (u,))


def test_two_way_convolution_refuses_what_it_cannot_use():
    u = torch.randn(1, 4, 5)
    stage = ((torch.randn(2, 2, 5, requires_grad=True), None), (torch.randn(2, 2, 5, requires_grad=True), None))
    with pytest.raises(ValueError, match="needs exactly one of"):
        two_way_fft_conv(u)
    with pytest.raises(ValueError, match="needs exactly one of"):
        two_way_fft_conv(u, stage[0])
    with pytest.raises(ValueError, match="must have shape"):  # a spectrum of another length
        two_way_fft_conv(u, shared_spectrum=two_way_spectra([stage], 9)[0])
    spectrum = two_way_spectrum(*stage, 5)
    with pytest.raises(ValueError, match="padding_mask"):
        two_way_fft_conv(u, padding_mask=torch.zeros(1, 4, dtype=torch.bool), shared_spectrum=spectrum)
    with pytest.raises(ValueError, match="exactly one"):
        two_way_fft_conv(u, *stage, shared_spectrum=spectrum)
    with pytest.raises(ValueError, match="exactly one"):
        two_way_fft_conv(u, spectrum=spectrum.detach(), shared_spectrum=spectrum)
    with pytest.raises(ValueError, match="for inference"):  # a kept spectrum has no gradient to give
        two_way_fft_conv(u, spectrum=spectrum)
    with pytest.raises(ValueError, match="even number of channels"):
        two_way_fft_conv(torch.randn(1, 5, 5), spectrum=spectrum.detach())
    with pytest.raises(ValueError, match="must come from two_way_spectra"):  # not its own form of the gradient
        two_way_fft_conv(u, shared_spectrum=spectrum.conj() * 1)


def test_fft_sizes_are_fast_and_long_enough():
    for n in range(1, 5000):
        size = fft_size(n)
        assert size >= n and (size & (size - 1) == 0 or (size % 3 == 0 and (size // 3) & (size // 3 - 1) == 0))
        assert size < 2 * n or n == 1


@pytest.mark.parametrize("reverse", [False, True])
def test_backward_keeps_the_input_and_the_kernels_spectrum_only(reverse):
    # The convolution keeps its real input (not its batch-sized spectrum) and the kernels' spectrum, which has no
    # batch dimension; nothing at the FFT size in the time domain.
    u = torch.randn(2, 3, 10, requires_grad=True)
    K = torch.randn(2, 3, 40, requires_grad=True)
    D = torch.randn(2, 3, requires_grad=True)
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.is_complex()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fft_conv(u, K, D, reverse=reverse)
    spectrum = ((2, 3, fft_size(19) // 2 + 1), True)  # C x H x (n/2 + 1)
    assert sorted(saved) == sorted([((2, 3, 10), False), spectrum])


def test_two_way_backward_keeps_the_input_and_both_directions_spectrum_only():
    u = torch.randn(2, 6, 10, requires_grad=True)  # B x 2H x L
    causal = (torch.randn(2, 3, 10, requires_grad=True), torch.randn(2, 3, requires_grad=True))
    anticausal = (torch.randn(2, 3, 10, requires_grad=True), torch.randn(2, 3, requires_grad=True))
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.is_complex()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        two_way_fft_conv(u, causal, anticausal)
    spectrum = ((2, 2, 3, fft_size(19) // 2 + 1), True)  # directions x C x H x (n/2 + 1)
    assert sorted(saved) == sorted([((2, 6, 10), False), spectrum])
