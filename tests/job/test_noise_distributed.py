"""Gradient noise statistics from two real gloo processes agree with a direct computation
from the per-micro-batch gradients of the same samples (reference section 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from tests.job.gloo import run_two_ranks

pytestmark = pytest.mark.heavy

WORKER = Path(__file__).with_name("noise_worker.py")


def test_two_replicas_with_accumulation_match_the_direct_estimate(tmp_path: Path, make_env) -> None:  # type: ignore[no-untyped-def]
    # 2 replicas x 2 micro-batches x 4 samples: c = 4 gradient samples of b = 4; M0 = 8
    env = make_env(gpus=2, batch_size=16, local_bsz=4, accum_steps=1, init_batch_size=8)
    assert run_two_ranks([sys.executable, str(WORKER), str(tmp_path)], env, 120) == [0, 0]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["replicas"] for r in records] == [2, 2]
    assert records[0]["weight_after"] == records[1]["weight_after"]  # one all-reduced update

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 6, generator=gen)
    data = TensorDataset(x, x @ torch.arange(6.0) + torch.randn(64, generator=gen))
    model = torch.nn.Linear(6, 1)
    model.load_state_dict({k: torch.tensor(v) for k, v in records[0]["initial"].items()})
    grads = []
    for record in records:
        for indices in record["micro_batches"]:
            model.zero_grad()
            inputs, targets = data[indices]
            F.mse_loss(model(inputs).squeeze(1), targets).backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double())
    c, b, m0 = len(grads), 4, 8
    mean = torch.stack(grads).mean(0)
    sqr_of_mean = float(mean.dot(mean))
    mean_of_sqr = sum(float(g.dot(g)) for g in grads) / c
    grad_sqr = (c * sqr_of_mean - mean_of_sqr) / (c - 1)
    grad_var = (mean_of_sqr - sqr_of_mean) * (c * b / m0) / (c - 1)
    assert c == 4 and grad_sqr > 0 and grad_var > 0
    assert records[0]["grad_sqr"] == pytest.approx(grad_sqr, rel=1e-4)
    assert records[0]["grad_var"] == pytest.approx(grad_var, rel=1e-4)
    assert records[1]["grad_sqr"] == pytest.approx(records[0]["grad_sqr"], rel=1e-6)
