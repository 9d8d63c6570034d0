"""Boltzmann attention (Kim & Park, arXiv:2606.12478): attention weights as Ising marginals.

Energy convention, the one used everywhere in this package::

    E(s) = - sum_j h_j s_j - sum_{j<k} J_jk s_j s_k - sum_{j<k<l} K_jkl s_j s_k s_l,
    p(s) proportional to exp(-E(s)),   s in {-1, +1}^n.

J > 0 is ferromagnetic (keys j and k tend to be attended together), J < 0 makes them compete. For
query i the field is h_ij = q_i.k_j * scale + bias and the attention weight is a_ij = (<s_j>_i + 1) / 2;
with J = K = 0 that is sigmoid(2 h_ij). Adapters to other conventions (dimod minimises
+sum h s + sum J s s) convert at their boundary.

Read first: :mod:`boltzmann_attention.naive`, the definition by brute force that every fast path is tested
against. Layers: :func:`boltzmann_attention` (functional, SDPA conventions) and :class:`BoltzmannAttention`
(``nn.Module``), in :mod:`~boltzmann_attention.attention`; their coupling parametrisations in
:mod:`~boltzmann_attention.couplings`, the rules on their arguments in :mod:`~boltzmann_attention.validation`.
Ising marginals: :mod:`boltzmann_attention.ising` (one record per method, declared in its module).
NaN and inf are refused in every forward; :func:`value_checks` chooses how (a host check or an asynchronous
assert).
"""

from . import ising
from .attention import (
    MODES,
    BoltzmannAttention,
    FullCouplings,
    RelativeCouplings,
    ThreeBodyCouplings,
    WindowCouplings,
    boltzmann_attention,
    parameter_groups,
)
from .naive import naive_boltzmann_attention
from .validation import value_checks

__all__ = [
    "MODES",
    "BoltzmannAttention",
    "FullCouplings",
    "RelativeCouplings",
    "ThreeBodyCouplings",
    "WindowCouplings",
    "boltzmann_attention",
    "value_checks",
    "ising",
    "naive_boltzmann_attention",
    "parameter_groups",
]
__version__ = "0.1.0"
