"""Deterministic synthetic multi-instrument order-book feed.

The embedded default market-data source: benchmarks, tests and the default
model's training data all come from here, so it must be fast (vectorised
numpy; ~1M events in about a second) and it must carry structure a model can
learn, or the trained default model would be noise.

Microstructure, per instrument (event index j counts that instrument's events):

* a latent order-flow pressure `a_j`, AR(1) with unit variance and
  persistence `pressure_persistence` (half-life ~ 23 events at 0.97);
* the level-0 best price moves by one tick at a quote with probability
  `move_prob` (scaled by the spread regime: wide books are more volatile),
  up with probability sigmoid(`signal_strength` * a_j) -- pressure *leads*
  the price;
* the book shows the pressure through a noisy level-0/1 size imbalance
  (bid sizes scaled by exp(+imbalance_gain * (a_j + noise)), ask by exp(-...));
  one quote is a weak signal, a window of them is a strong one;
* trades hit the ask (buyer-initiated) with probability
  sigmoid(`trade_signal` * a_j) and print at the touch;
* spread regimes: the spread (in ticks) switches between `spread_ticks` at
  random quotes;
* arrivals: exponential gaps at `rate_hz` in total (Poisson); with
  `burstiness` > 0, blocks of `burst_block` events are bursts with probability
  `burst_prob`: gaps shrink by 1 + 9 * burstiness and half of the block's
  events go to one hot instrument (the pattern conflation has to absorb). The
  mean rate stays `rate_hz`.

Same config (seed included) -> byte-identical table.
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec
import numpy as np
from msgspec import Meta

from hft_infer.replay.events import KIND_QUOTE, KIND_TRADE, empty_events

PosInt = Annotated[int, Meta(gt=0)]
PosFloat = Annotated[float, Meta(gt=0.0)]
NonNegFloat = Annotated[float, Meta(ge=0.0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]


class SyntheticConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    instruments: PosInt = 64
    """Instrument ids 0..instruments-1."""
    levels: Annotated[int, Meta(ge=1, le=256)] = 10
    """Book levels on every quote."""
    seed: int = 1
    """Same seed, same bytes."""
    rate_hz: PosFloat = 20_000.0
    """Mean total event rate (all instruments); sets the ts_exchange_ns spacing."""
    burstiness: NonNegFloat = 0.0
    """0: Poisson arrivals; > 0: bursty blocks (faster, concentrated on one instrument)."""
    burst_prob: Probability = 0.2
    """With burstiness > 0: probability that a block of burst_block events is a burst."""
    burst_block: PosInt = 64
    """Events per arrival block (the unit of bursts)."""
    trade_fraction: Probability = 0.1
    """Probability that an event (after an instrument's first, always a quote) is a trade."""
    tick: PosFloat = 0.01
    """Price increment."""
    base_prices: tuple[PosFloat, ...] = ()
    """Starting bid per instrument; empty: log-uniform in 20..500, drawn from the seed."""
    activity_dispersion: NonNegFloat = 0.5
    """Lognormal sigma of per-instrument event-rate weights (0: all equally active)."""
    spread_ticks: tuple[PosInt, ...] = (1, 2, 4)
    """Spread regimes, in ticks."""
    regime_switch_prob: Probability = 0.002
    """Per quote: probability of drawing a new spread regime."""
    move_prob: Probability = 0.12
    """Per quote at the narrowest spread: probability that the best prices move one tick
    (x sqrt(spread / narrowest) in wider regimes)."""
    pressure_persistence: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.97
    """AR(1) coefficient, per event, of the latent order-flow pressure."""
    signal_strength: NonNegFloat = 1.5
    """How strongly pressure tilts the direction of price moves (logit per unit pressure)."""
    trade_signal: NonNegFloat = 1.0
    """How strongly pressure tilts trade direction."""
    imbalance_gain: NonNegFloat = 0.5
    """Log-size tilt of level 0 (half at level 1) per unit of observed pressure."""
    imbalance_noise: NonNegFloat = 1.0
    """Std of the per-quote noise on the observed pressure (relative to its unit std)."""
    size_noise: NonNegFloat = 0.3
    """Lognormal sigma of book sizes around their level's base size."""
    base_size: PosFloat = 100.0
    """Mean size at level 0 (deeper levels are larger)."""
    trade_size: PosFloat = 50.0
    """Median trade size."""

    def __post_init__(self) -> None:
        if self.base_prices and len(self.base_prices) != self.instruments:
            raise ValueError(f"base_prices has {len(self.base_prices)} entries for {self.instruments} instruments")
        if not self.spread_ticks:
            raise ValueError("spread_ticks must not be empty")
        if self.move_prob * math.sqrt(max(self.spread_ticks) / min(self.spread_ticks)) > 1.0:
            raise ValueError("move_prob * sqrt(widest / narrowest spread) must be <= 1 (it is a probability)")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def ar1(noise: np.ndarray, phi: float, block: int = 64) -> np.ndarray:
    """x_j = phi * x_{j-1} + sqrt(1 - phi^2) * noise_j, x_{-1} = stationary draw folded into noise_0.

    Vectorised in blocks: within a block the recursion is a lower-triangular
    Toeplitz matrix product (BLAS), across blocks it is a short Python loop
    over n / block carries -- no per-event Python.
    """
    n = noise.shape[0]
    if n == 0:
        return noise.astype(np.float64)
    e = noise.astype(np.float64) * math.sqrt(1.0 - phi * phi)
    e[0] = noise[0]  # start in the stationary distribution (unit variance)
    nb = -(-n // block)
    pad = np.zeros(nb * block)
    pad[:n] = e
    j = np.arange(block)
    lag = j[:, None] - j[None, :]
    toeplitz = np.where(lag >= 0, phi ** np.maximum(lag, 0), 0.0)
    y = pad.reshape(nb, block) @ toeplitz.T  # zero-carry solution inside each block
    powers = phi ** (j + 1)
    carry = 0.0
    for b in range(nb):  # n / 64 iterations
        y[b] += powers * carry
        carry = y[b, -1]
    return y.reshape(-1)[:n]


def _arrivals(n: int, cfg: SyntheticConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(ts_exchange_ns, instrument) for n events."""
    weights = np.exp(cfg.activity_dispersion * rng.standard_normal(cfg.instruments))
    weights /= weights.sum()
    instrument = rng.choice(cfg.instruments, size=n, p=weights).astype(np.uint32)
    gaps = rng.standard_exponential(n)
    if cfg.burstiness > 0.0:
        nb = -(-n // cfg.burst_block)
        burst = rng.random(nb) < cfg.burst_prob
        hot = rng.integers(0, cfg.instruments, size=nb)
        speed = 1.0 + 9.0 * cfg.burstiness
        mult = np.where(burst, 1.0 / speed, 1.0)
        # Rescale so that the expected gap stays 1 / rate_hz.
        mult /= cfg.burst_prob / speed + (1.0 - cfg.burst_prob)
        block_of = np.arange(n) // cfg.burst_block
        gaps *= mult[block_of]
        to_hot = burst[block_of] & (rng.random(n) < 0.5)
        instrument = np.where(to_hot, hot[block_of], instrument).astype(np.uint32)
    gaps[0] = 0.0
    ts = np.floor(np.cumsum(gaps) * (1e9 / cfg.rate_hz)).astype(np.int64)
    return ts, instrument


def _base_prices(cfg: SyntheticConfig, rng: np.random.Generator) -> np.ndarray:
    if cfg.base_prices:
        return np.asarray(cfg.base_prices, dtype=np.float64)
    return np.exp(rng.uniform(math.log(20.0), math.log(500.0), size=cfg.instruments))


def generate(n_events: int, cfg: SyntheticConfig = SyntheticConfig()) -> np.ndarray:
    """An event table (`replay.events.event_dtype(cfg.levels)`) of n_events rows, in time order."""
    if n_events < 0:
        raise ValueError(f"n_events must be >= 0, got {n_events}")
    rng = np.random.default_rng(cfg.seed)
    L = cfg.levels
    ev = empty_events(n_events, L)
    if n_events == 0:
        return ev
    ts, instrument = _arrivals(n_events, cfg, rng)
    base_ticks = np.maximum(np.round(_base_prices(cfg, rng) / cfg.tick), L + 1).astype(np.int64)
    spreads = np.asarray(cfg.spread_ticks, dtype=np.int64)

    # Per-instrument processes run in instrument-major order (stable sort keeps
    # time order inside an instrument); one vectorised pass per instrument.
    order = np.argsort(instrument, kind="stable")
    counts = np.bincount(instrument, minlength=cfg.instruments)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    is_trade = rng.random(n_events) < cfg.trade_fraction
    noise = rng.standard_normal((3, n_events))  # pressure, imbalance observation, trade size
    u_move, u_regime, u_side = rng.random((3, n_events))
    regime_draw = rng.integers(0, spreads.shape[0], size=n_events)
    pressure = np.empty(n_events)
    for i in range(cfg.instruments):
        sl = slice(starts[i], starts[i] + counts[i])
        pressure[sl] = ar1(noise[0, sl], cfg.pressure_persistence)
    is_trade = is_trade[order]
    is_trade[starts[counts > 0]] = False  # an instrument's first event is a quote: the book exists
    seq = np.arange(n_events) - np.repeat(starts, counts)
    inst_sorted = instrument[order]

    # Spread regime: a new draw at switch points, forward-filled per instrument.
    switch = (~is_trade) & (u_regime < cfg.regime_switch_prob)
    switch[starts[counts > 0]] = True
    last_switch = np.maximum.accumulate(np.where(switch, np.arange(n_events), 0))
    spread = spreads[regime_draw[last_switch]]

    # Price moves: at quotes only, direction led by the pressure.
    p_move = cfg.move_prob * np.sqrt(spread / spreads.min())
    moves = (~is_trade) & (u_move < p_move)
    up = rng.random(n_events) < _sigmoid(cfg.signal_strength * pressure)
    delta = np.where(moves, np.where(up, 1, -1), 0)
    delta[starts[counts > 0]] = 0
    walk = np.cumsum(delta)
    first = np.minimum(starts, n_events - 1)  # instruments without events repeat 0 times
    walk -= np.repeat(walk[first] - delta[first], counts)  # restart the walk per instrument
    bid0 = base_ticks[inst_sorted] + walk
    bid0 = np.maximum(bid0, L + 1)  # deep levels stay at positive prices
    ask0 = bid0 + spread

    # Book: levels i = 0..L-1 step one tick away from the touch. Built in
    # instrument-major order, then scattered back to time order.
    dest = order  # sorted position k is time position order[k]
    lvl = np.arange(L, dtype=np.float32)
    tick = np.float32(cfg.tick)
    obs = pressure + cfg.imbalance_noise * noise[1]
    tilt = np.zeros((n_events, L), dtype=np.float32)
    tilt[:, 0] = cfg.imbalance_gain * obs
    if L > 1:
        tilt[:, 1] = 0.5 * cfg.imbalance_gain * obs
    base = np.float32(cfg.base_size) * (1.0 + 0.5 * lvl)
    z = rng.standard_normal((2, n_events, L), dtype=np.float32) * np.float32(cfg.size_noise)
    book = np.empty((n_events, L, 4), dtype=np.float32)
    book[:, :, 0] = (bid0[:, None].astype(np.float32) - lvl) * tick
    book[:, :, 1] = np.maximum(np.round(base * np.exp(z[0] + tilt)), 1.0)
    book[:, :, 2] = (ask0[:, None].astype(np.float32) + lvl) * tick
    book[:, :, 3] = np.maximum(np.round(base * np.exp(z[1] - tilt)), 1.0)
    book[is_trade] = 0.0

    buy = u_side < _sigmoid(cfg.trade_signal * pressure)
    trade_px = np.where(buy, ask0, bid0) * cfg.tick
    trade_sz = np.maximum(np.round(cfg.trade_size * np.exp(0.7 * noise[2])), 1.0)

    ev["ts_exchange_ns"] = ts
    ev["instrument"] = instrument
    ev["kind"][dest] = np.where(is_trade, KIND_TRADE, KIND_QUOTE)
    ev["n_levels"][dest] = np.where(is_trade, 0, L)
    ev["side"][dest] = np.where(is_trade, np.where(buy, 1, -1), 0)
    ev["seq"][dest] = seq
    ev["price"][dest] = np.where(is_trade, trade_px, 0.0)
    ev["size"][dest] = np.where(is_trade, trade_sz, 0.0)
    ev["book"][dest] = book
    return ev
