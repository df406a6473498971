"""Submit the alpha-rl DAG to Argo, print it, or run it on this machine.

    python -m workflows.submit --folds 3                  # cluster: upsert template, create Workflow
    python -m workflows.submit --folds 3 --follow         # ... and stream every pod's logs
    python -m workflows.submit --folds 3 --dry-run        # print WorkflowTemplate + Workflow YAML
    python -m workflows.submit --folds 3 --local          # same DAG here, PVC -> ./runs

Exit codes: 0 submitted / local run succeeded; 2 bad usage, dirty tree, or no cluster configured
(no kubeconfig and not in a pod: a configuration problem, retrying cannot help); 1 cluster
unreachable, Argo CRDs missing, API errors, or the workflow (local or followed) failed;
a local run whose failing task exited 2 or 3 exits with that code.
"""
from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from trainer.errors import exit_code_for
from trainer.settings import (  # torch-free: submitting loads no torch
    COMPILE_CHOICES, DEVICES, FOLD_MODES, PRESET_NAMES, TRAIN_WINDOWS,
)
from workflows.template import DEFAULTS, PARAMETER_DEFAULTS, REPO_ROOT, render

__all__ = ["ClusterError", "resolve_sha", "workflow_parameters", "seeds_and_control", "build_workflow", "main"]

GROUP, VERSION = "argoproj.io", "v1alpha1"
DEFAULT_REGISTRY = "ghcr.io/alpha-rl"
_SHA = re.compile(r"[0-9a-f]{7,40}")


class ClusterError(RuntimeError):
    """No usable cluster / Argo API; `code` is the process exit code to use."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


# ---- inputs --------------------------------------------------------------------------------------


def resolve_sha(repo: Path, sha: str | None, allow_dirty: bool) -> str:
    """The commit to run: `sha` if given, else git HEAD of `repo`, refusing a dirty tree unless allowed.

    Results land under <root>/<sha>/, so running uncommitted code under HEAD's sha would mix results
    of different code in one run folder; --allow-dirty says the user accepts that.
    """
    if sha is not None:
        if not _SHA.fullmatch(sha):
            raise ValueError(f"--sha must be 7-40 lower-case hex digits, got {sha!r}")
        return sha
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ValueError(f"{repo}: cannot read git HEAD ({exc}); pass --sha") from None
    if status.stdout.strip() and not allow_dirty:
        changed = ", ".join(line[3:] for line in status.stdout.splitlines()[:5])
        raise ValueError(f"{repo}: working tree has uncommitted changes ({changed}); commit them or pass --allow-dirty")
    return head.stdout.strip()


def workflow_parameters(ns: argparse.Namespace, sha: str) -> dict[str, str]:
    """Workflow parameters from the CLI; only those given. The template supplies the others, and its "" defaults
    (n-steps, n-backtests, per-capacity, compile, seed) leave them to the trainer's preset."""
    params: dict[str, str] = {"git-sha": sha, "folds": str(ns.folds)}
    params["image"] = ns.image or f"{ns.registry}/alpha-rl-trainer:{sha}"
    for key, attr in (
        ("preset", "preset"), ("n-steps", "n_steps"), ("n-backtests", "n_backtests"), ("per-capacity", "per_capacity"),
        ("data", "data"), ("compile", "compile"), ("fold-mode", "fold_mode"), ("train-window", "train_window"),
        ("seed", "seed"), ("device", "device"), ("gpu-pool", "gpu_pool"), ("pvc", "pvc"),
    ):  # fmt: skip
        if getattr(ns, attr) is not None:
            params[key] = str(getattr(ns, attr))
    unknown = set(params) - set(PARAMETER_DEFAULTS)
    if unknown:
        raise RuntimeError(f"parameters {sorted(unknown)} are not declared by the template")
    return params


