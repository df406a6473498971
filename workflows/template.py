"""The `alpha-rl` Argo WorkflowTemplate, written with Hera.

DAG: features (CPU pod; fxcache skip-if-exists) -> train-fold x folds (withSequence, in parallel) -> report,
or with fold_mode="chain" the folds one after another (train-fold-0 -> train-fold-1 -> ...), since a chain
fold warm-starts from the previous fold's final checkpoint. With seeds > 1 every fold also trains seed indices
1..seeds-1 (train-replica tasks), and with control the same runs on the signal=0 control market
(features-control -> control-fold...); all of them in parallel before the report (chains: one per seed and market).

Templates are module-level values built by the `*_template` functions; `build_workflow_template`
only wires them. The same builder functions make the test templates (a `python -c` command with
chosen exit codes instead of the trainer), so the local runner is exercised on exactly the
structure the cluster gets.

Regenerate the committed YAML (never done by CI; a test fails while it differs):

    python -m workflows.template --write        # -> infra/k8s/argo/alpha-rl-template.yaml (independent)
                                                #    alpha-rl-chain-3-template.yaml (chain, 3 folds)
                                                #    alpha-rl-seeds2-control-template.yaml (2 seeds + control)
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence as Seq

import yaml
from hera.workflows import DAG, Container, Parameter, RetryStrategy, Task, WorkflowTemplate
from hera.workflows import models as m

from trainer.fsutil import atomic_write_text

__all__ = [
    "TemplateConfig",
    "DEFAULTS",
    "RETRY_EXPRESSION",
    "PARAMETER_DEFAULTS",
    "features_template",
    "train_fold_template",
    "train_replica_template",
    "features_control_template",
    "report_template",
    "build_workflow_template",
    "render",
    "render_yaml",
    "RENDERED_PATH",
    "RENDERED_CHAIN_PATH",
    "CHAIN_EXAMPLE_FOLDS",
    "FOLD_MODES",
    "template_name",
    "FEATURES",
    "TRAIN_FOLD",
    "REPORT",
    "RENDERED_SEEDS_CONTROL_PATH",
    "SEEDS_EXAMPLE",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
RENDERED_PATH = REPO_ROOT / "infra" / "k8s" / "argo" / "alpha-rl-template.yaml"
CHAIN_EXAMPLE_FOLDS = 3
"""Folds of the committed chain-shape YAML (submit renders the chain shape for the --folds it is given)."""
RENDERED_CHAIN_PATH = REPO_ROOT / "infra" / "k8s" / "argo" / f"alpha-rl-chain-{CHAIN_EXAMPLE_FOLDS}-template.yaml"
SEEDS_EXAMPLE = 2
"""Seeds of the committed multi-seed + control YAML (submit renders the shape for the --seeds it is given)."""
RENDERED_SEEDS_CONTROL_PATH = RENDERED_PATH.parent / f"alpha-rl-seeds{SEEDS_EXAMPLE}-control-template.yaml"
CONTROL_DATA_DEFAULT = "synthetic:signal=0"
"""Default of the `control-data` parameter (control shapes only): trainer.data.spec.control_spec('synthetic');
submit always sets it to control_spec(--data)."""

# Retry decision, evaluated by Argo (and by workflows.expr in the local runner) after a failed attempt.
# Never retry exit 2 (bad usage/config/data) or 3 (kill criterion): a rerun can only fail the same way.
# Retry the pod-level losses (status Error: pod deleted, evicted, node shutdown — these often carry no
# exit code, which Argo reports as "-1"), OOM kills (137, reason OOMKilled) and SIGTERM-after-checkpoint
# (143) by name, and — per the process contract — any other failed exit of the main container.
RETRY_EXPRESSION = (
    "!(lastRetry.exitCode in ['2', '3']) && ("
    "lastRetry.status == 'Error'"
    " || lastRetry.exitCode in ['137', '143']"
    " || lastRetry.message matches '(?i)OOMKilled|pod deleted|evict|node shutdown|shutting down'"
    " || lastRetry.status == 'Failed')"
)

# Workflow parameters and their defaults (git-sha is required: no default). "" means "the preset decides":
# workflows.launch drops a `--flag ""` pair, so the trainer's preset (trainer/settings.py) supplies the value
# instead of a copy of it here that a preset change would silently override.
PARAMETER_DEFAULTS: dict[str, str | None] = {
    "git-sha": None,
    "image": "ghcr.io/alpha-rl/alpha-rl-trainer:latest",
    "folds": "3",
    "n-steps": "",
    "n-backtests": "",
    "per-capacity": "",
    "compile": "",
    "preset": "h100",
    "seed": "",
    "device": "cuda",
    "fold-mode": "independent",
    "train-window": "",
    "data": "synthetic",
    "pvc": "alpha-rl-runs",
    "gpu-pool": "ci-training-h100",
    "pool-label-key": "cloud.google.com/gke-nodepool",
}


def _p(name: str) -> str:
    return "{{workflow.parameters.%s}}" % name


@dataclass(frozen=True)
class TemplateConfig:
    """Build-time settings of the WorkflowTemplate (run-time knobs are workflow parameters instead)."""

    name: str = "alpha-rl"
    """metadata.name of the WorkflowTemplate; workflows reference it by this name."""
    mount_path: str = "/mnt/alpha-rl"
    """Where the PVC is mounted in every container; run dirs are <mount>/<git-sha>/fold<N>."""
    service_account: str = "alpha-rl"
    """serviceAccountName of every pod (RBAC in infra/k8s/rbac.yaml)."""
    train_memory: str = "96Gi"
    """Train pod memory request = limit (Guaranteed QoS: the OOM killer picks it last on a node)."""
    train_cpu: str = "8"
    """Train pod CPU request."""
    cpu_memory: str = "8Gi"
    """Features and report pods: memory request = limit."""
    cpu_cpu: str = "2"
    """Features and report pods: CPU request."""
    shm_size: str = "16Gi"
    """sizeLimit of the memory-backed /dev/shm emptyDir (PyTorch data workers use shared memory)."""
    tmp_size: str = "20Gi"
    """sizeLimit of the writable /tmp emptyDir (the root filesystem is read-only)."""
    retry_limit: int = 5
    """Retries per task after the first attempt (total attempts = limit + 1)."""
    backoff_duration: str = "30s"
    """First backoff wait; Argo duration string ("30s", "2m")."""
    backoff_factor: int = 2
    """Multiplier of the wait after each failed attempt."""
    backoff_cap: str = "10m"
    """Largest single backoff wait."""
    backoff_max_duration: str = "2h"
    """No retry is started once this long has passed since the task's first attempt."""
    train_deadline_s: int = 6 * 3600
    """activeDeadlineSeconds of one train attempt (a retry gets a fresh deadline)."""
    cpu_deadline_s: int = 2 * 3600
    """activeDeadlineSeconds of one features or report attempt."""
    workflow_deadline_s: int = 48 * 3600
    """activeDeadlineSeconds of the whole workflow, retries included."""
    termination_grace_s: int = 120
    """terminationGracePeriodSeconds: time between SIGTERM and SIGKILL for the trainer to checkpoint."""
    run_as_user: int = 1000
    """Non-root uid of every container (matches the image's user)."""

    def __post_init__(self) -> None:
        for name in ("retry_limit", "backoff_factor"):
            if getattr(self, name) < 0:
                raise ValueError(f"TemplateConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("train_deadline_s", "cpu_deadline_s", "workflow_deadline_s", "termination_grace_s", "run_as_user"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TemplateConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if not self.mount_path.startswith("/") or self.mount_path.rstrip("/") in ("", "/tmp", "/dev/shm"):
            raise ValueError(f"TemplateConfig.mount_path must be an absolute dedicated path, got {self.mount_path!r}")
        if not self.name or self.name != self.name.lower():
            raise ValueError(f"TemplateConfig.name must be a lower-case DNS name, got {self.name!r}")


DEFAULTS = TemplateConfig()


# ---- shared pod hardening -------------------------------------------------------------------------


def _container_security(cfg: TemplateConfig) -> m.SecurityContext:
    return m.SecurityContext(
        run_as_non_root=True,
        run_as_user=cfg.run_as_user,
        run_as_group=cfg.run_as_user,
        allow_privilege_escalation=False,
        read_only_root_filesystem=True,
        privileged=False,
        capabilities=m.Capabilities(drop=["ALL"]),
        seccomp_profile=m.SeccompProfile(type="RuntimeDefault"),
    )


def _pod_security(cfg: TemplateConfig) -> m.PodSecurityContext:
    # fsGroup makes the PVC writable by the non-root uid on volume types that honour it.
    return m.PodSecurityContext(
        run_as_non_root=True, run_as_user=cfg.run_as_user, run_as_group=cfg.run_as_user, fs_group=cfg.run_as_user
    )


def _volumes(cfg: TemplateConfig) -> list[m.Volume]:
    return [
        m.Volume(name="runs", persistent_volume_claim=m.PersistentVolumeClaimVolumeSource(claim_name=_p("pvc"))),
        m.Volume(name="tmp", empty_dir=m.EmptyDirVolumeSource(size_limit=cfg.tmp_size)),
        m.Volume(name="dshm", empty_dir=m.EmptyDirVolumeSource(medium="Memory", size_limit=cfg.shm_size)),
    ]


def _mounts(cfg: TemplateConfig) -> list[m.VolumeMount]:
    # Explicit per-container mounts: Hera does not carry workflow-level volumes into containers.
    return [
        m.VolumeMount(name="runs", mount_path=cfg.mount_path),
        m.VolumeMount(name="tmp", mount_path="/tmp"),
        m.VolumeMount(name="dshm", mount_path="/dev/shm"),
    ]


def _env() -> list[m.EnvVar]:
    # Caches that default to $HOME (read-only root fs) go to the writable /tmp.
    return [
        m.EnvVar(name="HOME", value="/tmp"),
        m.EnvVar(name="XDG_CACHE_HOME", value="/tmp/.cache"),
        m.EnvVar(name="MPLCONFIGDIR", value="/tmp/.matplotlib"),
        m.EnvVar(name="PYTHONUNBUFFERED", value="1"),
    ]


def _retry(cfg: TemplateConfig) -> RetryStrategy:
    return RetryStrategy(
        limit=cfg.retry_limit,
        retry_policy="Always",
        expression=RETRY_EXPRESSION,
        backoff=m.Backoff(
            duration=cfg.backoff_duration,
            factor=m.IntOrString(root=cfg.backoff_factor),
            cap=cfg.backoff_cap,
            max_duration=cfg.backoff_max_duration,
        ),
    )


def _grace_patch(cfg: TemplateConfig) -> str:
    return json.dumps({"terminationGracePeriodSeconds": cfg.termination_grace_s})


def _cpu_resources(cfg: TemplateConfig) -> m.ResourceRequirements:
    return m.ResourceRequirements(
        requests={"cpu": m.Quantity(root=cfg.cpu_cpu), "memory": m.Quantity(root=cfg.cpu_memory)},
        limits={"memory": m.Quantity(root=cfg.cpu_memory)},
    )


def _pod(cfg: TemplateConfig, name: str, command: list[str], args: list[str], *, deadline_s: int,
         resources: m.ResourceRequirements, env: Seq[m.EnvVar] = (), **extra) -> Container:
    """A Container template with the pod defaults every alpha-rl pod shares, set here once: image, env, mounts,
    hardening, service account, retry strategy and the SIGTERM grace period. `extra` adds the template's own
    fields (inputs, nodeSelector, tolerations, synchronization); it cannot replace a shared default."""
    shared = set(extra) & {"image", "image_pull_policy", "volume_mounts", "security_context", "pod_security_context",
                           "service_account_name", "retry_strategy", "pod_spec_patch"}
    if shared:
        raise ValueError(f"template {name!r}: {sorted(shared)} are pod defaults set once in _pod, not per template")
    return Container(
        name=name,
        image=_p("image"),
        image_pull_policy="IfNotPresent",
        command=command,
        args=args,
        env=[*_env(), *env],
        resources=resources,
        volume_mounts=_mounts(cfg),
        security_context=_container_security(cfg),
        pod_security_context=_pod_security(cfg),
        service_account_name=cfg.service_account,
        active_deadline_seconds=deadline_s,
        retry_strategy=_retry(cfg),
        pod_spec_patch=_grace_patch(cfg),
        **extra,
    )


# ---- templates -------------------------------------------------------------------------------------


def features_template(
    cfg: TemplateConfig = DEFAULTS, command: Seq[str] | None = None, args: Seq[str] | None = None
) -> Container:
    """CPU pod: build the feature cache under <mount>/fxcache (the trainer skips it if present)."""
    return _features_pod(cfg, "features", "data", command, args)


def _features_pod(cfg: TemplateConfig, name: str, data_param: str, command: Seq[str] | None,
                  args: Seq[str] | None) -> Container:
    """A CPU pod running `python -m trainer.features` on the workflow parameter `data_param` into <mount>/fxcache."""
    default_args = ["--data", _p(data_param), "--cache-dir", f"{cfg.mount_path}/fxcache"]
    return _pod(
        cfg, name,
        command=list(command or ["python", "-m", "trainer.features"]),
        args=list(args if args is not None else default_args),
        deadline_s=cfg.cpu_deadline_s,
        resources=_cpu_resources(cfg),
    )  # fmt: skip


def _train_args(cfg: TemplateConfig, run_dir: str, fold: str, data: str, extra: Seq[str] = (),
                replica: Seq[str] = ()) -> list[str]:
    """The trainer's command line for `workflows.launch` (which logs the attempt, drops flags whose value is "", so a
    preset's own n-steps stands when none is given, and execs `python -m trainer.train` in its place)."""
    return [
        "trainer.train",
        "--run-dir", run_dir,
        "--fold", fold,
        "--folds", _p("folds"),
        "--data", data,
        "--fxcache", f"{cfg.mount_path}/fxcache",
        *extra,
        "--preset", _p("preset"),
        "--n-steps", _p("n-steps"),
        "--n-envs", _p("n-backtests"),
        "--per-capacity", _p("per-capacity"),
        "--compile", _p("compile"),
        "--seed", _p("seed"),
        *replica,
        "--device", _p("device"),
        "--fold-mode", _p("fold-mode"),
        "--folds.train-window", _p("train-window"),
        "--attempt", "{{retries}}",
    ]  # fmt: skip


def _train_pod(cfg: TemplateConfig, name: str, command: Seq[str] | None, args: Seq[str], fold_dir: str,
               inputs: Seq[str], mutex: str) -> Container:
    """The GPU pod both train templates are: one GPU and the train memory (request = limit, so a pod that outgrows it
    is OOM-killed, not evicted), the GPU pool, the fold dir and attempt in the environment, one mutex per fold."""
    return _pod(
        cfg, name,
        command=list(command or ["python", "-m", "workflows.launch"]),
        args=list(args),
        deadline_s=cfg.train_deadline_s,
        resources=m.ResourceRequirements(
            requests={
                "cpu": m.Quantity(root=cfg.train_cpu),
                "memory": m.Quantity(root=cfg.train_memory),
                "nvidia.com/gpu": m.Quantity(root="1"),
            },
            limits={"memory": m.Quantity(root=cfg.train_memory), "nvidia.com/gpu": m.Quantity(root="1")},
        ),
        env=[
            m.EnvVar(name="ALPHA_RL_FOLD_DIR", value=fold_dir),
            m.EnvVar(name="ALPHA_RL_ATTEMPT", value="{{retries}}"),
        ],
        inputs=[Parameter(name=n) for n in inputs],
        node_selector={_p("pool-label-key"): _p("gpu-pool")},
        tolerations=[m.Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        synchronization=m.Synchronization(mutexes=[m.Mutex(name=mutex)]),
    )  # fmt: skip


def train_fold_template(
    cfg: TemplateConfig = DEFAULTS, command: Seq[str] | None = None, args: Seq[str] | None = None
) -> Container:
    """GPU pod: train fold `{{inputs.parameters.fold}}`, resuming from its own checkpoints on retry.

    The run dir depends only on the git sha and the fold — never a pod or workflow name — so every
    retry and every resubmission of the same commit finds the checkpoints already written.
    """
    run_dir, fold = f"{cfg.mount_path}/{_p('git-sha')}", "{{inputs.parameters.fold}}"
    default_args = _train_args(cfg, run_dir, fold, _p("data"))
    return _train_pod(cfg, "train-fold", command, args if args is not None else default_args,
                      fold_dir=f"{run_dir}/fold{fold}", inputs=["fold"],
                      mutex=f"alpha-rl-{_p('git-sha')}-fold{fold}")


def report_template(
    cfg: TemplateConfig = DEFAULTS, command: Seq[str] | None = None, args: Seq[str] | None = None
) -> Container:
    """CPU pod: cross-fold summary.json, report.md and plots under <mount>/<git-sha>."""
    return _pod(
        cfg, "report",
        command=list(command or ["python", "-m", "trainer.report"]),
        args=list(args if args is not None else ["--run-dir", f"{cfg.mount_path}/{_p('git-sha')}"]),
        deadline_s=cfg.cpu_deadline_s,
        resources=_cpu_resources(cfg),
    )  # fmt: skip


def features_control_template(
    cfg: TemplateConfig = DEFAULTS, command: Seq[str] | None = None, args: Seq[str] | None = None
) -> Container:
    """CPU pod: the control market's feature cache (`control-data`, the signal=0 spec), beside the main one."""
    return _features_pod(cfg, "features-control", "control-data", command, args)


# Inputs of a train-replica task, all set by the DAG: the seed index, the market's run dir and data spec, and the
# fold dir and mutex suffix they imply (trainer/folds/layout.py), so the pod spec needs no conditionals.
REPLICA_INPUTS = ("fold", "replica", "run-dir", "data", "fold-dir", "unit")


def train_replica_template(
    cfg: TemplateConfig = DEFAULTS, command: Seq[str] | None = None, args: Seq[str] | None = None
) -> Container:
    """GPU pod: seed index `replica` of fold `fold` on the market `data`, under `run-dir` (<sha> or <sha>/control).

    The same pod as train-fold (resources, pool, retries, deadline); only the run dir, the data spec, `--replica`
    and the mutex come from its inputs. Seed index 0 of the main market stays on train-fold, so a one-seed run's
    template, paths and mutex names are unchanged. Every market and seed shares <mount>/fxcache and
    <mount>/inductor-cache (the control's run dir is one level deeper, so the trainer's RUN/../ default would not).
    """
    inp = "{{inputs.parameters.%s}}".__mod__
    default_args = _train_args(cfg, inp("run-dir"), inp("fold"), inp("data"),
                               extra=["--compile-cache", f"{cfg.mount_path}/inductor-cache"],
                               replica=["--replica", inp("replica")])
    return _train_pod(cfg, "train-replica", command, args if args is not None else default_args,
                      fold_dir=inp("fold-dir"), inputs=REPLICA_INPUTS, mutex=f"alpha-rl-{_p('git-sha')}-{inp('unit')}")


FEATURES = features_template()
TRAIN_FOLD = train_fold_template()
REPORT = report_template()
FEATURES_CONTROL = features_control_template()
TRAIN_REPLICA = train_replica_template()


FOLD_MODES = ("independent", "chain")
"""The trainer's --fold-mode choices; each has its own DAG shape (see build_workflow_template)."""


def template_name(cfg: TemplateConfig = DEFAULTS, fold_mode: str = "independent", folds: int | None = None,
                  seeds: int = 1, control: bool = False) -> str:
    """metadata.name of the WorkflowTemplate of this shape: `alpha-rl` or `alpha-rl-chain-<folds>`, then
    `-seeds<N>` for N > 1 seeds and `-control` with the control market.

    Each shape has its own name, so submitting a chain run (or a multi-seed run) never rewrites the template that
    other runs are still being created from; one seed without control keeps the name `alpha-rl`."""
    if fold_mode not in FOLD_MODES:
        raise ValueError(f"fold_mode must be one of {FOLD_MODES}, got {fold_mode!r}")
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    if not isinstance(control, bool):
        raise ValueError(f"control must be a bool, got {control!r}")
    suffix = (f"-seeds{seeds}" if seeds > 1 else "") + ("-control" if control else "")
    if fold_mode == "independent":
        return cfg.name + suffix
    if not isinstance(folds, int) or isinstance(folds, bool) or folds < 1:
        raise ValueError(f"folds must be an integer >= 1 for the chain shape (its tasks are listed), got {folds!r}")
    return f"{cfg.name}-chain-{folds}{suffix}"


def _arguments(fold_mode: str, folds: int | None, control: bool = False) -> list[Parameter]:
    # `enum` pins the parameters a shape was built for: Argo refuses a Workflow that sets fold-mode (or, for the
    # chain shape, folds) to anything else, so fold 1 can never start in parallel with fold 0 in chain mode.
    pinned = {"fold-mode": [fold_mode]} | ({"folds": [str(folds)]} if fold_mode == "chain" else {})
    out = []
    for k, v in PARAMETER_DEFAULTS.items():
        if k in pinned:
            out.append(Parameter(name=k, value=pinned[k][0], enum=pinned[k]))
        else:
            out.append(Parameter(name=k) if v is None else Parameter(name=k, value=v))
        if k == "data" and control:
            out.append(Parameter(name="control-data", value=CONTROL_DATA_DEFAULT))
    return out


def build_workflow_template(
    cfg: TemplateConfig = DEFAULTS,
    features: Container | None = None,
    train_fold: Container | None = None,
    report: Container | None = None,
    fold_mode: str = "independent",
    folds: int | None = None,
    seeds: int = 1,
    control: bool = False,
    train_replica: Container | None = None,
    features_control: Container | None = None,
) -> WorkflowTemplate:
    """Wire the templates into the `main` DAG. Defaults: the module-level templates.

    The DAG shape follows `fold_mode`, chosen when the template is rendered (submit renders it per run):
    independent: features -> train-fold x folds (withSequence, in parallel) -> report;
    chain:       features -> train-fold-0 -> train-fold-1 -> ... -> train-fold-<folds-1> -> report, because
                 fold i warm-starts from fold i-1's final checkpoint and must not start before it succeeded.
    `seeds` > 1 adds seed indices S = 1..seeds-1 of every fold (train-replica tasks `train-fold-seed<S>`, or in
    chain mode their own chains `train-fold-<i>-seed<S>`), writing <sha>/fold<N>/seed<S>; `control` adds the
    control market (features-control, then `control-fold[-seed<S>]` tasks writing <sha>/control/fold<N>[/seed<S>]).
    Every train task is a DAG sibling of the others (chains are sequential only within one seed of one market), and
    the report waits for all of them. seeds=1, control=False is exactly the one-seed shape.
    """
    name = template_name(cfg, fold_mode, folds, seeds, control)
    features = features or (FEATURES if cfg is DEFAULTS else features_template(cfg))
    train_fold = train_fold or (TRAIN_FOLD if cfg is DEFAULTS else train_fold_template(cfg))
    report = report or (REPORT if cfg is DEFAULTS else report_template(cfg))
    extra = seeds > 1 or control
    if extra:
        train_replica = train_replica or (TRAIN_REPLICA if cfg is DEFAULTS else train_replica_template(cfg))
    if control:
        features_control = features_control or (
            FEATURES_CONTROL if cfg is DEFAULTS else features_control_template(cfg))

    t_features = Task(name="features", template=features)
    t_report = Task(name="report", template=report)
    run_dir = f"{cfg.mount_path}/{_p('git-sha')}"
    markets = [("train-fold", "fold", run_dir, _p("data"), t_features)]
    tasks = [t_features]
    if control:
        t_features_control = Task(name="features-control", template=features_control)
        tasks.append(t_features_control)
        markets.append(("control-fold", "control-fold", f"{run_dir}/control", _p("control-data"), t_features_control))

    def train_task(prefix: str, unit: str, market_dir: str, data: str, replica: int, fold: str, **kw) -> Task:
        # fold: "{{item}}" (withSequence) or the chain's literal index; seed index 0 of the main market is train-fold
        if prefix == "train-fold" and replica == 0:
            return Task(template=train_fold, arguments={"fold": fold}, **kw)
        seed_dir, seed_unit = (f"/seed{replica}", f"-seed{replica}") if replica else ("", "")
        return Task(template=train_replica, arguments={
            "fold": fold, "replica": str(replica), "run-dir": market_dir, "data": data,
            "fold-dir": f"{market_dir}/fold{fold}{seed_dir}", "unit": f"{unit}{fold}{seed_unit}"}, **kw)

    lasts = []  # the task(s) the report depends on
    for prefix, unit, market_dir, data, t_feat in markets:
        for replica in range(seeds):
            seed_name = f"-seed{replica}" if replica else ""
            if fold_mode == "chain":
                assert folds is not None  # template_name checked it
                chain = t_feat
                for i in range(folds):
                    t = train_task(prefix, unit, market_dir, data, replica, str(i), name=f"{prefix}-{i}{seed_name}")
                    tasks.append(t)
                    chain = chain >> t
                lasts.append(chain)
            else:
                t = train_task(prefix, unit, market_dir, data, replica, "{{item}}", name=f"{prefix}{seed_name}",
                               with_sequence=m.Sequence(count=_p("folds")))
                tasks.append(t)
                t_feat >> t
                lasts.append(t)
    for t in lasts:
        t >> t_report
    tasks.append(t_report)
    main = DAG(name="main", tasks=tasks)

    return WorkflowTemplate(
        name=name,
        labels={"app.kubernetes.io/name": "alpha-rl", "alpha-rl/fold-mode": fold_mode},
        entrypoint="main",
        arguments=_arguments(fold_mode, folds, control),
        service_account_name=cfg.service_account,
        active_deadline_seconds=cfg.workflow_deadline_s,
        # Successful pods go; failed attempts stay so `kubectl logs` still shows why they failed.
        pod_gc=m.PodGC(strategy="OnPodSuccess"),
        volumes=_volumes(cfg),
        templates=[main, features, *([features_control] if control else []), train_fold,
                   *([train_replica] if extra else []), report],
    )


def render(cfg: TemplateConfig = DEFAULTS, fold_mode: str = "independent", folds: int | None = None,
           seeds: int = 1, control: bool = False, **templates: Container) -> dict:
    """The WorkflowTemplate of this shape as a plain dict (what is applied to the cluster)."""
    return build_workflow_template(cfg, fold_mode=fold_mode, folds=folds, seeds=seeds, control=control,
                                   **templates).to_dict()


def render_yaml(cfg: TemplateConfig = DEFAULTS, fold_mode: str = "independent", folds: int | None = None,
                seeds: int = 1, control: bool = False) -> str:
    header = "# Rendered from workflows/template.py by `python -m workflows.template --write`. Do not edit.\n"
    body = render(cfg, fold_mode, folds, seeds, control)
    return header + yaml.safe_dump(body, sort_keys=True, default_flow_style=False, width=120)


def write_rendered(path: Path = RENDERED_PATH, fold_mode: str = "independent", folds: int | None = None,
                   seeds: int = 1, control: bool = False) -> Path:
    """Write the rendered YAML of one shape atomically (temp name, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_yaml(DEFAULTS, fold_mode, folds, seeds, control))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workflows.template", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {RENDERED_PATH.relative_to(REPO_ROOT)}")
    ns = ap.parse_args(argv)
    if ns.write:
        print(write_rendered())
        print(write_rendered(RENDERED_CHAIN_PATH, "chain", CHAIN_EXAMPLE_FOLDS))
        print(write_rendered(RENDERED_SEEDS_CONTROL_PATH, seeds=SEEDS_EXAMPLE, control=True))
    else:
        sys.stdout.write(render_yaml())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
