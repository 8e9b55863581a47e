"""FP8 block-scaled weights, as DeepSeek-V3, R1 and Kimi-K2 are released, for the float64 numpy
reference (hf_reference.py reads them, hf_roundtrip.py writes them). numpy only.

A projection W (rows, cols) is stored as two safetensors tensors:

    <name>             F8_E4M3 (rows, cols)                        float8_e4m3fn codes, one byte each
    <name>_scale_inv   F32 (ceil(rows / br), ceil(cols / bc))      one scale per block

with [br, bc] config.json's quantization_config.weight_block_size (DeepSeek's release:
{"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size":
[128, 128]}). The dequantised weight is the fp32 product

    W[i, j] = fp32(e4m3fn(code[i, j]) * scale_inv[i // br, j // bc])

(DeepSeek's weight_dequant; transformers' _dequantize_fp8_weight), edge blocks partial: a block
that runs past the last row or column keeps the scale of the block it starts. (DeepSeek-V3's own
kv_a_proj_with_mqa, 576 = 4.5 x 128 rows, has such a block.) e4m3fn codes hold at most 4
significant bits, so decoding is exact in fp32 and the product is rounded once, to fp32; the
reference then widens it to float64 exactly. moepeak's core/checkpoint/fp8.h decodes the same way.

float8_e4m3fn (OCP FP8 E4M3, "fn": finite, no infinities): sign, 4 exponent bits (bias 7), 3
mantissa bits; exponent 0 is subnormal (m/8 * 2^-6); 0x7F and 0xFF are NaN; the largest finite
value is 448. There is no numpy dtype for it: the codes are uint8 here.

Quantising (hf_roundtrip.py make --fp8): per block, scale_inv = fp32(max|W| / 448) (1 for an
all-zero block), codes = the nearest e4m3fn value of fp32(W / scale_inv), ties to the even code,
saturating at 448 (no NaN, no infinity), as DeepSeek's blockwise weight quantisation.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

E4M3_MAX = 448.0
E4M3_NAN_CODES = (0x7F, 0xFF)


def _e4m3fn_table() -> np.ndarray:
    """The float32 value of each of the 256 codes (NaN for 0x7F and 0xFF)."""
    values = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign, exponent, mantissa = code >> 7, (code >> 3) & 0xF, code & 0x7
        if exponent == 0xF and mantissa == 0x7:
            v = float("nan")
        elif exponent == 0:
            v = mantissa / 8.0 * 2.0 ** -6
        else:
            v = (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)
        values[code] = -v if sign else v
    return values.astype(np.float32)  # exact: at most 4 significant bits


E4M3FN_VALUES = _e4m3fn_table()
# Codes 0x00..0x7E are the non-negative finite values in increasing order (0 to 448).
_POSITIVE = E4M3FN_VALUES[:0x7F].astype(np.float64)


def e4m3fn_decode(codes: np.ndarray) -> np.ndarray:
    """uint8 codes -> their float32 values, exactly; ValueError on a NaN code."""
    codes = np.asarray(codes, dtype=np.uint8)
    nan = (codes == 0x7F) | (codes == 0xFF)
    if np.any(nan):
        at = tuple(int(i) for i in np.argwhere(nan)[0])
        raise ValueError(f"float8_e4m3fn NaN code at element {at}")
    return E4M3FN_VALUES[codes]


def e4m3fn_encode(x: np.ndarray) -> np.ndarray:
    """The nearest float8_e4m3fn code of each value (uint8), ties to the even code, magnitudes
    above 448 saturating to 448. ValueError on NaN."""
    x = np.asarray(x, dtype=np.float64)
    if np.any(np.isnan(x)):
        raise ValueError("cannot encode NaN as a finite float8_e4m3fn")
    a = np.minimum(np.abs(x), E4M3_MAX)
    hi = np.clip(np.searchsorted(_POSITIVE, a, side="left"), 0, 0x7E)  # _POSITIVE[hi] >= a
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - _POSITIVE[lo], _POSITIVE[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return np.where(np.signbit(x), code | 0x80, code).astype(np.uint8)  # -0 is 0x80, as torch


def scale_shape(shape: Tuple[int, int], block: Tuple[int, int]) -> Tuple[int, int]:
    """(ceil(rows / br), ceil(cols / bc)): the shape of a weight's scale_inv."""
    rows, cols = shape
    br, bc = block
    return (-(-rows // br), -(-cols // bc))


def _expand(scale_inv: np.ndarray, shape: Tuple[int, int], block: Tuple[int, int]) -> np.ndarray:
    """Each element's block scale, (rows, cols)."""
    rows, cols = shape
    return np.repeat(np.repeat(scale_inv, block[0], axis=0), block[1], axis=1)[:rows, :cols]


def block_dequantize(codes: np.ndarray, scale_inv: np.ndarray, block: Tuple[int, int],
                     name: str = "weight") -> np.ndarray:
    """codes (rows, cols) uint8 and scale_inv (ceil(rows/br), ceil(cols/bc)) float32 -> the fp32
    products (rows, cols), float32. ValueError naming the tensor for a shape mismatch, a NaN code,
    or a scale that is not finite and positive."""
    codes = np.asarray(codes, dtype=np.uint8)
    scale_inv = np.asarray(scale_inv, dtype=np.float32)
    if codes.ndim != 2 or len(block) != 2 or min(block) <= 0:
        raise ValueError(f"{name}: FP8 block scaling needs a 2-D weight and a positive block, got "
                         f"shape {codes.shape} and block {tuple(block)}")
    expect = scale_shape(codes.shape, block)
    if scale_inv.shape != expect:
        raise ValueError(f"{name}_scale_inv: shape {scale_inv.shape}, but {codes.shape} in blocks of "
                         f"{list(block)} needs {expect}")
    if not np.all(np.isfinite(scale_inv) & (scale_inv > 0)):
        raise ValueError(f"{name}_scale_inv: scales must be finite and positive")
    try:
        values = e4m3fn_decode(codes)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    return (values * _expand(scale_inv, codes.shape, block)).astype(np.float32)  # fp32 product


def block_quantize(w: np.ndarray, block: Tuple[int, int]) -> Tuple[np.ndarray, np.ndarray]:
    """w (rows, cols) -> (codes uint8 (rows, cols), scale_inv float32 (ceil(rows/br),
    ceil(cols/bc))): each block's largest magnitude maps to 448 (see the module docstring)."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    br, bc = block
    sr, sc = scale_shape(w.shape, block)
    scale_inv = np.ones((sr, sc), dtype=np.float32)
    for i in range(sr):
        for j in range(sc):
            amax = float(np.max(np.abs(w[i * br:(i + 1) * br, j * bc:(j + 1) * bc])))
            if amax > 0:
                scale_inv[i, j] = np.float32(amax / E4M3_MAX)
    scaled = (w / _expand(scale_inv, w.shape, block)).astype(np.float32)  # fp32 quotient
    return e4m3fn_encode(scaled), scale_inv
