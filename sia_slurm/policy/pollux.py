"""Pollux (OSDI'21) as a baseline: heterogeneity-unaware goodput optimisation (reference section 5).

The decision is a jobs x nodes replica matrix, searched by a genetic algorithm (population 100,
100 generations, warm-started from the previous round), vectorised over the whole population
with numpy. Fitness is the power mean (p = -1) of each job's speedup, its goodput over its
goodput at a fair share of the cluster, with the restart factor (S = 30 s) on jobs whose
replicas change. Repair keeps every individual valid: node capacity, at most one distributed job
per node, at most 16 nodes per job, min/max replicas and the growth cap.

Heterogeneity-unaware, as Pollux is: every GPU is scored with *one* GPU type's model, the
*reference type* (by default the type with the most usable GPUs, the one Pollux would have been
calibrated on; ``PolluxPolicyConfig.reference_type`` overrides it). A job whose replicas span
types is repaired to the type holding most of them (Pollux has no notion of types, but a job
cannot run across them). The batch size of the result is then chosen on the type the job
actually got, as AdaptDL's job-side batch-size tuning does.

Deviation: the original uses NSGA-II (multi-objective, via pymoo); here a single-objective GA
with binary tournaments, per-job uniform crossover, elitism and the same repair.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from sia_slurm.core import Configuration, JobKind
from sia_slurm.policy.base import (
    Allocation,
    JobAllocation,
    NodeShare,
    PolicyInput,
    SolveInfo,
    allocation_from_row,
    restart_factors,
)
from sia_slurm.policy.configs import nodes_needed
from sia_slurm.policy.parameters import PolluxPolicyConfig

FIXED_BATCH = frozenset({JobKind.STRONG_SCALING, JobKind.RIGID, JobKind.PINNED})
EPSILON = 1e-3  # speedup floor, so a job left out dominates (not annihilates) the power mean


@dataclass(frozen=True)
class PolluxState:
    """The best replica matrix of the last round, for the warm start."""

    job_ids: tuple[str, ...]
    node_names: tuple[str, ...]
    replicas: np.ndarray


@dataclass(frozen=True)
class Problem:
    """The round's arrays, shared by fitness and repair."""

    capacity: np.ndarray  # (N,) usable GPUs per node
    node_type: np.ndarray  # (N,) type index per node
    low: np.ndarray  # (J,) min GPUs when allocated
    high: np.ndarray  # (J,) max GPUs
    fixed: np.ndarray  # (J,) bool: row must equal `previous`
    previous: np.ndarray  # (J, N) current replicas
    table: np.ndarray  # (J, K+1, n+1) reference-type goodput by GPUs and nodes
    baseline: np.ndarray  # (J,) goodput at a fair share
    restart: np.ndarray  # (J,) restart factor
    max_nodes: int


def gpu_limits(policy_input: PolicyInput, config: PolluxPolicyConfig) -> tuple[np.ndarray, ...]:
    total = policy_input.cluster.total_capacity
    low, high = [], []
    for job in policy_input.jobs:
        if job.kind in (JobKind.RIGID, JobKind.PINNED):
            low.append(job.requested_gpus)
            high.append(job.requested_gpus)
            continue
        upper = total if job.max_gpus is None else min(total, job.max_gpus)
        if config.growth_factor is not None:
            seen = job.max_gpus_seen
            upper = min(upper, max(int(config.growth_factor * seen) if seen else 1, job.min_gpus))
        low.append(job.min_gpus)
        high.append(upper)
    return np.array(low, dtype=np.int64), np.array(high, dtype=np.int64)


