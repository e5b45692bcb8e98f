"""One PPO iteration over a list of fragments, on one rank (DDP-aware, but runs fine without DDP).

The iteration, top to bottom:

1. collate fragments into batches of ``batch_size_per_gpu`` (observations get ``next_obs`` appended as step L);
2. evaluate values with the current weights over L+1 steps from each fragment's stored state (per-sample
   state, so any batch size works -- MineStudio bootstraps with the whole batch's state); where the fragments
   already hold those values and log-probs (``behaviour_outputs_hold``), only V(next_obs) is evaluated;
3. GAE over all of this rank's fragments, chaining consecutive fragments of one env, bootstrapping through
   truncation, with V(next_obs) at fragment ends;
4. update the value normaliser once with the *global* (all-rank) return moments, and standardise
   advantages with global moments when ``normalize_advantage_full_batch``;
5. ``epochs_per_iteration`` passes: shuffled batches (in the first ``whole_batch_iterations``, all of them as
   one), truncated BPTT over ``context_length`` slices with the state carried (detached), loss = policy +
   value + KL-to-reference - entropy, gradients accumulated over ``gradient_accumulation`` batches, a NaN/inf
   check agreed by all ranks *before* each optimiser step; with ``target_kl``, the passes end early once the
   policy has moved past 1.5x that KL from where the iteration started;
6. with ``enable_ref_update``, move the KL reference ``ref_update_rate`` of the way to the policy.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Sequence

import numpy as np
import torch

from craftrl.config.schema import TrainConfig
from craftrl.policies.state import detach_state, tree_leaves, tree_map
from craftrl.rollout.fragment import Fragment
from craftrl.train.batch import Batch, collate, cut_sequences, merge_batches, select_rows, slice_time
from craftrl.train.distributed import all_reduce, all_reduce_max, rank_mean
from craftrl.train.entropy_control import next_entropy_coef
from craftrl.train.gae import compute_gae, successors
from craftrl.train.losses import (advantage_moments, clipped_policy_loss, explained_variance_from_sums,
                                  masked_mean, normalize_advantages, value_loss)
from craftrl.train.precision import PrecisionTiming, time_both_precisions
from craftrl.train.reference import move_towards
from craftrl.utils.hardware import NATIVE_BF16_FLAGS, native_cpu_bf16_flags

logger = logging.getLogger(__name__)


def zero_value_output(policy: torch.nn.Module) -> bool:
    """``zero_initial_vf``: zero the value head's output layer so initial predictions are 0.

    Only the output layer: the normaliser statistics stay as they are (MineStudio zeroed those too, which
    silently set the value scale to sqrt(min_var)). Returns False for a policy without such a layer.
    """
    linear = getattr(getattr(policy, "value_head", None), "linear", None)
    if not isinstance(linear, torch.nn.Linear):
        return False
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.zero_()
    return True


FUSED_OPTIMIZER_DEVICES = ("cpu", "cuda")


def make_optimizer(policy: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW, with torch's fused kernel wherever every parameter allows it.

    Why fused: the per-tensor loop launches about ten small ops per parameter tensor per step, which dominate a
    small policy's optimiser step on CPU (bench/notes/learning.md). It is the
    same AdamW update, and ``GradScaler`` handles fused optimisers, so AMP is unaffected.
    """
    parameters = list(policy.parameters())
    fused = bool(parameters) and all(p.dtype.is_floating_point and p.device.type in FUSED_OPTIMIZER_DEVICES
                                     for p in parameters)
    return torch.optim.AdamW(parameters, lr=config.learning_rate, weight_decay=config.weight_decay,
                             eps=config.adam_eps, fused=fused or None)


