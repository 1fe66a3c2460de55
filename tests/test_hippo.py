import torch

from ssm_fairseq.ssm.hippo import diagonal_init, legs_matrices, legs_nplr


def test_legs_matrix_is_the_hippo_legs_operator():
    # HiPPO-LegS written out directly: -sqrt((2i+1)(2j+1)) below the diagonal, -(i+1) on it, 0 above.
    N = 7
    A, B, _ = legs_matrices(N)
    for i in range(N):
        for j in range(N):
            expected = -((2 * i + 1) * (2 * j + 1)) ** 0.5 if i > j else (-(i + 1.0) if i == j else 0.0)
            assert abs(A[i, j].item() - expected) < 1e-12
        assert abs(B[i].item() - (2 * i + 1) ** 0.5) < 1e-12


def test_nplr_reconstructs_legs():
    N = 10
    A, B, _ = legs_matrices(N)
    Lambda, P, Bt, V = legs_nplr(N)
    Vf = torch.cat([V, V.conj()], 1)  # full unitary basis
    full = lambda x: torch.cat([x, x.conj()])  # noqa: E731
    A_diag = torch.diag(full(Lambda)) - full(P)[:, None] * full(P).conj()[None, :]
    assert torch.allclose(Vf @ A_diag @ Vf.conj().T, A.to(Vf.dtype), atol=1e-10)
    assert torch.allclose(Vf @ full(Bt), B.to(Vf.dtype), atol=1e-10)
    # LegS has the eigenvalues -1, ..., -N.
    eig = torch.linalg.eigvals(A_diag).real.sort().values
    assert torch.allclose(eig, -torch.arange(N, 0, -1, dtype=eig.dtype), atol=1e-6)


def test_diagonal_inits():
    skew = diagonal_init("legs", 4)
    assert torch.allclose(skew.real, torch.full((4,), -0.5, dtype=torch.float64))
    assert (skew.imag > 0).all()
    lin = diagonal_init("lin", 3)
    assert torch.allclose(lin.imag, torch.tensor([0.0, torch.pi, 2 * torch.pi], dtype=torch.float64))
