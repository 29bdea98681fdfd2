"""Shared helpers of the kernel tests: devices, data, tolerances, error metrics."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from _kernels_path import ensure_kernels_importable

ensure_kernels_importable()

from hft_infer.kernels import common  # noqa: E402
from hft_infer.kernels.common import COL_ACTION, COL_LOGITS, COL_SCORE, features_reference  # noqa: E402
from hft_infer.runner.base import Engine  # noqa: E402
from hft_infer.runner.staging import StepStaging  # noqa: E402

# Norm-wise relative error ||out - ref|| / ||ref|| allowed on logits and states,
# against both the float64 reference and the float32 torch reference.
TOL = {
    # fp32 rounding (6e-8) grown by sums over up to ~1.3k products and by W
    # recurrent steps x L layers; on the GPU exp, log and division are the
    # approximate instructions (~2 ulp). Seen ~1e-7..1e-6 under the interpreter.
    "fp32": 1e-5,
    # tf32 operands carry 10 explicit mantissa bits (rounding 2^-11 = 4.9e-4);
    # one product lands near 3e-4 (the tf32 rounding of its inputs); the window LSTM chains W = 50
    # steps x L layers of them, the MLP three layers over up to 1344 inputs.
    # The interpreter multiplies in full fp32, so there this bound is loose.
    "tf32": 5e-3,
    # bf16 weights and activations (rounding 2^-9 = 2e-3 per operand; the
    # interpreter truncates instead of rounding to nearest, twice that),
    # accumulated in fp32 through L layers and W steps.
    "bf16": 3e-2,
}


def interpreting() -> bool:
    return common.interpreting()


def _kernels_interpreted() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(common._features, InterpretedFunction)


def require_device(device: str) -> torch.device:
    """Skip what this machine cannot run: "cpu" needs the interpreter, "cuda" compiled kernels."""
    if device == "cpu":
        if not interpreting():
            pytest.skip("CPU cases run under TRITON_INTERPRET=1 (off here: CUDA present)")
        if not _kernels_interpreted():
            pytest.fail("hft_infer.kernels was imported before TRITON_INTERPRET=1 was set: "
                        "set it in the environment or in the top-level tests/conftest.py")
    else:
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
        if interpreting():
            pytest.skip("CUDA cases test the compiled kernels: unset TRITON_INTERPRET")
    return torch.device(device)


def device_params(*, cpu: bool = True):
    """pytest params "cpu" (interpreter) and "cuda" (marked gpu)."""
    out = [pytest.param("cpu", id="cpu")] if cpu else []
    out.append(pytest.param("cuda", marks=pytest.mark.gpu, id="cuda"))
    return out


# --------------------------------------------------------------------------- data


def make_rows(n: int, levels: int, gen: torch.Generator, *, mids: torch.Tensor | None = None) -> torch.Tensor:
    """Raw rows float32 [n, 4L+2] that look like a book.

    Prices sit on a 1/128 grid around 100: the sum bid0 + ask0 (and so mid and
    px - mid) is then exact in fp32 as in fp64, and the float64 reference sees
    the same features up to the last rounding. With decimal ticks the fp32 mid
    rounding alone moves the bps features by ~1e-4 relative in every fp32
    implementation (this one and the CPU models alike): a property of fp32
    inputs, not of the kernels. Some rows have missing levels (price 0: the
    px > 0 branch), some an empty book (mid 0: the mid > 0 branch), trade rows
    carry a signed size."""
    f = 4 * levels + 2
    rows = torch.zeros(n, f, dtype=torch.float32)
    if mids is None:
        mids = 100.0 + torch.randint(-640, 640, (n,), generator=gen).float() / 128
    spread = torch.randint(1, 4, (n,), generator=gen).float() / 128
    for i in range(levels):
        depth = i / 64
        rows[:, 4 * i] = mids - spread - depth
        rows[:, 4 * i + 1] = torch.randint(1, 2000, (n,), generator=gen).float()
        rows[:, 4 * i + 2] = mids + spread + depth
        rows[:, 4 * i + 3] = torch.randint(1, 2000, (n,), generator=gen).float()
    trade = torch.rand(n, generator=gen) < 0.4
    rows[:, 4 * levels] = torch.where(trade, mids + torch.randint(-4, 5, (n,), generator=gen).float() / 128, 0.0)
    size = torch.randint(1, 500, (n,), generator=gen).float() * torch.where(
        torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    rows[:, 4 * levels + 1] = torch.where(trade, size, 0.0)
    if levels > 1:  # a thin book: deeper levels missing
        thin = torch.rand(n, generator=gen) < 0.15
        rows[thin, 4:4 * levels] = 0.0
    empty = torch.rand(n, generator=gen) < 0.05
    rows[empty, : 4 * levels] = 0.0
    return rows


def make_norm(levels: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """mean, inv_std fitted on a sample (features of O(1) after normalisation)."""
    feats = features_reference(make_rows(512, levels, gen).double(), torch.zeros(4 * levels + 2, dtype=torch.float64),
                               torch.ones(4 * levels + 2, dtype=torch.float64))
    mean = feats.mean(0)
    inv_std = 1.0 / feats.std(0).clamp_min(1e-3)
    return mean.float(), inv_std.float()


def uniform(shape, bound: float, gen: torch.Generator) -> torch.Tensor:
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound


@dataclass
class Schedule:
    """Steps of batches over interleaved instruments: each step a list of distinct slots
    (possibly padded with the sink), with each slot's row positions consecutive from 0."""
    steps: list[tuple[list[int], list[int]]]  # (slots, positions)


