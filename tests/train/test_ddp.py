"""Two real DDP ranks (gloo on CPU): parameters stay identical, and a NaN on one rank is skipped by both."""

from __future__ import annotations

import gc
import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, out_dir: str, poison_rank: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.nn.parallel import DistributedDataParallel

    from craftrl.config import build_config
    from craftrl.policies import mlp_policy_generator
    from craftrl.train.learner import PPOLearner
    from train_fragments import bandit_fragments

    torch.manual_seed(0)  # identical initial weights on both ranks
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    config = build_config({"train_config": {"batch_size_per_gpu": 2, "learning_rate": 0.01,
                                            "epochs_per_iteration": 2, "gradient_accumulation": 2}}).train_config
    wrapped = DistributedDataParallel(policy)
    learner = PPOLearner(wrapped, config, torch.device("cpu"))
    rng = np.random.default_rng(100 + rank)  # different data on each rank
    fragments = bandit_fragments(policy, 4, 6, rng)
    if rank == poison_rank:
        fragments[1].reward[2] = np.inf
    metrics = learner.iteration(fragments, 0, 0, torch.Generator().manual_seed(rank))
    flat = torch.cat([p.detach().reshape(-1) for p in policy.parameters()])
    buffers = torch.cat([b.detach().reshape(-1).float() for b in policy.buffers()])
    torch.save({"params": flat, "buffers": buffers, "skipped": learner.skipped_steps,
                "metrics": metrics}, os.path.join(out_dir, f"rank{rank}.pt"))
    # DDP's reducer keeps the gloo group alive; left to interpreter exit, its threads are torn down while
    # still joinable and the rank dies with SIGABRT ("terminate called without an active exception").
    del learner, wrapped
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def _run(tmp_path, poison_rank: int):
    mp.spawn(_rank_main, args=(_free_port(), str(tmp_path), poison_rank), nprocs=2, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def test_two_ranks_end_an_iteration_with_identical_parameters(tmp_path):
    rank0, rank1 = _run(tmp_path, poison_rank=-1)
    torch.testing.assert_close(rank0["params"], rank1["params"], rtol=0, atol=0)
    torch.testing.assert_close(rank0["buffers"], rank1["buffers"], rtol=0, atol=0)
    assert rank0["skipped"] == rank1["skipped"] == 0
    torch.manual_seed(0)
    from craftrl.policies import mlp_policy_generator

    initial = torch.cat([p.detach().reshape(-1) for p in mlp_policy_generator(obs_dim=4, num_actions=2).parameters()])
    assert not torch.equal(initial, rank0["params"]), "the iteration did not train"
    assert rank0["metrics"] == pytest.approx(rank1["metrics"], nan_ok=True), "metrics are rank-averaged"


def test_nan_on_one_rank_makes_every_rank_skip_the_same_steps(tmp_path):
    rank0, rank1 = _run(tmp_path, poison_rank=1)
    assert rank0["skipped"] == rank1["skipped"] >= 1
    torch.testing.assert_close(rank0["params"], rank1["params"], rtol=0, atol=0)
    assert torch.isfinite(rank0["params"]).all()
