"""Models: one training step of a ~1B-parameter Llama-shaped model, end to end.

The configuration is Llama-3.2-1B's public shape (hidden 2048, 16 layers, 32 query / 8
key-value heads of 128, MLP 8192, vocabulary 128256, tied embeddings) with random weights,
one sequence of 4096 tokens, f32 master weights under bf16 autocast, SDPA attention and
fused AdamW. A step is forward, backward, ``optimizer.step()`` and ``zero_grad``; its time
is the median wall clock of synchronised steps after warm-up (a step is tens of ms, so the
host's share is part of what a user gets). Rows, each on a freshly built model:

* unpatched eager (the reference of the speed column) and unpatched with each decoder
  layer compiled (``torch.compile`` default mode, compiled during warm-up; regional
  compilation, as transformers recommends for training: the 16 identical layers share one
  graph, so compiling takes seconds, not minutes);
* patched with this package (``baracuda_numba.transformers.apply_to_llama``), with the
  cross-entropy on the logits and with the fused linear cross-entropy, and the latter with
  the decoder layers compiled (the package's ops are custom ops inside the graphs);
* Liger-patched (``liger_kernel.transformers.apply_liger_kernel_to_llama``) with its
  cross-entropy and with its fused linear cross-entropy, where Liger is installed and
  supports the installed transformers (else a note says why not).

The note column gives tokens per second and the peak memory allocated during the steps.
Liger patches transformers' modeling module (and, for its cross-entropy, torch's
``F.cross_entropy`` as transformers' loss sees it); both are restored after its rows.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

SEQ = 4096
BATCH = 1
WARMUP, STEPS = 3, 6  # compiled rows compile during warm-up
CONFIG = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
              num_attention_heads=32, num_key_value_heads=8, head_dim=128,
              vocab_size=128256, max_position_embeddings=SEQ, rope_theta=500000.0,
              tie_word_embeddings=True, rms_norm_eps=1e-5)


def _model(torch: Any, transformers: Any) -> Any:
    config = transformers.LlamaConfig(**CONFIG, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config)
    return model.train()


def _step_time(torch: Any, model: Any, ids: Any) -> tuple[float, float]:
    """(median seconds per step, peak GiB allocated during the steps)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**30


def _liger_restore(torch: Any) -> Callable[[], None]:
    """What Liger's llama patch changes, saved; the returned function puts it back."""
    from transformers.models.llama import modeling_llama

    names = ("apply_rotary_pos_emb", "LlamaRMSNorm", "LlamaMLP")
    saved = {name: getattr(modeling_llama, name) for name in names}
    forward = modeling_llama.LlamaForCausalLM.forward
    cross_entropy = torch.nn.functional.cross_entropy

    def restore() -> None:
        for name, value in saved.items():
            setattr(modeling_llama, name, value)
        modeling_llama.LlamaForCausalLM.forward = forward
        torch.nn.functional.cross_entropy = cross_entropy

    return restore


def bench(ctx: Any) -> None:
    torch = ctx.torch
    try:
        import transformers
    except ImportError:
        ctx.notes.append("transformers is not installed: no rows")
        return
    from baracuda_numba.transformers import apply_to_llama

    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    tokens = BATCH * SEQ

    def liger(flce: bool) -> Callable[[Any], Any]:
        def patch(model: Any) -> Any:
            from liger_kernel.transformers import apply_liger_kernel_to_llama

            apply_liger_kernel_to_llama(model=model, cross_entropy=not flce,
                                        fused_linear_cross_entropy=flce)
            return model
        return patch

    def ours(flce: bool) -> Callable[[Any], Any]:
        def patch(model: Any) -> Any:
            apply_to_llama(model, fused_linear_cross_entropy=flce)
            return model
        return patch

    def compiled(prepare: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def patch(model: Any) -> Any:
            model = prepare(model)
            for layer in model.model.layers:  # regional compilation: one graph, reused
                layer.compile()
            return model
        return patch

    cases: list[tuple[str, Callable[[Any], Any]]] = [
        ("unpatched eager", lambda m: m),
        ("baracuda_numba (cross-entropy)", ours(False)),
        ("baracuda_numba (fused linear cross-entropy)", ours(True)),
        ("Liger (cross-entropy)", liger(False)),
        ("Liger (fused linear cross-entropy)", liger(True)),
        ("unpatched, decoder layers compiled", compiled(lambda m: m)),
        ("baracuda_numba (fused linear cross-entropy), decoder layers compiled",
         compiled(ours(True))),
    ]
    import os

    if os.environ.get("MODELS_COMPILED", "1") == "0":  # the rows without torch.compile only
        cases = [(case, prepare) for case, prepare in cases if "compiled" not in case]
    eager_us = None
    for case, prepare in cases:
        restore = _liger_restore(torch)
        model = None
        try:
            model = prepare(_model(torch, transformers))
            seconds, peak = _step_time(torch, model, ids)
        except Exception as error:  # noqa: BLE001 -- a failed row becomes a note
            ctx.notes.append(f"{case}: failed ({type(error).__name__}: "
                             f"{str(error).splitlines()[0][:160] if str(error) else ''})")
            continue
        finally:
            restore()
            del model
            gc.collect()
            torch.cuda.empty_cache()
        us = seconds * 1e6
        if case == "unpatched eager":
            eager_us = us
        ctx.row(f"Llama 1B train step, {BATCH}x{SEQ} tokens: {case}", "bf16 autocast", us,
                torch_us=eager_us,
                note=f"{tokens / seconds:,.0f} tokens/s, peak {peak:.1f} GiB")
        print(f"[models] {case}: {us / 1e3:.1f} ms, {tokens / seconds:,.0f} tokens/s, "
              f"peak {peak:.1f} GiB", flush=True)
    ctx.notes.append(f"transformers {transformers.__version__}; Llama-3.2-1B shape, random "
                     f"weights, batch {BATCH} x {SEQ} tokens, SDPA attention, fused AdamW; "
                     "torch µs = unpatched eager step")
