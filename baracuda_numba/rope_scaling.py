"""Inverse frequencies of the common RoPE scaling rules, for ``RopePlan``'s ``inv_freq``.

Each helper returns a NumPy float32 vector ``[R/2]`` (computed in float64, rounded once),
for ``R = rotary_dim``; move it to the device with your framework. The formulas are those
of HF transformers' ``modeling_rope_utils`` (rope types ``default``, ``linear``,
``dynamic``, ``llama3``, ``yarn``), reimplemented here::

    default   inv_freq[i] = base^(−2i/R)
    linear    inv_freq / factor                       (positions divided by the factor)
    dynamic   default with base' = base · (factor·L/L_max − (factor − 1))^(R/(R−2)),
              L = max(seq_len, L_max)
    llama3    wavelength λ = 2π/inv_freq, L0 = original context: λ > L0/low → inv_freq/factor;
              λ < L0/high → inv_freq; between: (1−t)·inv_freq/factor + t·inv_freq with
              t = (L0/λ − low)/(high − low)
    yarn      blend of inv_freq/factor (interpolation) and inv_freq (extrapolation) with a
              linear ramp over the dims between the correction dims of beta_fast and
              beta_slow rotations; cos/sin are multiplied by the attention factor
              0.1·ln(factor) + 1 (or mscale / mscale_all_dim's ratio), returned alongside.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import InvalidProblem

__all__ = ["default_inv_freq", "dynamic_ntk_inv_freq", "linear_inv_freq", "llama3_inv_freq",
           "yarn_inv_freq"]


def _check(rotary_dim: int, base: float, fn: str) -> None:
    if not isinstance(rotary_dim, int) or rotary_dim < 2 or rotary_dim % 2:
        raise InvalidProblem(f"{fn}: rotary_dim = {rotary_dim!r} must be an even int >= 2")
    if not (isinstance(base, (int, float)) and math.isfinite(base) and base > 0):
        raise InvalidProblem(f"{fn}: base = {base!r} must be finite and > 0")


def _positive(value: float, name: str, fn: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise InvalidProblem(f"{fn}: {name} = {value!r} must be finite and > 0")


def _inv_freq64(rotary_dim: int, base: float) -> np.ndarray:
    return float(base) ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)


def default_inv_freq(rotary_dim: int, base: float = 10000.0) -> np.ndarray:
    """``base^(−2i/R)`` (HF ``default``)."""
    _check(rotary_dim, base, "default_inv_freq")
    return _inv_freq64(rotary_dim, base).astype(np.float32)


def linear_inv_freq(rotary_dim: int, base: float, factor: float) -> np.ndarray:
    """The default frequencies divided by ``factor`` (HF ``linear``)."""
    _check(rotary_dim, base, "linear_inv_freq")
    _positive(factor, "factor", "linear_inv_freq")
    return (_inv_freq64(rotary_dim, base) / factor).astype(np.float32)


def dynamic_ntk_inv_freq(rotary_dim: int, base: float, factor: float,
                         max_position_embeddings: int, seq_len: int | None = None) -> np.ndarray:
    """NTK-aware scaling of the base for a sequence of ``seq_len`` (HF ``dynamic``; below
    ``max_position_embeddings`` the base is unchanged)."""
    fn = "dynamic_ntk_inv_freq"
    _check(rotary_dim, base, fn)
    _positive(factor, "factor", fn)
    _positive(max_position_embeddings, "max_position_embeddings", fn)
    if rotary_dim == 2:
        raise InvalidProblem(f"{fn}: rotary_dim must be > 2 (the exponent R / (R - 2))")
    length = max(seq_len or 0, max_position_embeddings)
    scaled = base * ((factor * length / max_position_embeddings) - (factor - 1)) ** (
        rotary_dim / (rotary_dim - 2))
    return _inv_freq64(rotary_dim, scaled).astype(np.float32)


def llama3_inv_freq(rotary_dim: int, base: float, factor: float, low_freq_factor: float,
                    high_freq_factor: float,
                    original_max_position_embeddings: int) -> np.ndarray:
    """Llama 3.1's smooth blend of scaled and unscaled frequencies (HF ``llama3``)."""
    fn = "llama3_inv_freq"
    _check(rotary_dim, base, fn)
    for name, value in (("factor", factor), ("low_freq_factor", low_freq_factor),
                        ("high_freq_factor", high_freq_factor),
                        ("original_max_position_embeddings",
                         original_max_position_embeddings)):
        _positive(value, name, fn)
    if high_freq_factor <= low_freq_factor:
        raise InvalidProblem(f"{fn}: high_freq_factor = {high_freq_factor} must exceed "
                             f"low_freq_factor = {low_freq_factor}")
    inv_freq = _inv_freq64(rotary_dim, base)
    context = float(original_max_position_embeddings)
    wavelength = 2 * math.pi / inv_freq
    long_waves = wavelength > context / low_freq_factor
    short_waves = wavelength < context / high_freq_factor
    scaled = np.where(long_waves, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    middle = ~long_waves & ~short_waves
    return np.where(middle, blended, scaled).astype(np.float32)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(rotary_dim: int, base: float, factor: float,
                  original_max_position_embeddings: int, beta_fast: float = 32.0,
                  beta_slow: float = 1.0, mscale: float | None = None,
                  mscale_all_dim: float | None = None, attention_factor: float | None = None,
                  truncate: bool = True) -> tuple[np.ndarray, float]:
    """YaRN (HF ``yarn``): ``(inv_freq, attention_factor)``; multiply cos and sin by the
    attention factor (gathered or cached tables) as HF's rotary embedding does."""
    fn = "yarn_inv_freq"
    _check(rotary_dim, base, fn)
    _positive(factor, "factor", fn)
    _positive(original_max_position_embeddings, "original_max_position_embeddings", fn)
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor,
                                                                             mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (rotary_dim * math.log(original_max_position_embeddings
                                      / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # the ramp's width may not be zero
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = _inv_freq64(rotary_dim, base)
    blended = inv_freq / factor * (1 - extrapolation) + inv_freq * extrapolation
    return blended.astype(np.float32), float(attention_factor)
