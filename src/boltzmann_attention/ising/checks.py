"""Where checks of tensor values run: on the host (a read that waits for the device) or as asynchronous asserts.

One policy, set by :func:`value_checks`, governs two kinds of check:

* NaN and inf in the layer's inputs (``boltzmann_attention.validation.check_values``);
* the exact solvers' numerical limits: a query whose partition function underflows, or whose energy scale is
  beyond what its dtype resolves (float32 and bfloat16 rows above ``numerics.FLOAT32_SCALE_LIMIT``; float64
  rows above ``split.resolved_scale``).

Where checks read the host, the solvers rescue such queries (they are solved again in float64, which checks its
own resolution) and the layer's NaN check raises a ValueError naming the tensor. Where they do not, the forward
never waits on the device: the solvers refuse such queries with an asynchronous assert (a RuntimeError naming
the remedies when the device reaches it) instead of rescuing them, and the NaN check is an asynchronous assert
too. Either way no wrong number is returned.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

VALUE_CHECKS = ("auto", "host", "async", "off")
_policy = "auto"


@contextmanager
def value_checks(policy: str):
    """How checks of values run inside this context.

    'auto' (the default): eager on CPU, on the host (reading a CPU tensor costs no device sync): NaN is a
    ValueError naming the tensor, and the solvers rescue the queries beyond their dtype in float64; on any other
    device, and always while torch.compile traces, asynchronous asserts (``torch._assert_async``: the forward never
    waits on the device; a failed check fails the step when the device reaches it, with a RuntimeError naming it).
    'host': host checks on every device (host syncs). 'async': asynchronous asserts on every device. 'off': no NaN
    check; the solvers' limits are still asserted asynchronously (they guard the numbers, not the inputs)."""
    global _policy
    if not isinstance(policy, str) or policy not in VALUE_CHECKS:
        raise ValueError(f"unknown value-check policy {policy!r}; choose one of {VALUE_CHECKS}")
    before, _policy = _policy, policy
    try:
        yield
    finally:
        _policy = before


def policy() -> str:
    """The policy in force: one of VALUE_CHECKS."""
    return _policy


def on_host(device: torch.device) -> bool:
    """Whether checks of tensors on ``device`` read their values on the host under the policy in force."""
    if torch.compiler.is_compiling():
        return False
    return _policy == "host" or (_policy == "auto" and device.type == "cpu")