def make_schedule(n_inst: int, sink: int, batch_sizes: list[int], seed: int, *, pad: int = 0,
                  start: dict[int, int] | None = None) -> Schedule:
    rnd = random.Random(seed)
    nxt = {s: (start or {}).get(s, 0) for s in range(n_inst)}
    steps = []
    for bs in batch_sizes:
        slots = rnd.sample(range(n_inst), min(bs, n_inst))
        pos = [nxt[s] for s in slots]
        for s in slots:
            nxt[s] += 1
        # padding entries: the sink, any position (negative too: must stay harmless)
        for k in range(pad):
            slots.append(sink)
            pos.append(rnd.choice([-3, 0, 7 + k]))
        steps.append((slots, pos))
    return Schedule(steps)


# --------------------------------------------------------------------------- checks


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out).all(), "non-finite output (unwritten poison?)"
    den = ref.norm().item()
    return (out - ref).norm().item() / max(den, 1e-12)


def action_rule(score: torch.Tensor, prev: torch.Tensor, thr: float, hyst: float) -> torch.Tensor:
    one = torch.ones_like(score)
    return torch.where(score > thr, one, torch.where(score < -thr, -one, torch.where(
        (prev == 1) & (score >= thr - hyst), one, torch.where((prev == -1) & (score <= hyst - thr), -one,
                                                               torch.zeros_like(score)))))


def check_out(out: torch.Tensor, ref: torch.Tensor, tol: float, n_real: int, *, prev_held: torch.Tensor,
              ref_prev_held: torch.Tensor, thr: tuple[float, float], what: str) -> dict:
    """Logits within tol (norm-wise), score within tol * max(1, |logits|), action consistent with
    the kernel's own score and the held position before the step, and equal to the reference's
    wherever the reference score is clear of every decision boundary."""
    out, ref = out[:n_real].double().cpu(), ref[:n_real].double().cpu()
    assert torch.isfinite(out).all(), f"{what}: unwritten or non-finite output"
    e_logits = rel_err(out[:, COL_LOGITS:COL_LOGITS + 3], ref[:, COL_LOGITS:COL_LOGITS + 3])
    assert e_logits <= tol, f"{what}: logits rel err {e_logits:.3g} > {tol:g}"
    scale = max(1.0, ref[:, COL_LOGITS:].abs().max().item())
    e_score = (out[:, COL_SCORE] - ref[:, COL_SCORE]).abs().max().item()
    assert e_score <= tol * scale, f"{what}: score abs err {e_score:.3g} > {tol * scale:g}"
    prev = prev_held[:n_real].double().cpu()
    own = action_rule(out[:, COL_SCORE], prev, *thr)
    assert torch.equal(out[:, COL_ACTION], own), f"{what}: action does not follow the kernel's own score"
    t, hy = thr
    s = ref[:, COL_SCORE]
    margin = torch.stack([(s - t).abs(), (s + t).abs(), (s - (t - hy)).abs(), (s + (t - hy)).abs()]).min(0).values
    # Borderline scores may round either way; a held position that once went another way
    # legitimately changes later actions, so compare only where both held the same.
    clear = (margin > 4 * tol * scale) & (prev == ref_prev_held[:n_real].double().cpu())
    assert torch.equal(out[clear, COL_ACTION], ref[clear, COL_ACTION]), f"{what}: action differs from reference"
    return {"logits": e_logits, "score": e_score}


