"""The DDP wrappers (ElasticDataParallel, ElasticDataLoader): the gradient-noise statistics
of two real gloo processes with accumulation, with and without bf16 autocast and loss
scaling, equal a direct computation, and the update is the mean gradient's; the examples'
diff stays small."""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from tests.job.ddp_worker import dataset
from tests.job.gloo import REPO, run_two_ranks

WORKER = Path(__file__).with_name("ddp_worker.py")
EXAMPLES = REPO / "sia_slurm" / "job" / "examples"


def run_pair(
    tmp_path: Path, make_env, mode: str, size: int = 64, steps: int = 1, **batch
) -> list[dict]:  # type: ignore[no-untyped-def]
    # 2 replicas x 2 micro-batches x 4 samples: c = 4 gradient samples of b = 4; M0 = 8
    batch = batch or {"batch_size": 16, "local_bsz": 4, "accum_steps": 1}
    env = make_env(gpus=2, init_batch_size=8, **batch)
    command = [sys.executable, str(WORKER), str(tmp_path), mode, str(size), str(steps)]
    assert run_two_ranks(command, env, 180) == [0, 0]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def direct(records: list[dict], amp: bool) -> tuple[list[torch.Tensor], torch.nn.Linear]:
    """Each micro-batch's gradient computed alone, the same way the worker's forward ran."""
    data = dataset()
    model = torch.nn.Linear(6, 1)
    model.load_state_dict({k: torch.tensor(v) for k, v in records[0]["initial"].items()})
    grads = []
    for record in records:
        for indices in record["micro_batches"]:
            model.zero_grad()
            inputs, targets, _ = data[indices]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = F.mse_loss(model(inputs).squeeze(1), targets)
            loss.backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double())
    return grads, model


@pytest.mark.heavy
@pytest.mark.parametrize("mode", ["fp32", "amp"])
def test_two_replicas_with_accumulation_match_the_direct_estimate(
    tmp_path: Path,
    make_env,  # type: ignore[no-untyped-def]
    mode: str,
) -> None:
    amp = mode == "amp"
    records = run_pair(tmp_path, make_env, mode)
    assert [r["replicas"] for r in records] == [2, 2]
    assert [len(r["micro_batches"]) for r in records] == [2, 2]
    trained = sorted(i for r in records for m in r["micro_batches"] for i in m)
    assert len(trained) == 16 and len(set(trained)) == 16
    grads, model = direct(records, amp)
    c, b, m0 = len(grads), 4, 8
    mean = torch.stack(grads).mean(0)
    sqr_of_mean = float(mean.dot(mean))
    mean_of_sqr = sum(float(g.dot(g)) for g in grads) / c
    grad_sqr = (c * sqr_of_mean - mean_of_sqr) / (c - 1)
    grad_var = (mean_of_sqr - sqr_of_mean) * (c * b / m0) / (c - 1)
    assert c == 4 and grad_sqr > 0 and grad_var > 0
    tolerance = 2e-3 if amp else 1e-5  # bf16 matmuls add up in another order under DDP
    assert records[0]["sample"][:3] == pytest.approx([sqr_of_mean, mean_of_sqr, c], rel=tolerance)
    assert records[0]["grad_sqr"] == pytest.approx(grad_sqr, rel=10 * tolerance)
    assert records[0]["grad_var"] == pytest.approx(grad_var, rel=10 * tolerance)
    assert records[1]["sample"] == pytest.approx(records[0]["sample"], rel=1e-9)
    # the update is SGD on the mean gradient over the 16 samples (AdaScale's gain is 1
    # before any estimate), the same on both replicas
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    expected -= 0.01 * mean
    after = torch.tensor(records[0]["weight_after"] + records[0]["bias_after"]).double()
    assert after.tolist() == pytest.approx(expected.tolist(), rel=tolerance, abs=1e-6)
    assert records[1]["weight_after"] == records[0]["weight_after"]


@pytest.mark.heavy
def test_a_rank_with_no_sample_left_pads_with_a_sample_of_weight_zero(
    tmp_path: Path,
    make_env,  # type: ignore[no-untyped-def]
) -> None:
    # 17 samples at 16 = 2 x 8: the second step has one sample, rank 1 none (it pads)
    records = run_pair(
        tmp_path, make_env, "fp32", size=17, steps=2, batch_size=16, local_bsz=8, accum_steps=0
    )
    real = [records[0]["micro_batches"][1], records[1]["micro_batches"][1]]
    assert sorted(map(len, real)) == [1, 1]  # one real sample and one padding sample
    trained = records[0]["micro_batches"][0] + records[1]["micro_batches"][0] + real[0]
    assert sorted(trained) == list(range(17))  # rank 0 trained the last sample
    data = dataset(17)
    model = torch.nn.Linear(6, 1)
    model.load_state_dict({k: torch.tensor(v) for k, v in records[0]["initial"].items()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for indices in (trained[:16], trained[16:]):  # SGD on each step's mean gradient
        inputs, targets, _ = data[indices]
        F.mse_loss(model(inputs).squeeze(1), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
    expected = model.weight.detach().reshape(-1).tolist() + model.bias.detach().tolist()
    for record in records:
        after = record["weight_after"] + record["bias_after"]
        assert after == pytest.approx(expected, rel=1e-5, abs=1e-7)
    # the first (uniform) step's noise sample: c = 2 replicas' local gradients, no
    # accumulation, each taken before DDP's reduction
    model.load_state_dict({k: torch.tensor(v) for k, v in records[0]["initial"].items()})
    grads = []
    for record in records:
        model.zero_grad()
        inputs, targets, _ = data[record["micro_batches"][0]]
        F.mse_loss(model(inputs).squeeze(1), targets).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double())
    mean = (grads[0] + grads[1]) / 2
    direct_sample = [float(mean.dot(mean)), sum(float(g.dot(g)) for g in grads) / 2, 2]
    assert records[0]["sample"][:3] == pytest.approx(direct_sample, rel=1e-5)


def test_the_elastic_example_differs_from_the_plain_ddp_script_in_a_few_lines() -> None:
    def body(name: str) -> list[str]:
        lines = (EXAMPLES / name).read_text().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("def main"))
        return [line for line in lines[start:] if line.strip()]

    changed = [
        line
        for line in difflib.unified_diff(body("ddp_plain.py"), body("ddp_elastic.py"), n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    # 5 lines replace 9 (DDP, the DistributedSampler and its set_epoch, the DataLoader, the
    # epoch range, the process group, clipping)
    assert 0 < len(changed) <= 14, "\n".join(changed)
    assert sum(1 for line in changed if line.startswith("+")) <= 6, "\n".join(changed)