def build_problem(policy_input: PolicyInput, config: PolluxPolicyConfig) -> Problem:
    """Score tables on the reference type: one estimator call per job for all (GPUs, nodes)."""
    cluster = policy_input.cluster
    names = [node.name for node in cluster.nodes]
    index = {name: i for i, name in enumerate(names)}
    types = list(cluster.gpu_types)
    reference = config.reference_type or max(types, key=lambda t: cluster.types[t].capacity)
    low, high = gpu_limits(policy_input, config)
    jobs = policy_input.jobs
    max_nodes = min(config.max_nodes_per_job, len(names))
    k_max = int(high.max()) if len(jobs) else 1
    table = np.zeros((len(jobs), k_max + 1, max_nodes + 1))
    previous = np.zeros((len(jobs), len(names)), dtype=np.int64)
    fair = max(1, cluster.total_capacity // max(len(jobs), 1))
    node_size = max(view.gpus_per_node for view in cluster.types.values()) if types else 1
    baseline = np.ones(len(jobs))
    for j, job in enumerate(jobs):
        shapes = [
            (k, n) for k in range(1, int(high[j]) + 1) for n in range(1, min(k, max_nodes) + 1)
        ]
        configs = [Configuration(reference, n, k) for k, n in shapes]
        goodput = job.estimator.evaluate(configs, fixed_batch=job.kind in FIXED_BATCH).goodput
        ks, ns = np.array(shapes).T if shapes else (np.zeros(0, int), np.zeros(0, int))
        table[j, ks, ns] = np.maximum(goodput, 0.0)
        k_fair = int(np.clip(fair, low[j], high[j]))
        base = table[j, k_fair, min(nodes_needed(k_fair, node_size), max_nodes)]
        baseline[j] = base if base > 0 else max(float(table[j].max()), 1e-12)
        for share in job.placement:
            if share.node in index:
                previous[j, index[share.node]] = share.gpus
    fixed = np.array([job.restoring or job.kind is JobKind.PINNED for job in jobs], dtype=bool)
    restart = restart_factors(
        np.array([job.age for job in jobs]),
        np.array([job.restarts for job in jobs]),
        np.full(len(jobs), config.restart_cost),
    )
    return Problem(
        capacity=np.array([node.usable_gpus for node in cluster.nodes], dtype=np.int64),
        node_type=np.array([types.index(node.gpu_type) for node in cluster.nodes]),
        low=low,
        high=high,
        fixed=fixed & (previous.sum(axis=1) > 0),
        previous=previous,
        table=table,
        baseline=baseline,
        restart=restart,
        max_nodes=max_nodes,
    )


def fitness(problem: Problem, population: np.ndarray, p: float) -> np.ndarray:
    """Power mean of speedups per individual (population shape (P, J, N))."""
    gpus = population.sum(axis=2)
    nodes = (population > 0).sum(axis=2)
    jobs = np.arange(gpus.shape[1])[None, :]
    speedup = problem.table[jobs, gpus, nodes] / problem.baseline[None, :]
    moved = (population != problem.previous[None]).any(axis=2)
    moved &= problem.previous.sum(axis=1)[None, :] > 0
    speedup = np.where(moved, speedup * problem.restart[None, :], speedup)
    speedup = np.maximum(speedup, EPSILON)
    return np.mean(speedup**p, axis=1) ** (1.0 / p)


def clip_running(values: np.ndarray, limit: np.ndarray, axis: int) -> np.ndarray:
    """Trim ``values`` along ``axis`` so their running sum never exceeds ``limit``."""
    before = np.cumsum(values, axis=axis) - values
    return np.clip(limit - before, 0, values)


def repair(problem: Problem, population: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Make every individual valid (see the module docstring); vectorised over (P, J, N)."""
    pop = population
    pop[:, problem.fixed, :] = problem.previous[problem.fixed]
    n_types = int(problem.node_type.max()) + 1
    per_type = np.stack(
        [pop[:, :, problem.node_type == t].sum(axis=2) for t in range(n_types)], axis=2
    )
    majority = per_type.argmax(axis=2)
    pop = np.where(problem.node_type[None, None, :] == majority[:, :, None], pop, 0)
    if ((pop > 0).sum(axis=2) > problem.max_nodes).any():
        rank = np.argsort(np.argsort(-pop, axis=2, kind="stable"), axis=2)
        pop = np.where(rank < problem.max_nodes, pop, 0)
    pop = clip_running(pop, problem.high[None, :, None], axis=2)
    order = np.lexsort((rng.random(problem.fixed.size), ~problem.fixed))  # fixed jobs first
    pop = pop[:, order, :]
    pop = clip_running(pop, problem.capacity[None, None, :], axis=1)
    distributed = ((pop > 0).sum(axis=2) > 1)[:, :, None] & (pop > 0)
    pop = np.where(distributed & (np.cumsum(distributed, axis=1) > 1), 0, pop)
    pop = pop[:, np.argsort(order), :]
    gpus = pop.sum(axis=2)
    return np.where(((gpus > 0) & (gpus < problem.low[None, :]))[:, :, None], 0, pop)


def fresh_rows(problem: Problem, jobs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random allocation for each job in ``jobs``: a GPU count between its limits, filled over
    consecutive nodes from a random start (nodes are listed type by type), so multi-node shapes
    that single-cell mutations would rarely hit are explored too."""
    nodes = problem.capacity.size
    count = rng.integers(problem.low[jobs], problem.high[jobs] + 1)
    start = rng.integers(0, nodes, jobs.size)
    index = (start[:, None] + np.arange(nodes)[None, :]) % nodes
    capacity = problem.capacity[index]
    filled = clip_running(capacity, count[:, None], axis=1)
    rows = np.zeros((jobs.size, nodes), dtype=np.int64)
    np.put_along_axis(rows, index, filled, axis=1)
    return rows


def mutate(
    problem: Problem, population: np.ndarray, rate: float, rng: np.random.Generator
) -> np.ndarray:
    """Per (individual, job) with probability ``rate``: set a random node's replicas to a random
    count (0 included), clear the job, or draw a fresh random allocation for it."""
    size, jobs, nodes = population.shape
    hit = rng.random((size, jobs)) < rate
    node = rng.integers(0, nodes, (size, jobs))
    count = rng.integers(0, problem.capacity[node] + 1)
    pop = population.copy()
    ii, jj = np.nonzero(hit)
    pop[ii, jj, node[ii, jj]] = count[ii, jj]
    kind = rng.random((size, jobs))
    pop[hit & (kind < 0.15)] = 0
    ii, jj = np.nonzero(hit & (kind > 0.7))
    pop[ii, jj] = fresh_rows(problem, jj, rng)
    return pop


def initial_population(
    problem: Problem, warm: np.ndarray, size: int, rate: float, rng: np.random.Generator
) -> np.ndarray:
    """The warm start, the current replicas, mutants of the warm start and random individuals."""
    jobs, nodes = warm.shape
    population = np.repeat(warm[None], size, axis=0)
    population[1] = problem.previous
    half = size // 2
    population[2:half] = mutate(problem, population[2:half], rate * 3, rng)
    random = np.zeros((size - half, jobs, nodes), dtype=np.int64)
    ii, jj = np.nonzero(rng.random((size - half, jobs)) < 0.5)
    random[ii, jj] = fresh_rows(problem, jj, rng)
    population[half:] = random
    return repair(problem, population, rng)


def warm_start(policy_input: PolicyInput, problem: Problem) -> np.ndarray:
    """Last round's best matrix mapped onto this round's jobs and nodes (else current replicas)."""
    previous = policy_input.previous
    state = previous.state if previous is not None else None
    warm = problem.previous.copy()
    if isinstance(state, PolluxState):
        jobs = {job_id: i for i, job_id in enumerate(state.job_ids)}
        nodes = {name: i for i, name in enumerate(state.node_names)}
        node_cols = [nodes.get(node.name, -1) for node in policy_input.cluster.nodes]
        for j, job in enumerate(policy_input.jobs):
            if job.job_id in jobs:
                row = state.replicas[jobs[job.job_id]]
                warm[j] = [row[c] if c >= 0 else 0 for c in node_cols]
    return warm


def evolve(
    problem: Problem, warm: np.ndarray, config: PolluxPolicyConfig, rng: np.random.Generator
) -> np.ndarray:
    """The GA: binary tournaments, per-job uniform crossover, mutation, repair, two elites."""
    population = initial_population(problem, warm, config.population, config.mutation_rate, rng)
    scores = fitness(problem, population, config.p)
    size, jobs, _ = population.shape
    for _ in range(config.generations):
        pairs = rng.integers(0, size, (2, size, 2))
        winners = np.where(
            scores[pairs[:, :, 0]] >= scores[pairs[:, :, 1]], pairs[:, :, 0], pairs[:, :, 1]
        )
        take_first = rng.random((size, jobs, 1)) < 0.5
        children = np.where(take_first, population[winners[0]], population[winners[1]])
        children = repair(problem, mutate(problem, children, config.mutation_rate, rng), rng)
        elite = np.argsort(-scores)[:2]
        children[:2] = population[elite]
        population = children
        scores = fitness(problem, population, config.p)
    return population[int(np.argmax(scores))]


@dataclass(frozen=True)
class PolluxPolicy:
    config: PolluxPolicyConfig = field(default_factory=PolluxPolicyConfig)

    def solve(self, policy_input: PolicyInput) -> Allocation:
        started = time.perf_counter()
        cluster = policy_input.cluster
        names = tuple(node.name for node in cluster.nodes)
        if not policy_input.jobs or not names:
            return Allocation({}, policy_input.now, policy_input.round_index)
        rng = np.random.default_rng([self.config.seed, policy_input.round_index])
        problem = build_problem(policy_input, self.config)
        best = evolve(problem, warm_start(policy_input, problem), self.config, rng)
        jobs: dict[str, JobAllocation] = {}
        hints: dict[str, tuple[NodeShare, ...]] = {}
        for j, job in enumerate(policy_input.jobs):
            row = best[j]
            if row.sum() == 0:
                continue
            used = np.flatnonzero(row)
            gpu_type = cluster.nodes[int(used[0])].gpu_type
            config = Configuration(gpu_type, int(used.size), int(row.sum()))
            estimate = job.estimator.evaluate([config], fixed_batch=job.kind in FIXED_BATCH)
            jobs[job.job_id] = allocation_from_row(config, estimate, 0)
            hints[job.job_id] = tuple(NodeShare(names[int(n)], int(row[n])) for n in used)
        state = PolluxState(tuple(j.job_id for j in policy_input.jobs), names, best)
        return Allocation(
            jobs=jobs,
            time=policy_input.now,
            round_index=policy_input.round_index,
            state=state,
            info=SolveInfo("heuristic", time.perf_counter() - started),
            node_hints=hints,
        )
