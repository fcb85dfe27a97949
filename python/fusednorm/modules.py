"""nn.Module layers and model surgery.

``LayerNorm`` and ``RMSNorm`` subclass ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm``: same
constructor arguments, parameters, ``reset_parameters``, ``extra_repr`` and state_dict keys, so
checkpoints load either way and ``isinstance`` checks keep working; only ``forward`` differs.
"""

import warnings

import torch

from .ops import layer_norm, rms_norm

__all__ = ["LayerNorm", "RMSNorm", "HFStyleRMSNorm", "replace_norms"]


class LayerNorm(torch.nn.LayerNorm):
    """Drop-in ``torch.nn.LayerNorm`` computed by fusednorm.

    ``memory_efficient=True`` saves the output instead of the input for the backward.
    """

    def __init__(
        self,
        normalized_shape,
        eps=1e-5,
        elementwise_affine=True,
        bias=True,
        device=None,
        dtype=None,
        *,
        memory_efficient=False,
    ):
        super().__init__(
            normalized_shape, eps, elementwise_affine, bias, device=device, dtype=dtype
        )
        self.memory_efficient = memory_efficient

    def forward(self, input):
        return layer_norm(
            input,
            self.normalized_shape,
            self.weight,
            self.bias,
            self.eps,
            memory_efficient=self.memory_efficient,
        )

    def extra_repr(self):
        s = super().extra_repr()
        return s + ", memory_efficient=True" if self.memory_efficient else s


class RMSNorm(torch.nn.RMSNorm):
    """Drop-in ``torch.nn.RMSNorm`` computed by fusednorm (``eps=None``: finfo(dtype).eps)."""

    def __init__(
        self,
        normalized_shape,
        eps=None,
        elementwise_affine=True,
        device=None,
        dtype=None,
        *,
        memory_efficient=False,
    ):
        super().__init__(normalized_shape, eps, elementwise_affine, device=device, dtype=dtype)
        self.memory_efficient = memory_efficient

    def forward(self, x):
        return rms_norm(
            x, self.normalized_shape, self.weight, self.eps, memory_efficient=self.memory_efficient
        )

    def extra_repr(self):
        s = super().extra_repr()
        return s + ", memory_efficient=True" if self.memory_efficient else s


class HFStyleRMSNorm(torch.nn.Module):
    """Replacement for Hugging Face style RMSNorm modules (LlamaRMSNorm and its many copies).

    Those compute ``weight * (x.float() * rsqrt(mean(x.float()**2) + eps)).to(x.dtype)``.
    When weight and input share a dtype the whole expression is one fused kernel (which rounds
    once, where the original rounds twice). When they differ (e.g. fp32 weight, bf16 input) the
    original's result has the promoted dtype: the normalization is fused, rounded to the input's
    dtype as in the original, and the weight multiply stays a separate op, which mirrors it.

    The state_dict holds only ``weight``, as the original's does; the epsilon keeps the
    original's attribute name (``variance_epsilon`` or ``eps``).
    """

    def __init__(self, weight, eps, eps_attr="variance_epsilon", memory_efficient=False):
        super().__init__()
        self.weight = weight
        self._eps_attr = eps_attr
        setattr(self, eps_attr, eps)
        self.memory_efficient = memory_efficient

    def forward(self, hidden_states):
        eps = getattr(self, self._eps_attr)
        shape = (self.weight.shape[-1],)
        if self.weight.dtype == hidden_states.dtype:
            return rms_norm(
                hidden_states, shape, self.weight, eps, memory_efficient=self.memory_efficient
            )
        normed = rms_norm(hidden_states, shape, None, eps, memory_efficient=self.memory_efficient)
        return self.weight * normed

    def extra_repr(self):
        return f"{tuple(self.weight.shape)}, {self._eps_attr}={getattr(self, self._eps_attr)}"


def _plain_subclass(module, base, ours):
    """True if module is a `base` whose forward is base's own (not a customized subclass)."""
    return (
        isinstance(module, base)
        and not isinstance(module, ours)
        and type(module).forward is base.forward
    )


def _fused_layer_norm(old, memory_efficient):
    new = LayerNorm.__new__(LayerNorm)
    torch.nn.Module.__init__(new)
    new.normalized_shape = tuple(old.normalized_shape)
    new.eps = old.eps
    new.elementwise_affine = old.elementwise_affine
    new.weight = old.weight  # the same Parameter objects (or None)
    new.bias = old.bias
    new.memory_efficient = memory_efficient
    return new