def make_lstm(levels: int, hidden: int, layers: int, gen: torch.Generator):
    """(LstmParams fp32, torch.nn.LSTM float64 with the same weights, for recompute checks).
    Weights uniform(+-1/sqrt(H)) as nn.LSTM initialises them; a head bias keeps logits off zero."""
    from hft_infer.kernels.lstm import LstmParams

    f = 4 * levels + 2
    bound = 1 / hidden ** 0.5
    lstm = torch.nn.LSTM(f, hidden, num_layers=layers, batch_first=True, dtype=torch.float64)
    r32 = lambda t: t.float().double()  # noqa: E731 - fp32 values: the float64 models see the kernel's weights
    with torch.no_grad():
        for p in lstm.parameters():
            p.copy_(r32(uniform(p.shape, bound, gen)))
    mean, inv_std = make_norm(levels, gen)
    params = LstmParams.from_state_dict(lstm.state_dict(), r32(uniform((3, hidden), bound, gen)),
                                        r32(uniform((3,), 0.5, gen)), mean.double(), inv_std.double())
    return params.to(torch.float32), lstm


def make_mlp(levels: int, window: int, hidden: tuple[int, ...], gen: torch.Generator):
    """MlpParams fp32 (nn.Linear layout, weights uniform(+-1/sqrt(in)), a head bias off zero)."""
    import math

    from hft_infer.kernels.mlp import MlpParams

    widths = [window * (4 * levels + 2), *hidden, 3]
    ws = tuple(uniform((o, i), 1 / math.sqrt(i), gen) for i, o in zip(widths, widths[1:]))
    bs = tuple(uniform((o,), 1 / math.sqrt(i), gen) for i, o in zip(widths, widths[1:]))
    bs = bs[:-1] + (uniform((3,), 0.5, gen),)  # a head bias keeps the logits off zero
    mean, inv_std = make_norm(levels, gen)
    return MlpParams(ws, bs, mean.double(), inv_std.double(), window).to(torch.float32)


def preset_params(preset: str, seed: int):
    """(kind, spec, fp32 params) of a real preset (hft_infer.models): LstmParams or MlpParams."""
    from hft_infer.kernels.lstm import LstmParams
    from hft_infer.kernels.mlp import MlpParams
    from hft_infer.models.checkpoint import load_model

    model, _ = load_model("", preset=preset, seed=seed)
    spec = model.spec
    mean, inv_std = model.norm_mean.detach().float(), model.norm_inv_std.detach().float()
    if spec.kind == "mlp":
        layers = [*model.layers, model.head]
        return spec, MlpParams(tuple(m.weight.detach().float() for m in layers),
                               tuple(m.bias.detach().float() for m in layers), mean, inv_std, spec.window)
    return spec, LstmParams.from_state_dict(model.lstm.state_dict(), model.head.weight.float(),
                                            model.head.bias.float(), mean, inv_std).to(torch.float32)



class LaunchedEngine(Engine):
    """The graph engine's step without the graphs (usable on the CPU): the service's staging
    (runner/staging.py: the host gather, then the one upload) and `kstep.launch` per batch,
    which is what each captured graph replays."""

    name = "launched"

    def __init__(self, kstep, buckets: list[int], sink_slot: int) -> None:
        super().__init__(buckets, sink_slot, stateful=kstep.stateful, reason="test")
        self.kstep = kstep
        kstep.alloc_launched(self.max_batch)
        self.staging = StepStaging(kstep.ring_h, max_batch=self.max_batch, rows_per_entry=kstep.staged_rows,
                                   n_buffers=1, device=kstep.device)
        self._slots, self._positions = self.staging.slots, self.staging.positions
        self._out = torch.zeros(self.max_batch, common.OUT_COLS, device=kstep.device)

    def _launch(self, i: int, n: int) -> None:
        b = self.pad(i, n)
        self.staging.gather(i, b)
        self.kstep.launch(*self.staging.upload(i, b), self._out[:b])
        out = self._out[:n].cpu()
        self._scores[i][:n] = out[:, 0].numpy()
        self._actions[i][:n] = out[:, 1].numpy()

    def reset(self) -> None:
        self.kstep.reset()

    def reset_slots(self, slots) -> None:
        self.kstep.reset_slots(slots)