def seeds_and_control(ns: argparse.Namespace, params: dict[str, str]) -> tuple[int, bool, dict[str, str], str]:
    """(seeds, control, extra workflow parameters, a log line) for --seeds and --control/--no-control.

    The control market (leakage guard, issue 21) is the same synthetic spec with signal=0: on by default for
    synthetic data, off for real data, which has no signal knob (docs/orchestration.md says why there is no
    automatic real-data control); --control on real data is bad usage (ValueError, exit 2).
    """
    from trainer.data.spec import control_spec

    if ns.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {ns.seeds}")
    data = params.get("data", PARAMETER_DEFAULTS["data"])
    spec = control_spec(data)  # InputError (exit 2) for a malformed --data
    if ns.control and spec is None:
        raise ValueError(f"--control: data {data!r} is not synthetic, and real data has no automatic control "
                         "market (docs/orchestration.md); use --no-control")
    control = spec is not None if ns.control is None else ns.control
    why = "given" if ns.control is not None else ("default for synthetic data" if control else "default for real data")
    note = f"seeds: {ns.seeds}; control market: {f'on, {spec}' if control else 'off'} ({why})"
    return ns.seeds, control, ({"control-data": spec} if control else {}), note


def build_workflow(params: dict[str, str], namespace: str, template_name: str = DEFAULTS.name) -> dict:
    """The Workflow object submit creates: a workflowTemplateRef plus the given parameters."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workflow",
        "metadata": {
            "generateName": "alpha-rl-",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "alpha-rl", "alpha-rl/git-sha": params["git-sha"]},
        },
        "spec": {
            "workflowTemplateRef": {"name": template_name},
            "arguments": {"parameters": [{"name": k, "value": v} for k, v in params.items()]},
        },
    }


# ---- cluster -------------------------------------------------------------------------------------


def _load_cluster() -> Any:
    """An ApiClient from kubeconfig or the in-cluster service account; ClusterError(code 2) if neither."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        config.load_kube_config()
    except (ConfigException, FileNotFoundError, TypeError) as kube_exc:
        try:
            config.load_incluster_config()
        except ConfigException:
            raise ClusterError(
                f"no Kubernetes cluster configured: no usable kubeconfig ({kube_exc}) and not running in a pod; "
                "set KUBECONFIG or use --local / --dry-run",
                code=2,
            ) from None
    return client.ApiClient()


def _check_argo(api_client: Any) -> None:
    from kubernetes import client
    from urllib3.exceptions import HTTPError as Urllib3Error

    host = api_client.configuration.host
    try:
        groups = client.ApisApi(api_client).get_api_versions(_request_timeout=10)
    except (Urllib3Error, OSError) as exc:
        raise ClusterError(f"Kubernetes API at {host} is unreachable: {exc}") from None
    except client.ApiException as exc:
        raise ClusterError(f"Kubernetes API at {host} refused the discovery request: {exc.status} {exc.reason}") from None
    served = {v.group_version for g in groups.groups for v in g.versions}
    if f"{GROUP}/{VERSION}" not in served:
        raise ClusterError(
            f"Argo Workflows CRDs are not installed on {host}: API {GROUP}/{VERSION} is not served "
            "(install Argo Workflows first)"
        )


def upsert_template(api: Any, namespace: str, body: dict) -> str:
    """Create the WorkflowTemplate, or replace it carrying the live resourceVersion. Returns the action."""
    from kubernetes import client

    name = body["metadata"]["name"]
    try:
        live = api.get_namespaced_custom_object(GROUP, VERSION, namespace, "workflowtemplates", name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, "workflowtemplates", body)
        return "created"
    body = {**body, "metadata": {**body["metadata"], "resourceVersion": live["metadata"]["resourceVersion"]}}
    api.replace_namespaced_custom_object(GROUP, VERSION, namespace, "workflowtemplates", name, body)
    return "updated"


