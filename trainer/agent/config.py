"""AgentConfig: every knob of the Q-network, the C51 learner, the controllers and the kill criteria.

Validated when built (before any tensor exists): a bad value raises ValueError naming the field
and the value. Settings that fix tensor shapes (window, n_features, env_state_dim, branch_sizes,
encoder, d_model, d_state, d_conv, expand, n_layers, head_hidden, n_atoms) must come from the
checkpoint on resume.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

ENCODERS = ("mamba", "gru")
SCANS = ("fused", "parallel", "sequential")


@dataclass(frozen=True)
class AgentConfig:
    # --- observation -------------------------------------------------------------------------
    n_features: int
    """F: features per decision step in the observation window."""
    env_state_dim: int
    """S: floats of the env's own state per env (position, unrealised PnL, open orders, ...)."""
    window: int = 32
    """W: decision steps in the observation window (the encoder's sequence length)."""
    branch_sizes: tuple[int, ...] = (4, 3, 3, 3)
    """Actions per branch: direction {SHORT, HOLD, LONG, FLAT}, magnitude, order type, urgency."""

    # --- network -----------------------------------------------------------------------------
    encoder: str = "mamba"
    """Sequence encoder: 'mamba' (selective state space, pure PyTorch) or 'gru'."""
    d_model: int = 64
    """Width of the encoder's residual stream."""
    d_state: int = 16
    """N: state size per channel of the selective scan (mamba only)."""
    d_conv: int = 4
    """Kernel length of the causal depthwise convolution (mamba only)."""
    expand: int = 2
    """Inner width = expand * d_model (mamba only)."""
    scan: str = "fused"
    """Selective scan: 'fused' (one Triton kernel each way on CUDA, trainer/agent/scan_fused.py; 'sequential'
    elsewhere), 'parallel' (Hillis-Steele, log2 W rounds of elementwise ops) or 'sequential' (W dependent
    steps of a few small kernels; the fastest pure-PyTorch scan on CPU). Same result."""
    n_layers: int = 2
    """Stacked encoder blocks (mamba) or GRU layers."""
    head_hidden: int = 128
    """Hidden width of the torso and of each value/advantage stream."""

    # --- distributional RL -------------------------------------------------------------------
    n_atoms: int = 51
    """C51 atoms on the fixed support linspace(v_min, v_max, n_atoms)."""
    v_min: float = -10.0
    """Lowest return the support can represent (targets below are clipped onto it)."""
    v_max: float = 10.0
    """Highest return the support can represent."""
    gamma: float = 0.99
    """Per-step discount; the replay hands the learner gamma**n * (1 - done) already folded."""
    n_step: int = 3
    """n of the n-step return (used by the replay accumulator; recorded here for the fingerprint)."""

    # --- exploration -------------------------------------------------------------------------
    thompson_scale: float = 1.0
    """κ of training's Thompson sampling: each action scores E[Q] + κ·(z − E[Q]) for a return z drawn from its C51
    distribution (trainer/agent/act.py). 1 samples the return distribution itself; 0 is greedy."""
    thompson_scale_final: float = 1.0
    """κ after the anneal: κ moves linearly from `thompson_scale` to this over `thompson_anneal_updates`."""
    thompson_anneal_updates: int = 0
    """Gradient steps of the linear κ anneal (0: κ stays `thompson_scale`)."""
    branch_epsilon: float = 0.0
    """ε of the branches other than the direction (magnitude, order type, urgency) in training: with this
    probability, independently per env, branch and step, the branch takes a uniformly random valid action instead
    of its Thompson draw (trainer.agent.act.select_actions). The direction keeps its draws: κ-shrunk draws are close
    to greedy on the branches whose distributions hardly overlap, and ε explores those. 0 = off."""

    # --- auxiliary prediction ----------------------------------------------------------------
    aux_weight: float = 0.0
    """Weight of an auxiliary regression beside the C51 loss: a linear head on the encoder output predicts the mid
    change over the next `aux_horizon` decision rows of the training rows, standardised (trainer/agent/aux.py), and
    its squared error, weighted like the C51 loss, trains the encoder too. 0 = off: no head, the network and its
    checkpoint as without the option. docs/RESULTS.md §7 says why (a linear read of the features out-earns the agent)."""
    aux_horizon: int = 4
    """Decision rows ahead of the auxiliary target (>= 1); rows whose horizon runs past the training rows use the
    last training row (the held-out selection slice and the eval window are never read)."""
    train_min_hold_steps: int = 0
    """Train under the minimum holding time that deployment can apply (LoopConfig.min_hold_steps): while an env's trip
    has been open fewer than this many decisions, an action that would end it is sent as HOLD, both when acting
    (the Thompson-sampled behaviour) and in the double-DQN target (a* at x' as the rule would send it), so the values
    learned are those of a policy that keeps its positions that long (trainer.agent.act.hold_young). 0 or 1 = off.
    It does not change deployment: pass the same value as `--loop.min-hold-steps` to deploy what was trained
    (docs/RESULTS.md §13)."""

    mirror_augment: bool = False
    """Train on the reflected market too: every other item of each replay batch (the odd positions; prioritised
    sampling orders the batch at random, so this is half the batch drawn without a random number) is replaced by the
    same transition in the reflected market (every price p -> C - p, bids and asks swapped, as `mirror` reads it):
    its observation windows from the reflected inputs, its env states times trainer/sim ENV_REFLECTION, LONG and
    SHORT swapped in its action (trainer.agent.act.mirror_actions), its reward and discount unchanged (a long
    position in the reflected market earns what the short one earns in the observed market). Acting, the replay and
    deployment do not change. Needs no forecast column and no auxiliary head (neither has a reflection).
    docs/RESULTS.md §16 says why (the slice chose weights that the evaluation window found overfit)."""

    # --- deployment --------------------------------------------------------------------------
    mirror: bool = False
    """Deployed (greedy) decisions read the market twice, as observed and reflected (every price p -> C - p, bids and
    asks swapped: the directional features and the position change sign, trainer/features/compute.py
    `reflection_signs`, trainer/sim ENV_REFLECTION), and score each action by the mean of its E[Q] and its mirror's
    (LONG <-> SHORT) in the reflected market: a policy with no preferred direction of its own. Model selection and
    out-of-sample evaluation use it; training and exploration do not change. docs/RESULTS.md §8 says why (a
    direction bias learned from the training window's drift)."""

    # --- a linear forecast as an input -------------------------------------------------------
    forecast_lags: int = 0
    """> 0: one more input column, a ridge forecast of the standardised mid change over the next `forecast_horizon`
    rows from the last `forecast_lags` rows of every feature, fitted per fold on the training rows only (the
    selection slice and the eval window are never fitted on) and read causally (trainer/agent/forecast.py). The
    folds then add a `forecast_rule_max` baseline: the OFI rule on that column at full size. 0 = off (the inputs
    as without the option). docs/RESULTS.md §8 says why and what it did."""
    forecast_horizon: int = 4
    """Decision rows ahead of the forecast's target (>= 1)."""
    forecast_ridge: float = 1.0
    """λ of the forecast's ridge penalty on standardised inputs (> 0)."""

    # --- optimiser ---------------------------------------------------------------------------
    lr: float = 2.5e-4
    """Base AdamW learning rate; the controller scales it (warm-up, Q drift) every update."""
    weight_decay: float = 1e-4
    """AdamW decoupled weight decay."""
    adam_eps: float = 1e-5
    """AdamW epsilon (C51 losses are O(1) cross-entropies, so 1e-5 rather than 1e-8)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    tau: float = 0.005
    """Base Polyak rate of the target net (1 = hard copy each update, 0 = frozen)."""

    # --- controllers (the ISV bus) -----------------------------------------------------------
    clip_k: float = 3.0
    """Adaptive gradient clip = clip_k * slow EMA of the (clipped) gradient norm."""
    clip_init: float = 10.0
    """Clip used before any gradient norm has been seen."""
    clip_min: float = 0.1
    """Lower clamp of the adaptive clip."""
    clip_max: float = 100.0
    """Upper clamp of the adaptive clip."""
    grad_ema_fast: float = 0.1
    """EMA rate of the fast gradient-norm average (reset each fold: drives the fold warm-up)."""
    grad_ema_slow: float = 0.01
    """EMA rate of the slow gradient-norm average (persists across folds: sets the clip)."""
    stat_ema: float = 0.01
    """EMA rate of the Q-magnitude, Q-drift and reward-scale statistics."""
    drift_ref: float = 0.01
    """Relative Q change per update above which lr and tau are damped (ref / drift)."""
    drift_tau_floor: float = 0.1
    """Smallest fraction of the base tau the drift damping may apply."""
    drift_lr_floor: float = 0.25
    """Smallest fraction of the base lr the drift damping may apply."""

    # --- kill criteria -----------------------------------------------------------------------
    kill_window: int = 32
    """Per-log-interval mean-Q samples kept for the Q-drift test (median / MAD)."""
    kill_warmup_samples: int = 3
    """Q-drift cannot fire before this many earlier samples are in the window (>= 3)."""
    kill_mad_k: float = 4.0
    """Q-drift fires when |q - median| > kill_mad_k * max(MAD, kill_mad_floor); MAD is scaled by
    1.4826 to estimate σ, so 4 is a ~4σ outlier test."""
    kill_mad_floor: float = 0.05
    """Floor of the MAD in the Q-drift test (stops a flat, noise-free history from firing)."""
    kill_mad_floor_rel: float = 0.05
    """Relative floor of the MAD: max(kill_mad_floor, this * |median|). A kill is never retried, so
    at k = 4 Q must leave its recent level by > 20 % before noise estimates matter."""
    kill_q_floor: float = 1.0
    """Absolute floor of |q| below which Q-drift never fires."""
    kill_q_floor_return_mult: float = 10.0
    """Adaptive |q| floor = max(kill_q_floor, this * mean |n-step return| of the interval)."""
    kill_collapse_eps: float = 1e-8
    """A gradient norm below this counts as collapsed."""
    kill_collapse_updates: int = 200
    """Consecutive collapsed gradient norms that fire the gradient-collapse criterion."""
    kill_warmup_updates: int = 500
    """Gradient collapse cannot fire before this many updates."""

    def __post_init__(self) -> None:
        def bad(field: str, rule: str) -> ValueError:
            return ValueError(f"AgentConfig.{field}={getattr(self, field)!r}: {rule}")

        object.__setattr__(self, "branch_sizes", tuple(self.branch_sizes))
        for f in ("n_features", "env_state_dim", "window", "d_model", "d_state", "d_conv", "expand",
                  "n_layers", "head_hidden", "n_step", "batch_size", "kill_window",
                  "kill_collapse_updates"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(f, "must be an integer >= 1")
        if len(self.branch_sizes) < 1 or any(not isinstance(a, int) or a < 2 for a in self.branch_sizes):
            raise bad("branch_sizes", "must be a non-empty tuple of integers >= 2")
        if self.encoder not in ENCODERS:
            raise bad("encoder", f"must be one of {ENCODERS}")
        if self.scan not in SCANS:
            raise bad("scan", f"must be one of {SCANS}")
        if not isinstance(self.n_atoms, int) or self.n_atoms < 2:
            raise bad("n_atoms", "must be an integer >= 2")
        for f in ("v_min", "v_max", "gamma", "lr", "weight_decay", "adam_eps", "tau", "clip_k",
                  "clip_init", "clip_min", "clip_max", "grad_ema_fast", "grad_ema_slow", "stat_ema",
                  "drift_ref", "drift_tau_floor", "drift_lr_floor", "kill_mad_k", "kill_mad_floor",
                  "kill_mad_floor_rel", "kill_q_floor", "kill_q_floor_return_mult", "kill_collapse_eps"):
            if not math.isfinite(getattr(self, f)):
                raise bad(f, "must be finite")
        if not self.v_min < self.v_max:
            raise bad("v_max", f"must be > v_min={self.v_min}")
        if not 0.0 < self.gamma <= 1.0:
            raise bad("gamma", "must be in (0, 1]")
        for f in ("lr", "adam_eps", "clip_k", "clip_init", "clip_min", "drift_ref", "kill_mad_k",
                  "kill_mad_floor", "kill_collapse_eps"):
            if getattr(self, f) <= 0:
                raise bad(f, "must be > 0")
        for f in ("weight_decay", "kill_q_floor", "kill_q_floor_return_mult", "kill_mad_floor_rel"):
            if getattr(self, f) < 0:
                raise bad(f, "must be >= 0")
        for f in ("tau", "drift_tau_floor", "drift_lr_floor"):
            if not 0.0 <= getattr(self, f) <= 1.0:
                raise bad(f, "must be in [0, 1]")
        for f in ("grad_ema_fast", "grad_ema_slow", "stat_ema"):
            if not 0.0 < getattr(self, f) <= 1.0:
                raise bad(f, "must be in (0, 1]")
        if self.clip_max < self.clip_min:
            raise bad("clip_max", f"must be >= clip_min={self.clip_min}")
        for f in ("thompson_scale", "thompson_scale_final"):
            if not (math.isfinite(getattr(self, f)) and getattr(self, f) >= 0):
                raise bad(f, "must be finite and >= 0")
        if not (math.isfinite(self.aux_weight) and self.aux_weight >= 0):
            raise bad("aux_weight", "must be finite and >= 0")
        if not isinstance(self.aux_horizon, int) or isinstance(self.aux_horizon, bool) or self.aux_horizon < 1:
            raise bad("aux_horizon", "must be an integer >= 1")
        if (not isinstance(self.train_min_hold_steps, int) or isinstance(self.train_min_hold_steps, bool)
                or self.train_min_hold_steps < 0):
            raise bad("train_min_hold_steps", "must be an integer >= 0")
        for f, least in (("forecast_lags", 0), ("forecast_horizon", 1)):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise bad(f, f"must be an integer >= {least}")
        if not (math.isfinite(self.forecast_ridge) and self.forecast_ridge > 0):
            raise bad("forecast_ridge", "must be finite and > 0")
        if self.mirror and self.forecast_lags > 0:
            raise bad("mirror", "cannot be combined with forecast_lags > 0 (the forecast column has no reflection)")
        if self.mirror_augment and self.forecast_lags > 0:
            raise bad("mirror_augment", "cannot be combined with forecast_lags > 0 (the forecast column has no "
                                        "reflection)")
        if self.mirror_augment and self.aux_weight > 0:
            raise bad("mirror_augment", "cannot be combined with aux_weight > 0 (the auxiliary target is read by "
                                        "row, unreflected)")
        if not (math.isfinite(self.branch_epsilon) and 0.0 <= self.branch_epsilon <= 1.0):
            raise bad("branch_epsilon", "must be in [0, 1]")
        if not isinstance(self.thompson_anneal_updates, int) or self.thompson_anneal_updates < 0:
            raise bad("thompson_anneal_updates", "must be an integer >= 0")
        if self.kill_warmup_samples < 3:
            raise bad("kill_warmup_samples", "must be >= 3 (a median and MAD need three samples)")
        if self.kill_warmup_samples >= self.kill_window:
            raise bad("kill_warmup_samples", f"must be < kill_window={self.kill_window}")
        if not isinstance(self.kill_warmup_updates, int) or self.kill_warmup_updates < 0:
            raise bad("kill_warmup_updates", "must be an integer >= 0")

    @property
    def n_branches(self) -> int:
        return len(self.branch_sizes)

    @property
    def max_actions(self) -> int:
        """A_max: the padded action axis of the logits."""
        return max(self.branch_sizes)