def _fused_rms_norm(old, memory_efficient):
    new = RMSNorm.__new__(RMSNorm)
    torch.nn.Module.__init__(new)
    new.normalized_shape = tuple(old.normalized_shape)
    new.eps = old.eps
    new.elementwise_affine = old.elementwise_affine
    new.weight = old.weight
    new.memory_efficient = memory_efficient
    return new


def _hf_eps_attr(module):
    for attr in ("variance_epsilon", "eps"):
        value = getattr(module, attr, None)
        if isinstance(value, float) and value > 0:
            return attr
    return None


def _looks_hf_rms_norm(module):
    if not type(module).__name__.endswith("RMSNorm") or isinstance(module, torch.nn.RMSNorm):
        return False
    if isinstance(module, HFStyleRMSNorm):
        return False
    weight = getattr(module, "weight", None)
    params = dict(module.named_parameters(recurse=True))
    return (
        isinstance(weight, torch.nn.Parameter)
        and weight.dim() == 1
        and list(params) == ["weight"]
        and not list(module.buffers())
        and not list(module.children())
        and _hf_eps_attr(module) is not None
    )


_PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _same_function(old, new):
    """Runs both modules on a probe input and says whether they agree.

    The name pattern alone cannot tell a Llama-style RMSNorm from a variant such as Gemma's,
    which scales by (1 + weight): such a module fails this check and is left alone.
    """
    weight = old.weight
    if weight.device.type not in ("cpu", "cuda") or weight.dtype not in _PROBE_TOLERANCE:
        return False
    n = weight.shape[0]
    gen = torch.Generator().manual_seed(1234)
    probe = torch.randn(4, n, generator=gen) * 3 + 0.5
    probe[1] *= 1e-3  # small rows make eps matter, so its meaning is checked too
    probe = probe.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        try:
            expected = old.forward(probe)
            got = new.forward(probe)
        except Exception:  # noqa: BLE001 - any failure means "not the same function"
            return False
    if not isinstance(expected, torch.Tensor) or expected.shape != got.shape:
        return False
    if expected.dtype != got.dtype:
        return False
    tol = _PROBE_TOLERANCE[weight.dtype]
    scale = expected.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    err = ((expected.float() - got.float()).abs() / scale).max().item()
    return err <= tol


def _replacement(module, memory_efficient):
    if _plain_subclass(module, torch.nn.LayerNorm, LayerNorm):
        return _fused_layer_norm(module, memory_efficient)
    if _plain_subclass(module, torch.nn.RMSNorm, RMSNorm):
        return _fused_rms_norm(module, memory_efficient)
    if _looks_hf_rms_norm(module):
        attr = _hf_eps_attr(module)
        new = HFStyleRMSNorm(module.weight, getattr(module, attr), attr, memory_efficient)
        if _same_function(module, new):
            return new
        warnings.warn(
            f"fusednorm.replace_norms: {type(module).__name__} looks like an RMSNorm but does not "
            "compute weight * x / rms(x) (or could not be checked); left unchanged",
            stacklevel=3,
        )
    return None


def replace_norms(model, *, memory_efficient=False):
    """Swaps the norm layers of `model` for fusednorm ones, in place, and returns the model.

    Replaced: every ``torch.nn.LayerNorm`` and ``torch.nn.RMSNorm`` (and subclasses that do not
    override forward), and Hugging Face style RMSNorm modules: a class whose name ends in
    "RMSNorm" with only a 1-D ``weight`` parameter and a ``variance_epsilon`` or ``eps``
    attribute, kept only if it computes what LlamaRMSNorm computes (checked on a probe input).
    The replacements hold the same Parameter objects, so optimizers keep working; the training
    flag is kept, module hooks on the replaced modules are not. A module shared at several
    places stays shared. If `model` is itself a norm layer, its replacement is returned.
    """
    replaced = {}

    def visit(parent):
        for name, child in list(parent.named_children()):
            if id(child) in replaced:
                setattr(parent, name, replaced[id(child)])
                continue
            new = _replacement(child, memory_efficient)
            if new is not None:
                new.train(child.training)
                replaced[id(child)] = new
                setattr(parent, name, new)
            else:
                visit(child)

    root = _replacement(model, memory_efficient)
    if root is not None:
        root.train(model.training)
        return root
    visit(model)
    return model
