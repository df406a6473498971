"""Learner: online + target Q-networks, AdamW, controllers, kill monitor, and the C51 update.

One `update(batch)` is: double-DQN C51 target per branch (the online net picks a* = argmax E[Q]
at x' per branch, the target net's distribution of a* is projected through r + γⁿ z), per-branch
cross-entropy against the online logits of the taken action, averaged over branches, weighted by
the importance weights; backward; adaptive clip; AdamW step; Polyak target update; controller
and kill-monitor statistics. Everything stays on the device: no host syncs, no data-dependent
shapes and no Python branching on tensor values, so the whole update can be captured in a CUDA
graph (AdamW runs fused with `capturable=True` and a 0-dim tensor lr on CUDA; gradients are views into
one flat buffer that is overwritten in place, never set to None, so their storage is stable across replays).
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from trainer.agent.act import select_actions, thompson_scale_at
from trainer.agent.c51 import project_distribution
from trainer.agent.config import AgentConfig
from trainer.agent.controllers import Controllers
from trainer.agent.kill import KillMonitor
from trainer.agent.network import QNetwork, expected_q
from trainer.streams import HIGH_PRIORITY, SideStream

OPTIM_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq")


class Batch(NamedTuple):
    """One replay sample; `Learner.update` also accepts the plain 8-tuple in this order."""
    obs: Tensor  # (B, W, F) float32
    env_state: Tensor  # (B, S) float32
    actions: Tensor  # (B, n_branches) int64
    returns: Tensor  # (B,) n-step discounted return
    discounts: Tensor  # (B,) γⁿ (1 - done)
    next_obs: Tensor  # (B, W, F)
    next_env_state: Tensor  # (B, S)
    weights: Tensor  # (B,) importance-sampling weights


class Loss(NamedTuple):
    """What `Learner.loss` leaves for `Learner.gradient` (with the autograd graph), and `gradient` for `apply`
    (detached: the gradient itself is then in `Learner.flat_grad`)."""
    loss: Tensor  # () importance-weighted mean cross-entropy
    per_item: Tensor  # (B,) cross-entropy per item, averaged over branches (the new priorities)
    taken: Tensor  # (B, nb, N) online logits of the taken actions
    returns: Tensor  # (B,) n-step returns of the batch


class Learner:
    def __init__(self, net: QNetwork, cfg: AgentConfig, device: torch.device | str, adaptive: bool = True,
                 overlap: bool = True):
        """`adaptive=False` freezes lr, clip and tau at cfg.lr, cfg.clip_init and cfg.tau. `overlap` runs the
        double-DQN target (two forwards at x') on a side CUDA stream, concurrently with the online forward at x
        (trainer/streams.py; same values, nothing on CPU)."""
        self.cfg = cfg
        self.device = torch.device(device)
        # The online and the target net's forwards at x', on the learner's priority (the step's critical path).
        self.side = SideStream(self.device, enabled=overlap, priority=HIGH_PRIORITY)
        self.side_target = SideStream(self.device, enabled=overlap, priority=HIGH_PRIORITY)
        self.online = net.to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.params = list(self.online.parameters())
        self.target_params = list(self.target.parameters())
        self.controllers = Controllers(cfg, self.device, adaptive=adaptive)
        self.kill = KillMonitor(cfg, self.device)
        # One flat gradient buffer with every parameter's .grad a view into it: `backward` writes the whole
        # gradient into it with one copy (a .grad is never replaced), so the norm, the clip and the NaN guard are
        # one kernel each instead of one per parameter tensor (46 of them in the h100 network).
        self.flat_grad = torch.zeros(sum(p.numel() for p in self.params), device=self.device)  # (n_params,)
        offset = 0
        for p in self.params:
            p.grad = self.flat_grad[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        on_accel = self.device.type != "cpu"
        # capturable=True keeps AdamW's step counters on the device and reads the tensor lr there, so the step
        # can be graph-captured; PyTorch only allows it (with a tensor lr) off CPU. fused=True does the whole
        # update in one multi-tensor kernel (foreach takes about a dozen); same formula, float rounding aside.
        self.optimizer = torch.optim.AdamW(self.params, lr=self.controllers.lr, betas=(0.9, 0.999),
                                           eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
                                           capturable=on_accel, fused=on_accel or None)
        self.update_step = torch.zeros((), dtype=torch.int64, device=self.device)

    # ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: Tensor, env_state: Tensor, explore: bool) -> Tensor:
        """Actions (B, n_branches) int64 from the online net (Thompson when `explore`, else greedy)."""
        logits = self.online(obs, env_state)
        return select_actions(logits, self.online.support, self.online.action_mask, explore, self.thompson_scale())

    def thompson_scale(self) -> Tensor | float:
        """κ of the exploring draws at the current update step (AgentConfig.thompson_scale; device math)."""
        c = self.cfg
        return thompson_scale_at(self.update_step, c.thompson_scale, c.thompson_scale_final, c.thompson_anneal_updates)

    @torch.no_grad()
    def polyak_update(self, tau: Tensor | float) -> None:
        """θ_target ← (1 − τ) θ_target + τ θ_online. τ = 1 copies exactly (0·θ_target + 1·θ_online), τ = 0 leaves
        the target untouched. Written as foreach mul/add because `_foreach_lerp_` takes τ as a Python scalar,
        which would be a host sync (and breaks CUDA-graph capture) when τ is the controller's device tensor."""
        keep = 1.0 - tau
        torch._foreach_mul_(self.target_params, keep)
        torch._foreach_add_(self.target_params, torch._foreach_mul(self.params, tau))

    def update(self, batch: Batch | tuple[Tensor, ...]) -> dict[str, Tensor]:
        """One gradient step: `apply(backward(batch))`. Returns 0-dim device tensors (loss, q_mean, grad_norm, lr,
        clip, tau, td_error_mean) and `priorities` (B,), the per-item cross-entropy for the replay."""
        return self.apply(self.backward(batch))

    def backward(self, batch: Batch | tuple[Tensor, ...]) -> Loss:
        """The double-DQN C51 target, the loss and its backward into `flat_grad`: `gradient(loss(batch))`.
        Parameters are only read, so a caller may act with the online net concurrently (trainer/loop/step.py)
        until `apply`."""
        return self.gradient(self.loss(batch))

    def loss(self, batch: Batch | tuple[Tensor, ...]) -> Loss:
        """The double-DQN C51 target and the loss, with the autograd graph of the online forward at x. With
        `overlap` the online and the target forwards at x' run on two side streams while the online forward at
        x runs on the current one."""
        obs, env_state, actions, returns, discounts, next_obs, next_env_state, weights = batch
        with self.side.fork():
            next_a = self._greedy_actions(next_obs, next_env_state)
        with self.side_target.fork():
            next_logits = self._target_logits(next_obs, next_env_state)
        taken = self._taken_logits(obs, env_state, actions)
        self.side.join()
        self.side_target.join()
        loss, per_item = self._cross_entropy(taken, next_logits, next_a, returns, discounts, weights)
        return Loss(loss, per_item, taken, returns)

    def gradient(self, loss: Loss) -> Loss:
        """The backward of `loss` into `flat_grad`; returns the loss terms detached."""
        # The gradient lands in the flat buffer in one copy (a .backward() would add into each parameter's view:
        # a zero_ and one kernel per tensor). Parameters the loss does not reach get zeros.
        grads = torch.autograd.grad(loss.loss, self.params, materialize_grads=True)
        torch.cat([g.reshape(-1) for g in grads], out=self.flat_grad)
        return Loss(*(t.detach() for t in loss))

    def apply(self, grads: Loss) -> dict[str, Tensor]:
        """Adaptive clip of `flat_grad`, AdamW, Polyak, and the controller and kill-monitor statistics."""
        grad_norm, clip, lr, tau = self._clip_gradient()
        self.optimizer.step()
        self.polyak_update(tau)

        q_mean = self._statistics(grads.loss, grad_norm, grads.taken, grads.returns)
        return {"loss": grads.loss, "q_mean": q_mean, "grad_norm": grad_norm, "lr": lr, "clip": clip, "tau": tau,
                "td_error_mean": grads.per_item.mean(), "priorities": grads.per_item}

    @torch.no_grad()
    def _clip_gradient(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Scale `flat_grad` in place to norm <= the controller's clip. Returns the pre-clip norm and the clip, lr
        and tau in force for this update (0-dim copies: the controllers move on in `_statistics`)."""
        grad_norm = torch.linalg.vector_norm(self.flat_grad)  # 0-dim, pre-clip
        clip = self.controllers.clip.clone()
        finite = torch.isfinite(grad_norm)
        # A non-finite gradient is zeroed (coef 0, then NaN·0 → 0) so parameters stay finite; the
        # kill monitor's sticky flag reports it at the next check.
        coef = torch.where(finite, (clip / (grad_norm + 1e-6)).clamp(max=1.0), 0.0)
        self.flat_grad.mul_(coef).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        return grad_norm, clip, self.controllers.lr.clone(), self.controllers.tau.clone()

    @torch.no_grad()
    def _greedy_actions(self, next_obs: Tensor, next_env_state: Tensor) -> Tensor:
        """Double DQN's selection: a* = argmax E[Q] of the online net at x', per branch. (B, nb) int64."""
        next_q = expected_q(self.online(next_obs, next_env_state), self.online.support)  # (B, nb, A_max)
        return next_q.masked_fill(~self.online.action_mask, float("-inf")).argmax(-1)

    def _target_distribution(self, next_logits: Tensor, next_a: Tensor, returns: Tensor,
                             discounts: Tensor) -> Tensor:
        """Double DQN per branch: the target net's distribution (logits (B, nb, A_max, N) at x') of the online
        net's a* (B, nb), projected through r + γⁿ z. Returns (B, nb, N) target masses."""
        batch_size, n_branches, _, n_atoms = next_logits.shape
        idx = next_a[..., None, None].expand(batch_size, n_branches, 1, n_atoms)
        next_probs = torch.softmax(next_logits.gather(2, idx).squeeze(2), dim=-1)  # (B, nb, N)
        return project_distribution(next_probs, returns[:, None].expand(-1, n_branches),
                                    discounts[:, None].expand(-1, n_branches), self.online.support)

    @torch.no_grad()
    def _target_logits(self, next_obs: Tensor, next_env_state: Tensor) -> Tensor:
        """The target net's logits at x', (B, nb, A_max, N)."""
        return self.target(next_obs, next_env_state)

    def _taken_logits(self, obs: Tensor, env_state: Tensor, actions: Tensor) -> Tensor:
        """Online logits of the taken action per branch, (B, nb, N), with their graph for the backward."""
        logits = self.online(obs, env_state)  # (B, nb, A_max, N)
        idx = actions[..., None, None].expand(obs.shape[0], self.cfg.n_branches, 1, self.cfg.n_atoms)
        return logits.gather(2, idx).squeeze(2)

    def _cross_entropy(self, taken: Tensor, next_logits: Tensor, next_a: Tensor, returns: Tensor,
                       discounts: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
        """Per-branch cross-entropy of the taken logits against the target masses (`_target_distribution`),
        averaged over branches, importance-weighted. Returns the loss (0-dim) and the per-item loss (B,)."""
        target = self._target_distribution(next_logits.detach(), next_a, returns, discounts)  # (B, nb, N)
        cross_entropy = -(target * F.log_softmax(taken, dim=-1)).sum(-1)  # (B, nb)
        per_item = cross_entropy.mean(-1)  # (B,) averaged over branches
        return (weights * per_item).mean(), per_item

    @torch.no_grad()
    def _statistics(self, loss: Tensor, grad_norm: Tensor, taken: Tensor, returns: Tensor) -> Tensor:
        """Feed the kill monitor and the controllers (about a hundred 0-dim ops); returns the batch mean E[Q]."""
        q_mean = expected_q(taken, self.online.support).mean()
        return_abs = returns.abs().mean()
        self.kill.observe(loss, grad_norm, q_mean, return_abs)
        self.controllers.observe(grad_norm, q_mean, return_abs)
        self.update_step.add_(1)
        return q_mean

    def compile(self, compiled: Callable[[Callable], Callable]) -> None:
        """Compile the tensor-only pieces of `update` with `compiled` (LoopConfig.compile='all' or 'autotune': the
        step's torch.compile with its options): the three forwards (online at x' for a*, target at x', online at x
        with its backward), the target projection with the loss, the clip, and the statistics, whose ~100 0-dim ops
        fuse into a few kernels. The gradient copy, AdamW (one fused kernel) and Polyak (two foreach kernels) stay
        eager."""
        self._greedy_actions = compiled(self._greedy_actions)
        self._target_logits = compiled(self._target_logits)
        self._taken_logits = compiled(self._taken_logits)
        self._cross_entropy = compiled(self._cross_entropy)
        self._clip_gradient = compiled(self._clip_gradient)
        self._statistics = compiled(self._statistics)

    # ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Tensor]:
        """Flat name -> tensor map (no pickle): networks, AdamW moments and step counts, controller
        and kill state, update_step."""
        sd: dict[str, Tensor] = {"update_step": self.update_step.detach().clone()}
        for prefix, module in (("online", self.online), ("target", self.target)):
            for k, v in module.state_dict().items():
                sd[f"{prefix}.{k}"] = v.detach().clone()
        for i, p in enumerate(self.params):
            for k, v in self.optimizer.state.get(p, {}).items():
                sd[f"optim.{i}.{k}"] = v.detach().clone() if torch.is_tensor(v) else torch.tensor(float(v))
        for prefix, part in (("controllers", self.controllers), ("kill", self.kill)):
            for k, v in part.state_dict().items():
                sd[f"{prefix}.{k}"] = v
        return sd

    def load_state_dict(self, sd: dict[str, Tensor]) -> None:
        """Restore in place (tensor identities are kept, so a captured CUDA graph stays valid once the
        optimiser state exists). Raises ValueError naming the first missing or mismatched key."""
        def take(prefix: str) -> dict[str, Tensor]:
            return {k[len(prefix) + 1:]: v for k, v in sd.items() if k.startswith(prefix + ".")}

        for prefix, module in (("online", self.online), ("target", self.target)):
            own = module.state_dict()
            got = take(prefix)
            if set(got) != set(own):
                raise ValueError(f"learner state '{prefix}': keys differ: missing "
                                 f"{sorted(set(own) - set(got))[:3]}, unexpected {sorted(set(got) - set(own))[:3]}")
            for k, v in own.items():
                if got[k].shape != v.shape:
                    raise ValueError(f"learner state '{prefix}.{k}': shape {tuple(got[k].shape)} != {tuple(v.shape)}")
                v.copy_(got[k])
        capturable = self.optimizer.param_groups[0]["capturable"]
        for i, p in enumerate(self.params):
            saved = {k: sd[f"optim.{i}.{k}"] for k in OPTIM_STATE_KEYS if f"optim.{i}.{k}" in sd}
            if not saved:
                continue
            if set(saved) != set(OPTIM_STATE_KEYS):
                raise ValueError(f"learner state 'optim.{i}': has {sorted(saved)}, needs {OPTIM_STATE_KEYS}")
            state = self.optimizer.state[p]
            if state:
                for k in OPTIM_STATE_KEYS:
                    state[k].copy_(saved[k])
            else:
                # AdamW keeps `step` on the device only when capturable (float32 0-dim either way).
                step_device = p.device if capturable else torch.device("cpu")
                state["step"] = saved["step"].to(step_device, torch.float32).clone()
                state["exp_avg"] = saved["exp_avg"].to(p.device, p.dtype).clone()
                state["exp_avg_sq"] = saved["exp_avg_sq"].to(p.device, p.dtype).clone()
        self.controllers.load_state_dict(take("controllers"))
        self.kill.load_state_dict(take("kill"))
        self.update_step.copy_(sd["update_step"])