def follow(core: Any, custom: Any, namespace: str, name: str, out: Callable[[str], None] = print,
           poll_s: float = 2.0) -> str:  # fmt: skip
    """Stream container `main` of every pod of workflow `name` (retries create new pods) until it ends."""
    from kubernetes import client

    selector = f"workflows.argoproj.io/workflow={name}"
    streaming: dict[str, threading.Thread] = {}

    def stream(pod: str) -> None:
        try:
            resp = core.read_namespaced_pod_log(pod, namespace, container="main", follow=True, _preload_content=False)
            for raw in resp.stream():
                for line in raw.decode("utf-8", "replace").splitlines():
                    out(f"{pod} {line}")
        except client.ApiException as exc:
            out(f"{pod} [log stream ended: {exc.status} {exc.reason}]")

    while True:
        for pod in core.list_namespaced_pod(namespace, label_selector=selector).items:
            statuses = pod.status.container_statuses or []
            started = any(s.name == "main" and (s.state.running or s.state.terminated) for s in statuses)
            if started and pod.metadata.name not in streaming:
                t = threading.Thread(target=stream, args=(pod.metadata.name,), daemon=True)
                streaming[pod.metadata.name] = t
                t.start()
        wf = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "workflows", name)
        phase = (wf.get("status") or {}).get("phase", "Pending")
        if phase in ("Succeeded", "Failed", "Error"):
            for t in streaming.values():
                t.join(timeout=30)
            out(f"{name} workflow {phase}")
            return phase
        time.sleep(poll_s)


# ---- CLI -----------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m workflows.submit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--folds", type=int, default=3, help="walk-forward folds to train (>= 1)")
    ap.add_argument("--namespace", default="alpha-rl", help="Kubernetes namespace (cluster mode)")
    ap.add_argument("--sha", help="git commit to run (default: HEAD; a dirty tree is refused)")
    ap.add_argument("--allow-dirty", action="store_true", help="run HEAD's sha with uncommitted changes")
    ap.add_argument("--image", help="trainer image (default: <registry>/alpha-rl-trainer:<sha>)")
    ap.add_argument("--registry", default=DEFAULT_REGISTRY, help="registry of the default image")
    ap.add_argument("--n-steps", type=int, help="env steps per fold (default: the preset's)")
    ap.add_argument("--n-backtests", type=int, help="parallel backtests (trainer --sim.n-envs; default: the preset's)")
    ap.add_argument("--per-capacity", type=int, help="replay capacity (trainer --replay.capacity; default: the preset's)")
    ap.add_argument("--data", help="data SPEC (default: synthetic)")
    ap.add_argument("--preset", choices=PRESET_NAMES,
                    help=f"trainer preset (default: the template's, {PARAMETER_DEFAULTS['preset']}; local: smoke)")
    ap.add_argument("--compile", choices=COMPILE_CHOICES,
                    help="torch.compile in the trainer's step (default: the preset's; 'autotune' on long GPU runs)")
    ap.add_argument("--fold-mode", choices=FOLD_MODES)
    ap.add_argument("--train-window", choices=TRAIN_WINDOWS,
                    help="trainer --folds.train-window: each fold trains on its own window (rolling, the default) or "
                         "on every row from the first window's start (anchored)")
    ap.add_argument("--seed", type=int, help="seed of the trainer (default: the preset's)")
    ap.add_argument("--device", choices=DEVICES, help="(local default: auto)")
    ap.add_argument("--gpu-pool", help="value of the node-pool label the train pods select")
    ap.add_argument("--pvc", help="PersistentVolumeClaim holding fxcache and runs")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print WorkflowTemplate + Workflow YAML, touch nothing")
    mode.add_argument("--local", action="store_true", help="run the DAG on this machine")
    ap.add_argument("--follow", action="store_true", help="stream all pods' logs until the workflow ends")
    ap.add_argument("--run-root", type=Path, default=Path("runs"), help="local stand-in for the PVC (--local)")
    ap.add_argument("--parallelism", type=int, default=2, help="concurrent local tasks (--local)")
    ap.add_argument("--memory-limit", type=int, metavar="BYTES", help="cgroup memory limit per train attempt (--local)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra env for local tasks")
    # issue 21: seed replicas and the control market (seeds_and_control)
    ap.add_argument("--seeds", type=int, default=1,
                    help="seeds per fold: seed index S trains with seed + S into <sha>/fold<N>/seed<S> (S >= 1)")
    ap.add_argument("--control", action=argparse.BooleanOptionalAction, default=None,
                    help="also train the same config on the control market (synthetic, signal=0) into "
                         "<sha>/control/ (default: on for synthetic data, off for real data)")
    return ap


