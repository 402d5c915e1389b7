"""The training-step benchmarks' configurations and the matrix products of their steps.

Every configuration trains in float32 with Adam (lr 1e-3), global-norm clipping at 1.0 and a
constant learning rate; every decoder is causal. :func:`products` lists the matrix products
one step makes, by shape: :func:`step_flops` is their sum (the model-FLOP count of the
effective GFLOP/s), and :func:`.sgemm.products_gflops` times each shape on the machine's BLAS
(the rate the step could reach if it did nothing but these products).
"""

from __future__ import annotations

from typing import NamedTuple

from ..config import BENCH_CONFIGS

CONFIGS = {
    "chapter": dict(model=dict(vocab=104, width=84, heads=4, layers=2, ffn_width=168,
                               max_len=100, activation="relu", embed_scale=True),
                    batch=64, context=100),
    "small": dict(model=dict(vocab=104, width=128, heads=4, layers=4, ffn_width=512,
                             max_len=64, activation="gelu", positions="learned"),
                  batch=12, context=64),
    "wide": dict(model=dict(vocab=104, width=384, heads=6, layers=6, ffn_width=1536,
                            max_len=256, activation="relu", embed_scale=True),
                 batch=16, context=256),
    "long": dict(model=dict(vocab=104, width=256, heads=4, layers=4, ffn_width=1024,
                            max_len=1024, activation="relu", embed_scale=True),
                 batch=4, context=1024),
    # GPT-2 small's shape (Radford et al. 2019): 12 pre-LN blocks of width 768, 12 heads of 64,
    # FFN 3072 with GELU's tanh form, learned positions, the head tied to the token table;
    # 50,304 is 50,257 rounded up to a multiple of 64 (as nanoGPT). Batch 1: the products are
    # then (1024, 768) x (768, 3072) and the like, already large enough for BLAS's best rate,
    # and both frameworks fit easily in 16 GiB.
    "gpt2": dict(model=dict(vocab=50304, width=768, heads=12, layers=12, ffn_width=3072,
                            max_len=1024, activation="gelu_tanh", positions="learned",
                            tie_embeddings=True),
                 batch=1, context=1024),
    "lstm": dict(model=dict(vocab=104, embed=85, hidden=128, max_len=100), batch=64,
                 context=100, kind="lstm"),
}
assert tuple(CONFIGS) == BENCH_CONFIGS  # the names the command line offers


def model_kind(config: dict) -> str:
    """``"transformer"`` or ``"lstm"``: which model a configuration trains (``train --model``)."""
    return config.get("kind", "transformer")


class Product(NamedTuple):
    """``count`` products ``(batch, m, k) @ (batch, k, n)`` of one step, of which the fraction
    ``visible`` is computed (one half for the causal scores, whose masked blocks are skipped)."""

    what: str
    m: int
    k: int
    n: int
    batch: int = 1
    count: int = 1
    visible: float = 1.0

    @property
    def flops(self) -> float:
        """``2 m k n`` per product, for every product of the step that has this shape."""
        return 2.0 * self.m * self.k * self.n * self.batch * self.count * self.visible


def _linear(what: str, rows: int, fan_in: int, fan_out: int, count: int = 1) -> list[Product]:
    """A linear map's three products: ``y = x W``, ``dx = dy W^T``, ``dW = x^T dy``."""
    return [Product(what, rows, fan_in, fan_out, count=count),
            Product(f"{what}, dx", rows, fan_out, fan_in, count=count),
            Product(f"{what}, dW", fan_in, rows, fan_out, count=count)]


def products(config: dict) -> list[Product]:
    """Every matrix product of one training step of ``config``, grouped by shape.

    Forward and backward: each linear map of ``N = batch x context`` tokens makes the three
    products of :func:`_linear` (q, k, v and the output of attention, the FFN's two, the
    vocabulary head); per layer and head, the causal scores ``q k^T`` and ``p v`` make two in
    the forward and four in the backward (``dp = do v^T``, ``dv = p^T do``, ``dq = ds k``,
    ``dk = ds^T q``), of which the visible half is computed. An LSTM's gates take ``4H`` from
    the input (all steps at once) and from ``h`` (one step at a time). Norms, softmax, Adam and
    the other elementwise work are left out, as is usual for a model-FLOP count.
    """
    m, b, t = config["model"], config["batch"], config["context"]
    n = b * t
    if model_kind(config) == "lstm":
        e, h = m["embed"], m["hidden"]
        return (_linear("gates from x", n, e, 4 * h) + _linear("gates from h", b, h, 4 * h, t)
                + _linear("vocabulary head", n, h, m["vocab"]))
    c, f, layers, heads = m["width"], m["ffn_width"], m["layers"], m["heads"]
    d = c // heads
    return (_linear("q, k, v, out", n, c, c, 4 * layers)
            + _linear("FFN up", n, c, f, layers) + _linear("FFN down", n, f, c, layers)
            + _linear("vocabulary head", n, c, m["vocab"])
            + [Product("q k^T, do v^T", t, d, t, b * heads, 2 * layers, 0.5),
               Product("p v, p^T do, ds k, ds^T q", t, t, d, b * heads, 4 * layers, 0.5)])


def step_flops(config: dict) -> float:
    """Floating-point operations of the matrix products of one training step of ``config``:
    the sum over :func:`products` (the backward costs twice the forward)."""
    return sum(p.flops for p in products(config))
