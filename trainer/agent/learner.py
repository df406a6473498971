"""Learner: online + target Q-networks, AdamW, controllers, kill monitor, and the C51 update.

One `update(batch) = apply(backward(batch))`, read top to bottom in those two methods:

    backward  1. double-DQN target at x': the online net picks a* = argmax E[Q] per branch, the target net
                 gives the distribution of a*                                    (two side streams)
              2. the online logits of the taken actions at x                     (with the autograd graph)
              3. loss: per-branch cross-entropy against the target projected through r + γⁿ z,
                 averaged over branches, weighted by the importance weights
              4. the gradient, into one flat buffer
    apply     5. adaptive clip   6. AdamW   7. Polyak target update   8. controller and kill-monitor statistics

The step (trainer/loop/step.py) calls the two halves itself, so that acting, which reads the online weights, can
run until AdamW. Everything stays on the device: no host syncs, no data-dependent shapes and no Python branching on
tensor values, so the whole update can be captured in a CUDA graph (AdamW runs fused with `capturable=True` and a
0-dim tensor lr on CUDA; gradients are views into one flat buffer that is overwritten in place, never set to None,
so their storage is stable across replays).
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from trainer.agent.act import hold_young, mirrored_greedy, select_actions, thompson_scale_at
from trainer.agent.c51 import project_distribution
from trainer.agent.config import AgentConfig
from trainer.agent.controllers import Controllers
from trainer.agent.kill import KillMonitor
from trainer.agent.network import QNetwork, expected_q
from trainer.agent.replay import Transitions
from trainer.streams import HIGH_PRIORITY, SideStream

OPTIM_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq")


class Loss(NamedTuple):
    """What `Learner.backward` leaves for `Learner.apply`, detached (the gradient itself is in `Learner.flat_grad`)."""
    loss: Tensor  # () importance-weighted mean cross-entropy
    per_item: Tensor  # (B,) cross-entropy per item, averaged over branches (the new priorities)
    taken: Tensor  # (B, nb, N) online logits of the taken actions
    return_n: Tensor  # (B,) n-step returns of the batch


class UpdateKernels(NamedTuple):
    """The tensor-only pieces of the update that `Learner.compile` puts through torch.compile ('all' or
    'autotune'); eager bound methods otherwise. The gradient copy, AdamW and Polyak are never in it."""
    greedy_actions: Callable[[Tensor, Tensor], Tensor]
    target_logits: Callable[[Tensor, Tensor], Tensor]
    taken_logits: Callable[[Tensor, Tensor, Tensor], Tensor]
    cross_entropy: Callable[..., tuple[Tensor, Tensor]]
    taken_logits_aux: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
    aux_loss: Callable[[Tensor, Tensor, Tensor], Tensor]
    clip_gradient: Callable[[], tuple[Tensor, Tensor, Tensor, Tensor]]
    statistics: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


class Learner:
    def __init__(self, net: QNetwork, cfg: AgentConfig, device: torch.device | str, adaptive: bool = True,
                 overlap: bool = True, time_scale_steps: float = 50.0):
        """`adaptive=False` freezes lr, clip and tau at cfg.lr, cfg.clip_init and cfg.tau. `overlap` runs the
        double-DQN target (two forwards at x') on a side CUDA stream, concurrently with the online forward at x
        (trainer/streams.py; same values, nothing on CPU). `time_scale_steps`: SimConfig's, to read a trip's age
        from the env state (AgentConfig.train_min_hold_steps)."""
        self.cfg = cfg
        self.time_scale_steps = float(time_scale_steps)
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
        # AgentConfig.aux_weight > 0: the auxiliary target per decision row (trainer/agent/aux.py), set by the caller
        self.aux_target: Tensor | None = None
        self.kernels = UpdateKernels(self._greedy_actions, self._target_logits, self._taken_logits,
                                     self._cross_entropy, self._taken_logits_aux, self._aux_loss,
                                     self._clip_gradient, self._statistics)

    # ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: Tensor, env_state: Tensor, explore: bool, flat_margin: Tensor | float = 0.0) -> Tensor:
        """Actions (B, n_branches) int64 from the online net (Thompson when `explore`, else greedy, FLAT's E[Q]
        raised by `flat_margin`: trainer.agent.act.flat_bonus)."""
        logits = self.online(obs, env_state)
        return select_actions(logits, self.online.support, self.online.action_mask, explore, self.thompson_scale(),
                              flat_margin, self.cfg.branch_epsilon if explore else 0.0)

    def act_mirrored(self, obs: Tensor, env_state: Tensor, obs_reflected: Tensor, env_reflected: Tensor,
                     flat_margin: Tensor | float = 0.0) -> Tensor:
        """Greedy actions (B, n_branches) of the mirrored policy (AgentConfig.mirror, trainer.agent.act.mirrored_greedy)
        from the observation and the same observation of the reflected market."""
        net = self.online
        return mirrored_greedy(net(obs, env_state), net(obs_reflected, env_reflected), net.support, net.action_mask,
                               flat_margin)

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

    def update(self, batch: Transitions) -> dict[str, Tensor]:
        """One gradient step: `apply(backward(batch))`. Returns 0-dim device tensors (loss, q_mean, grad_norm, lr,
        clip, tau, td_error_mean) and `priorities` (B,), the per-item cross-entropy for the replay."""
        return self.apply(self.backward(batch))

    def backward(self, batch: Transitions) -> Loss:
        """Steps 1-4 of the update: the double-DQN C51 loss of `batch` (obs, next_obs and weight set) and its
        gradient in `flat_grad`. Parameters are only read, so a caller may act with the online net concurrently
        (trainer/loop/step.py) until `apply`."""
        k = self.kernels
        # 1. Double-DQN target at x', with `overlap` on two side streams while 2 runs on this one.
        with self.side.fork():
            next_a = k.greedy_actions(batch.next_obs, batch.next_env_state)  # (B, nb) a* of the online net
        with self.side_target.fork():
            next_logits = k.target_logits(batch.next_obs, batch.next_env_state)  # (B, nb, A_max, N) target net
        # 2. The online logits of the taken actions at x, with their autograd graph (and the auxiliary prediction
        #    from the same encoding when AgentConfig.aux_weight > 0).
        aux = self.online.aux_head is not None
        if aux:
            if self.aux_target is None:
                raise ValueError("AgentConfig.aux_weight > 0 needs Learner.aux_target (trainer/agent/aux.py)")
            taken, aux_pred = k.taken_logits_aux(batch.obs, batch.env_state, batch.action)  # (B, nb, N), (B,)
        else:
            taken = k.taken_logits(batch.obs, batch.env_state, batch.action)  # (B, nb, N)
        self.side.join()
        self.side_target.join()
        # 3. Cross-entropy against the target distribution of a*, projected through r + γⁿ z.
        loss, per_item = k.cross_entropy(taken, next_logits, next_a, batch.return_n, batch.discount_n,
                                         batch.weight)  # (), (B,)
        # 4. The gradient lands in the flat buffer in one copy (a .backward() would add into each parameter's view:
        #    a zero_ and one kernel per tensor). Parameters the loss does not reach get zeros.
        objective = loss + k.aux_loss(aux_pred, self.aux_target[batch.row], batch.weight) if aux else loss
        grads = torch.autograd.grad(objective, self.params, materialize_grads=True)
        torch.cat([g.reshape(-1) for g in grads], out=self.flat_grad)
        return Loss(loss.detach(), per_item.detach(), taken.detach(), batch.return_n.detach())

    def apply(self, loss: Loss) -> dict[str, Tensor]:
        """Steps 5-8 of the update, on the gradient that `backward` left in `flat_grad`."""
        k = self.kernels
        # 5. Adaptive clip of flat_grad to the controller's clip (a non-finite gradient is zeroed).
        grad_norm, clip, lr, tau = k.clip_gradient()
        # 6. AdamW: one fused kernel on CUDA, reading the controller's lr on the device.
        self.optimizer.step()
        # 7. Polyak: θ_target ← (1 − τ) θ_target + τ θ_online.
        self.polyak_update(tau)
        # 8. The kill monitor and the controllers observe this update (they move lr, clip, tau for the next one).
        q_mean = k.statistics(loss.loss, grad_norm, loss.taken, loss.return_n)
        return {"loss": loss.loss, "q_mean": q_mean, "grad_norm": grad_norm, "lr": lr, "clip": clip, "tau": tau,
                "td_error_mean": loss.per_item.mean(), "priorities": loss.per_item}

    @torch.no_grad()
    def _greedy_actions(self, next_obs: Tensor, next_env_state: Tensor) -> Tensor:
        """Double DQN's selection: a* = argmax E[Q] of the online net at x', per branch, as the minimum holding time
        of training sends it (AgentConfig.train_min_hold_steps; none by default). (B, nb) int64."""
        next_q = expected_q(self.online(next_obs, next_env_state), self.online.support)  # (B, nb, A_max)
        a = next_q.masked_fill(~self.online.action_mask, float("-inf")).argmax(-1)
        return self.hold_young(a, next_env_state)

    def hold_young(self, actions: Tensor, env_state: Tensor) -> Tensor:
        """`actions` under AgentConfig.train_min_hold_steps (trainer.agent.act.hold_young); `actions` itself when off."""
        if self.cfg.train_min_hold_steps <= 1:
            return actions
        return hold_young(actions, env_state, self.cfg.train_min_hold_steps, self.time_scale_steps)

    @torch.no_grad()
    def _target_logits(self, next_obs: Tensor, next_env_state: Tensor) -> Tensor:
        """The target net's logits at x', (B, nb, A_max, N)."""
        return self.target(next_obs, next_env_state)

    def _taken_logits(self, obs: Tensor, env_state: Tensor, actions: Tensor) -> Tensor:
        """Online logits of the taken action per branch, (B, nb, N), with their graph for the backward."""
        return self._gather_taken(self.online(obs, env_state), actions)

    def _taken_logits_aux(self, obs: Tensor, env_state: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """`_taken_logits` and the auxiliary head's prediction (B,) from the same encoding, both with their graph."""
        z = self.online.encoder(obs)  # (B, d_model)
        return self._gather_taken(self.online.head(z, env_state), actions), self.online.aux_head(z).squeeze(-1)

    def _gather_taken(self, logits: Tensor, actions: Tensor) -> Tensor:
        """Logits (B, nb, A_max, N) at the taken actions (B, nb) -> (B, nb, N)."""
        idx = actions[..., None, None].expand(logits.shape[0], self.cfg.n_branches, 1, self.cfg.n_atoms)
        return logits.gather(2, idx).squeeze(2)

    def _aux_loss(self, pred: Tensor, target: Tensor, weights: Tensor) -> Tensor:
        """aux_weight × the importance-weighted mean squared error of the auxiliary prediction (0-dim)."""
        return self.cfg.aux_weight * (weights * (pred - target).square()).mean()

    def _target_distribution(self, next_logits: Tensor, next_a: Tensor, returns: Tensor,
                             discounts: Tensor) -> Tensor:
        """Double DQN per branch: the target net's distribution (logits (B, nb, A_max, N) at x') of the online
        net's a* (B, nb), projected through r + γⁿ z. Returns (B, nb, N) target masses."""
        batch_size, n_branches, _, n_atoms = next_logits.shape
        idx = next_a[..., None, None].expand(batch_size, n_branches, 1, n_atoms)
        next_probs = torch.softmax(next_logits.gather(2, idx).squeeze(2), dim=-1)  # (B, nb, N)
        return project_distribution(next_probs, returns[:, None].expand(-1, n_branches),
                                    discounts[:, None].expand(-1, n_branches), self.online.support)

    def _cross_entropy(self, taken: Tensor, next_logits: Tensor, next_a: Tensor, returns: Tensor,
                       discounts: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
        """Per-branch cross-entropy of the taken logits against the target masses (`_target_distribution`),
        averaged over branches, importance-weighted. Returns the loss (0-dim) and the per-item loss (B,)."""
        target = self._target_distribution(next_logits.detach(), next_a, returns, discounts)  # (B, nb, N)
        cross_entropy = -(target * F.log_softmax(taken, dim=-1)).sum(-1)  # (B, nb)
        per_item = cross_entropy.mean(-1)  # (B,) averaged over branches
        return (weights * per_item).mean(), per_item

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
    def _statistics(self, loss: Tensor, grad_norm: Tensor, taken: Tensor, returns: Tensor) -> Tensor:
        """Feed the kill monitor and the controllers (about a hundred 0-dim ops); returns the batch mean E[Q]."""
        q_mean = expected_q(taken, self.online.support).mean()
        return_abs = returns.abs().mean()
        self.kill.observe(loss, grad_norm, q_mean, return_abs)
        self.controllers.observe(grad_norm, q_mean, return_abs)
        self.update_step.add_(1)
        return q_mean

    def compile(self, compiled: Callable[[Callable], Callable]) -> None:
        """Put every piece of `kernels` through `compiled` (LoopConfig.compile='all' or 'autotune': the step's
        torch.compile with its options): the three forwards (online at x' for a*, target at x', online at x with
        its backward), the target projection with the loss, the clip, and the statistics, whose ~100 0-dim ops
        fuse into a few kernels. The gradient copy, AdamW (one fused kernel) and Polyak (two foreach kernels) stay
        eager. The methods themselves are left as they are."""
        self.kernels = UpdateKernels(*(compiled(fn) for fn in self.kernels))

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