def _run(ns: argparse.Namespace) -> int:
    if ns.folds < 1:
        raise ValueError(f"--folds must be >= 1, got {ns.folds}")
    if ns.parallelism < 1:
        raise ValueError(f"--parallelism must be >= 1, got {ns.parallelism}")
    env = {}
    for item in ns.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env wants KEY=VALUE, got {item!r}")
        env[key] = value
    if ns.local:
        ns.preset = ns.preset or "smoke"
        ns.device = ns.device or "auto"
    sha = resolve_sha(REPO_ROOT, ns.sha, ns.allow_dirty)
    if ns.allow_dirty and ns.sha is None:
        print(f"warning: running uncommitted changes under sha {sha}", file=sys.stderr)
    params = workflow_parameters(ns, sha)
    seeds, control, control_params, note = seeds_and_control(ns, params)
    params.update(control_params)
    # The DAG shape follows the fold mode (chain folds run one after another, each warm-starts from the last), the
    # seed count and the control market.
    template = render(fold_mode=ns.fold_mode or "independent", folds=ns.folds, seeds=seeds, control=control)
    workflow = build_workflow(params, ns.namespace, template["metadata"]["name"])

    if ns.dry_run:
        sys.stdout.write(yaml.safe_dump_all([template, workflow], sort_keys=False))
        return 0

    if ns.local:
        from workflows.local import LocalOptions, run_local

        opts = LocalOptions(
            run_root=ns.run_root, parallelism=ns.parallelism, memory_limit_bytes=ns.memory_limit, env=env
        )
        # SIGTERM (e.g. `timeout`) stops the local DAG like Ctrl-C: running tasks get SIGTERM + grace.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        print(note, flush=True)
        try:
            result = run_local(template, params, opts)
        except KeyboardInterrupt:
            print("local run interrupted; running tasks were stopped", file=sys.stderr)
            return 130
        print(f"local workflow {result.workflow_name}: {result.phase}; results in {Path(ns.run_root).resolve() / sha}")
        if result.succeeded:
            return 0
        code = result.failed_exit_code()
        return code if code in (2, 3) else 1

    from kubernetes import client

    api_client = _load_cluster()
    _check_argo(api_client)
    custom = client.CustomObjectsApi(api_client)
    template["metadata"]["namespace"] = ns.namespace
    try:
        action = upsert_template(custom, ns.namespace, template)
        created = custom.create_namespaced_custom_object(GROUP, VERSION, ns.namespace, "workflows", workflow)
    except client.ApiException as exc:
        raise ClusterError(f"Argo API error in namespace {ns.namespace!r}: {exc.status} {exc.reason}: {exc.body}") from None
    name = created["metadata"]["name"]
    print(f"workflowtemplate/{template['metadata']['name']} {action}")
    print(f"workflow/{name} created (git-sha {sha}, {ns.folds} folds; {note})")
    print(
        f"kubectl logs -f -n {ns.namespace} -l workflows.argoproj.io/workflow={name} -c main "
        "--prefix --max-log-requests 64"
    )
    if ns.follow:
        phase = follow(client.CoreV1Api(api_client), custom, ns.namespace, name)
        return 0 if phase == "Succeeded" else 1
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    ns = _parser().parse_args(None if argv is None else list(argv))
    try:
        return _run(ns)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except Exception as exc:  # the process edge: one clear line, mapped to the contract's exit codes
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exit_code_for(exc)


if __name__ == "__main__":
    raise SystemExit(main())