class PPOLearner:
    """Holds the model (DDP-wrapped or not), optimiser, reference policy and the PPO schedule state."""

    def __init__(self, model: torch.nn.Module, config: TrainConfig, device: torch.device,
                 reference: torch.nn.Module | None = None, acted_with_exact_weights: bool = False):
        """``acted_with_exact_weights``: the rollout acts with exactly the weights this learner publishes (they
        travel in float32), so its fragments' values and log-probs are this policy's, computed in float32."""
        self.model = model
        self.policy = model.module if hasattr(model, "module") else model
        self.config = config
        self.device = device
        self.optimizer = make_optimizer(self.policy, config)
        self.use_amp = bool(config.use_amp and device.type == "cuda")
        wants_cpu_bf16 = config.cpu_bf16 is not False and device.type == "cpu"
        native = wants_cpu_bf16 and bool(native_cpu_bf16_flags())
        self.use_cpu_bf16 = native and config.cpu_bf16 is True
        self.precision_probe_pending = native and config.cpu_bf16 == "auto"
        if wants_cpu_bf16 and not native:
            log = logger.warning if config.cpu_bf16 is True else logger.info
            log("train_config.cpu_bf16=%s: float32, as this CPU has no native bfloat16 instructions (%s) or "
                "ONEDNN_MAX_CPU_ISA keeps torch from them, where bf16 runs emulated", config.cpu_bf16,
                " or ".join(NATIVE_BF16_FLAGS))
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.use_amp)
        self.reference = reference
        self.rho = config.kl_divergence_coef_rho
        self.entropy_coef = config.entropy_bonus_coef
        self.skipped_steps = 0
        self.acted_with_exact_weights = acted_with_exact_weights

    def load_optimizer_state(self, state: dict) -> None:
        """Resume the optimiser from a checkpoint, keeping this learner's kernel choice.

        ``Optimizer.load_state_dict`` takes every hyper-parameter of the saved groups, ``fused`` included, so a
        checkpoint written before the optimiser was fused (or on a device where it was not) would silently
        switch the per-tensor loop back on."""
        self.optimizer.load_state_dict(state)
        for group in self.optimizer.param_groups:
            group["fused"] = self.optimizer.defaults["fused"]
            group["foreach"] = self.optimizer.defaults["foreach"]

    def set_learning_rate(self, iteration: int) -> float:
        lr = self.config.learning_rate
        if self.config.anneal_lr_linearly:
            lr *= max(0.0, 1.0 - iteration / self.config.num_iterations)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    # ------------------------------------------------------------------ phases

    def _autocast(self, cpu_bf16: bool | None = None):
        """The autocast of the learner's passes; ``cpu_bf16`` overrides the chosen CPU precision (the probe that
        chooses it times both)."""
        if self.use_amp:
            return torch.autocast(device_type="cuda", dtype=torch.float16)
        in_bf16 = self.use_cpu_bf16 if cpu_bf16 is None else cpu_bf16
        if in_bf16:
            return torch.autocast(device_type="cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @torch.no_grad()
    def evaluate(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Values (return units) of all L+1 observations and log-probs of the L actions, with the weights at
        the start of the iteration, from the stored state carried across slices.

        With ``minibatch_sequence_length`` it also records on ``batch`` the state at the start of every sequence
        of that many steps (and the KL reference's, when there is one): where the shuffled sequences start. A
        feed-forward policy's state is empty everywhere, so it is evaluated in ``context_length`` slices all the
        same (sequences of 1 step would otherwise cost a forward call per step)."""
        cfg = self.config
        feed_forward = not tree_leaves(batch.state_in)
        record = cfg.minibatch_sequence_length > 0 and not feed_forward
        with_reference = record and self.reference is not None and self.rho > 0
        state = reference_state = batch.state_in
        values, logps = [], []
        batch.sequence_states, batch.reference_sequence_states = ([], []) if record else (None, None)
        length = batch.length
        step = cfg.minibatch_sequence_length if record else cfg.context_length
        for start in range(0, length + 1, step):
            end = min(start + step, length + 1)
            if record and start < length:
                batch.sequence_states.append(state)
                if with_reference:
                    batch.reference_sequence_states.append(reference_state)
                    _, reference_state = self.reference(input=slice_time(batch.obs, start, end),
                                                        state_in=reference_state, first=batch.first[:, start:end])
            with self._autocast():
                # the unwrapped policy: parameters are identical on every rank and no collective is needed
                latents, state = self.policy(input=slice_time(batch.obs, start, end), state_in=state,
                                             first=batch.first[:, start:end])
            values.append(latents["vpred"].float())
            acted = min(end, length) - start  # the last observation (next_obs) has no action
            if acted > 0:
                logits = tree_map(lambda t: t[:, :acted].float(), latents["pi_logits"])  # bf16 under cpu_bf16
                logps.append(self.policy.pi_head.logprob(slice_time(batch.action, start, start + acted),
                                                         logits).float())
        if feed_forward:
            self._feed_forward_sequence_states(batch)
        return self.policy.value_head.denormalize(torch.cat(values, dim=1)), torch.cat(logps, dim=1)

    def behaviour_outputs_hold(self, batch: Batch, version: int | None) -> bool:
        """Whether the batch's own values and log-probs are what :meth:`evaluate` would compute, up to rounding:
        every step was acted by ``version``, the weights about to be trained (always so in lock-step collection),
        sent exactly, and this learner evaluates in float32 as the rollout acts; and the policy is feed-forward,
        so there are no sequence states to record. The forward pass over every step, 8-10 % of the learner's
        computation per iteration, then adds nothing (bench/notes/code_figures.md, "Learner")."""
        if version is None or not self.acted_with_exact_weights or self.use_amp or self.use_cpu_bf16:
            return False
        return not tree_leaves(batch.state_in) and all(f.min_version == version == int(np.max(f.version))
                                                       for f in batch.fragments)

    @torch.no_grad()
    def behaviour_outputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`evaluate`'s values and log-probs where ``behaviour_outputs_hold``: the fragments' own, and the
        value of the observation after the last step (the bootstrap), which the rollout did not compute."""
        end = batch.length
        latents, _ = self.policy(input=slice_time(batch.obs, end, end + 1), state_in=batch.state_in,
                                 first=batch.first[:, end:end + 1])
        bootstrap = self.policy.value_head.denormalize(latents["vpred"].float())
        values = torch.from_numpy(np.stack([f.value for f in batch.fragments])).to(self.device)
        self._feed_forward_sequence_states(batch)
        return torch.cat([values.float(), bootstrap], dim=1), batch.behaviour_logp.float()

    def _feed_forward_sequence_states(self, batch: Batch) -> None:
        """A feed-forward policy's state at every sequence start: the empty state it starts from."""
        sequence_length = self.config.minibatch_sequence_length
        if sequence_length > 0:
            batch.sequence_states = [batch.state_in] * len(range(0, batch.length, sequence_length))
            batch.reference_sequence_states = []
        else:
            batch.sequence_states = batch.reference_sequence_states = None

    def prepare(self, fragments: Sequence[Fragment], version: int | None = None) -> list[Batch]:
        """Collate, evaluate, run GAE and normalise: everything before the gradient passes. ``version``: the
        policy version of the weights about to be trained, if known."""
        cfg = self.config
        order = np.arange(len(fragments))
        batches = [collate([fragments[i] for i in order[s:s + cfg.batch_size_per_gpu]],
                           order[s:s + cfg.batch_size_per_gpu], self.device)
                   for s in range(0, len(fragments), cfg.batch_size_per_gpu)]
        evaluated = [self.behaviour_outputs(b) if self.behaviour_outputs_hold(b, version) else self.evaluate(b)
                     for b in batches]
        for batch, (_, logp) in zip(batches, evaluated):
            batch.proximal_logp = logp
        values = torch.cat([v for v, _ in evaluated]).cpu().numpy()  # [N, L+1]
        stacked = {name: np.stack([getattr(f, name) for f in fragments])
                   for name in ("reward", "terminated", "truncated", "final_value")}
        succ = self._successors = successors([f.env_id for f in fragments], [f.index for f in fragments])
        advantages, returns = compute_gae(stacked["reward"], values[:, :-1], stacked["terminated"],
                                          stacked["truncated"], stacked["final_value"], values[:, -1], succ,
                                          cfg.discount, cfg.gae_lambda)
        advantages_t = torch.from_numpy(advantages).to(self.device)
        returns_t = torch.from_numpy(returns).to(self.device)
        if cfg.use_normalized_vf:
            self._update_normalizer(returns_t)
        if cfg.normalize_advantage_full_batch:
            everything = torch.ones_like(advantages_t, dtype=torch.bool)
            moments = all_reduce(advantage_moments(advantages_t, everything).to(self.device))
            advantages_t = normalize_advantages(advantages_t, moments.cpu(), std_floor=cfg.advantage_std_floor)
        for batch in batches:
            batch.advantages = advantages_t[batch.rows]
            batch.returns = returns_t[batch.rows]
            batch.old_values = torch.from_numpy(values[batch.rows, :-1]).to(self.device)
        return batches

    def _update_normalizer(self, returns: torch.Tensor) -> None:
        """One EWMA update with the global mean and mean square, identical on every rank.

        The normaliser folds in ``mean(x)`` and ``mean(x**2)``; two points ``m +- s`` with
        ``s = sqrt(E[x^2] - m^2)`` have exactly the global first and second moments.
        """
        flat = returns.double().reshape(-1)
        sums = all_reduce(torch.stack([torch.tensor(float(flat.numel()), dtype=torch.float64, device=flat.device),
                                       flat.sum(), (flat ** 2).sum()]))
        count, total, total_sq = sums.tolist()
        mean = total / count
        spread = math.sqrt(max(total_sq / count - mean ** 2, 0.0))
        self.policy.value_head.update(torch.tensor([mean + spread, mean - spread], device=returns.device))

    def epoch_batches(self, batches: list[Batch], sequences: Batch | None,
                      generator: torch.Generator) -> list[Batch]:
        """One epoch's minibatches: the fragment batches in a new order, or -- with ``minibatch_sequence_length`` -- as
        many minibatches of sequences drawn afresh from all fragments."""
        order = torch.randperm(len(batches), generator=generator)
        if sequences is None:
            return [batches[i] for i in order.tolist()]
        shuffled = torch.randperm(len(sequences.rows), generator=generator)
        return [select_rows(sequences, rows) for rows in torch.tensor_split(shuffled, len(batches))]

    def train_epochs(self, batches: list[Batch], iteration: int, generator: torch.Generator) -> dict[str, float]:
        cfg = self.config
        warmup = iteration < cfg.vf_warmup
        sums: dict[str, float] = {}
        count = 0
        grad_norms, skipped = [], 0
        sequences = cut_sequences(batches, cfg.minibatch_sequence_length) if cfg.minibatch_sequence_length else None
        whole = None
        if iteration < cfg.whole_batch_iterations and len(batches) > 1:
            whole = sequences if sequences is not None else merge_batches(batches)
        stopped_early = False
        for _ in range(cfg.epochs_per_iteration):
            epoch = [whole] if whole is not None else self.epoch_batches(batches, sequences, generator)
            self.optimizer.zero_grad(set_to_none=True)
            group_kl = []
            for position, batch in enumerate(epoch):
                closes_group = (position + 1) % cfg.gradient_accumulation == 0 or position == len(epoch) - 1
                values = self._train_batch(batch, warmup, closes_group)
                for name, value in values.items():
                    sums[name] = sums.get(name, 0.0) + value
                group_kl.append(values["ppo/proximal_kl"])
                count += 1
                if closes_group:
                    if self._past_target_kl(group_kl):
                        self.optimizer.zero_grad(set_to_none=True)
                        stopped_early = True
                        break
                    group_kl = []
                    grad_norm, stepped = self._optimizer_step()
                    skipped += not stepped
                    if stepped:
                        grad_norms.append(grad_norm)
            if stopped_early:
                break
        metrics = {name: value / max(count, 1) for name, value in sums.items()}
        metrics["ppo/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        metrics["ppo/skipped_steps"] = float(skipped)
        metrics["ppo/optimizer_steps"] = float(len(grad_norms))
        metrics["ppo/stopped_early"] = float(stopped_early)
        return dict(zip(metrics, rank_mean(metrics.values(), self.device)))

    def _past_target_kl(self, group_kl: list[float]) -> bool:
        """``target_kl``: whether the policy has moved more than 1.5x the target from the iteration's start.

        Measured on the minibatches about to be stepped (before their step, as Stable-Baselines3 does) against
        the learner's own policy at the start of the iteration, not the behaviour policy: asynchronous data is
        already up to ``max_staleness`` versions away from it before this iteration moves at all. Every rank
        decides on the rank-averaged value, so all stop at the same step."""
        if self.config.target_kl is None or not group_kl:
            return False
        kl, = rank_mean([float(np.mean(group_kl))], self.device)
        return kl > 1.5 * self.config.target_kl

    def _train_batch(self, batch: Batch, warmup: bool, closes_group: bool) -> dict[str, float]:
        """Backward of the PPO loss over ``batch`` in ``context_length`` slices (truncated BPTT, the state
        carried); DDP synchronises gradients only on the last slice of a group's last batch."""
        cfg = self.config
        length = batch.length
        state = batch.state_in
        reference_state = batch.state_in if batch.reference_state_in is None else batch.reference_state_in
        starts = list(range(0, length, cfg.context_length))
        totals: dict[str, float] = {}
        for number, start in enumerate(starts):
            end = min(start + cfg.context_length, length)
            share = (end - start) / length
            sync = closes_group and number == len(starts) - 1
            context = contextlib.nullcontext() if sync or not hasattr(self.model, "no_sync") else self.model.no_sync()
            with context:
                with self._autocast():
                    loss, terms, state, reference_state = self._slice_loss(batch, start, end, state,
                                                                           reference_state, warmup)
                self.scaler.scale(loss * (share / cfg.gradient_accumulation)).backward()
            state = detach_state(state)
            for name, value in terms.items():
                totals[name] = totals.get(name, 0.0) + float(value) * share
        return totals

    def _slice_loss(self, batch: Batch, start: int, end: int, state, reference_state, warmup: bool):
        """The loss of steps ``start:end`` of ``batch`` from ``state``: clipped policy + value + rho * KL to the
        reference - entropy. Returns it, its terms (detached), and the policy's and reference's next states."""
        cfg = self.config
        inputs, first = slice_time(batch.obs, start, end), batch.first[:, start:end]
        latents, state = self.model(input=inputs, state_in=state, first=first)
        logits = latents["pi_logits"]
        head = self.policy.pi_head
        new_logp = head.logprob(slice_time(batch.action, start, end), logits)
        mask = torch.ones_like(new_logp, dtype=torch.bool)
        policy = clipped_policy_loss(new_logp.float(), batch.behaviour_logp[:, start:end],
                                     batch.advantages[:, start:end], mask, cfg.ppo_clip, cfg.log_ratio_range)
        value_head = self.policy.value_head
        old_values, targets = batch.old_values[:, start:end], batch.returns[:, start:end]
        if cfg.use_normalized_vf:
            old_values, targets = value_head.normalize(old_values), value_head.normalize(targets)
        v_loss = value_loss(latents["vpred"].float(), old_values, targets, mask, cfg.clip_vloss, cfg.ppo_clip)
        entropy = masked_mean(head.entropy(logits).float(), mask)
        kl = torch.zeros((), device=self.device)
        if self.reference is not None and self.rho > 0:
            with torch.no_grad():
                reference_latents, reference_state = self.reference(input=inputs, state_in=reference_state,
                                                                    first=first)
            kl = masked_mean(head.kl_divergence(logits, reference_latents["pi_logits"]).float(), mask)
        with torch.no_grad():  # how far the policy has moved since the iteration started (target_kl)
            moved = (new_logp.float() - batch.proximal_logp[:, start:end]).clamp(-cfg.log_ratio_range,
                                                                                 cfg.log_ratio_range)
            proximal_kl = masked_mean(moved.exp() - 1.0 - moved, mask)
        policy_coef, entropy_coef, rho = (0.0, 0.0, 0.0) if warmup else (cfg.ppo_policy_coef,
                                                                         self.entropy_coef, self.rho)
        # Zero coefficients still keep every parameter in the graph, which DDP requires.
        loss = policy_coef * policy.loss + cfg.ppo_vf_coef * v_loss + rho * kl - entropy_coef * entropy
        terms = {"loss/policy": policy.loss, "loss/value": v_loss, "loss/entropy": entropy, "loss/kl_reference": kl,
                 "ppo/approx_kl": policy.approx_kl, "ppo/clip_fraction": policy.clip_fraction,
                 "ppo/ratio_mean": policy.ratio_mean, "ppo/proximal_kl": proximal_kl}
        return loss, {name: value.detach() for name, value in terms.items()}, state, reference_state

    def choose_cpu_precision(self, batch: Batch) -> PrecisionTiming:
        """``cpu_bf16="auto"``: time forward + backward of the loss over ``batch``'s first ``context_length``
        steps in float32 and in bf16 autocast, and compute in the faster from now on.

        Every rank decides on the rank-summed seconds, so all compute alike. The gradients are discarded and no
        weight moves; the probe runs once per learner (again after a resume)."""
        reference_state = batch.state_in if batch.reference_state_in is None else batch.reference_state_in
        end = min(self.config.context_length, batch.length)
        no_sync = getattr(self.model, "no_sync", contextlib.nullcontext)

        def run_pass(bf16: bool) -> None:
            with no_sync():
                with self._autocast(cpu_bf16=bf16):
                    loss, *_ = self._slice_loss(batch, 0, end, batch.state_in, reference_state, warmup=False)
                loss.backward()
            self.optimizer.zero_grad(set_to_none=True)

        measured = time_both_precisions(run_pass)
        float32_seconds, bf16_seconds = all_reduce(torch.tensor(
            [measured.float32_seconds, measured.bf16_seconds], dtype=torch.float64, device=self.device)).tolist()
        timing = PrecisionTiming(float32_seconds=float32_seconds, bf16_seconds=bf16_seconds)
        self.use_cpu_bf16 = timing.bf16_faster
        self.precision_probe_pending = False
        logger.info("train_config.cpu_bf16=auto: one forward + backward over %d steps of %d fragments took %.4f s "
                    "in float32 and %.4f s in bf16 (summed over ranks); the learner computes in %s",
                    end, len(batch.rows), float32_seconds, bf16_seconds,
                    "bf16" if self.use_cpu_bf16 else "float32")
        return timing

    def _optimizer_step(self) -> tuple[float, bool]:
        """Clip, check for non-finite gradients on *all* ranks, then step -- or skip together.

        Returns the gradient norm and whether the step was taken."""
        self.scaler.unscale_(self.optimizer)
        parameters = [p for p in self.policy.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters, self.config.max_grad_norm) if parameters \
            else torch.zeros((), device=self.device)
        bad = torch.tensor([0.0 if torch.isfinite(grad_norm) else 1.0], device=self.device)
        all_reduce_max(bad)
        if bad.item() > 0:
            self.skipped_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
            if self.use_amp:
                self.scaler.update()
            return float("nan"), False
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm), True

    def _data_metrics(self, batches: list[Batch], fragments: Sequence[Fragment], version: int) -> dict[str, float]:
        """Statistics of the iteration's data over all ranks (sums all-reduced, the lag maximum by MAX)."""
        values = torch.cat([b.old_values for b in batches]).double().reshape(-1)
        returns = torch.cat([b.returns for b in batches]).double().reshape(-1)
        residual = returns - values
        lag = np.concatenate([version - f.version for f in fragments])
        rewards = np.concatenate([f.reward for f in fragments])
        chained = int((self._successors >= 0).sum())
        # how far the learner already is from the behaviour policy before this iteration moves at all
        log_ratio = torch.cat([b.proximal_logp - b.behaviour_logp for b in batches]).double().reshape(-1)
        ratio = log_ratio.clamp(-self.config.log_ratio_range, self.config.log_ratio_range).exp()
        stale_kl = float(((ratio - 1.0) - log_ratio).sum())
        stale_clipped = float(((ratio - 1.0).abs() > self.config.ppo_clip).sum())
        sums = all_reduce(torch.tensor([
            float(values.numel()), float(returns.sum()), float((returns ** 2).sum()), float(residual.sum()),
            float((residual ** 2).sum()), float(lag.sum()), float(len(fragments)), float(rewards.sum()),
            float(chained), stale_kl, stale_clipped], dtype=torch.float64, device=self.device)).tolist()
        lag_max = all_reduce_max(torch.tensor([float(lag.max())], dtype=torch.float64, device=self.device)).item()
        n, y_sum, y_sq, r_sum, r_sq, lag_sum, count, reward_sum, chained_total, stale_kl, stale_clipped = sums
        return {
            "ppo/behaviour_kl": stale_kl / n,
            "ppo/behaviour_clip_fraction": stale_clipped / n,
            "ppo/explained_variance": explained_variance_from_sums(n, y_sum, y_sq, r_sum, r_sq),
            "ppo/gae_chained_fraction": chained_total / count,
            "data/version_lag_mean": lag_sum / n,
            "data/version_lag_max": lag_max,
            "data/fragments": count,
            "data/env_steps": n,
            "data/reward_mean": reward_sum / n,
        }

    def iteration(self, fragments: Sequence[Fragment], iteration: int, version: int,
                  generator: torch.Generator) -> dict[str, float]:
        """Prepare and train on ``fragments``; returns rank-averaged metrics."""
        lr = self.set_learning_rate(iteration)
        self.model.train()
        batches = self.prepare(fragments, version)
        if self.precision_probe_pending:
            self.choose_cpu_precision(batches[0])
        metrics = self.train_epochs(batches, iteration, generator)
        policy_trained = iteration >= self.config.vf_warmup
        if self.config.enable_ref_update and self.reference is not None and policy_trained:
            move_towards(self.reference, self.policy, self.config.ref_update_rate)
        metrics.update(self._data_metrics(batches, fragments, version))
        metrics.update({"ppo/learning_rate": lr, "ppo/rho": self.rho, "ppo/entropy_coef": self.entropy_coef,
                        "ppo/skipped_steps_total": float(self.skipped_steps),
                        "ppo/cpu_bf16": float(self.use_cpu_bf16)})
        self.rho *= self.config.coef_rho_decay
        if self.config.target_entropy is not None and policy_trained:
            self.entropy_coef = next_entropy_coef(self.entropy_coef, metrics["loss/entropy"],
                                                  self.config.target_entropy, self.config.entropy_coef_step)
        return metrics
