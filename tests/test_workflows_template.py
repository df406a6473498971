"""The rendered alpha-rl WorkflowTemplate: golden YAML, Argo schemas, key allowlist, pod settings, k8s manifests."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from trainer.settings import PRESET_NAMES
from workflows import template as T
from workflows.expr import evaluate, retry_env
from workflows.submit import build_workflow

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "infra" / "k8s"


def _load(path: Path):
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@pytest.fixture(scope="module")
def crd_schemas(shared_data) -> dict[str, dict]:
    out = {}
    for kind, fname in (("WorkflowTemplate", "workflowtemplates-crd.yaml"), ("Workflow", "workflows-crd.yaml")):
        crd = _load(shared_data / "argo" / fname)
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
        out[kind] = version["schema"]["openAPIV3Schema"]
    return out


@pytest.fixture(scope="module")
def argo_json_schema(shared_data) -> dict:
    schema = json.loads((shared_data / "argo" / "schema.json").read_text())
    # schema.json types int-or-string as string only (README of the data); Kubernetes accepts both.
    schema["definitions"]["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["integer", "string"]}
    return schema


def unknown_keys(instance, schema: dict, path: str = "") -> list[str]:
    """Keys the structural schema does not declare. The API server prunes such keys silently, so a typo
    like `retryStratgy` passes validation and simply vanishes: this allowlist makes it an error."""
    found: list[str] = []
    if isinstance(instance, dict) and schema.get("type") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return found
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in instance.items():
            if props is not None and key in props:
                found += unknown_keys(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += unknown_keys(value, extra, f"{path}.{key}")
            elif props is not None:
                found.append(f"{path}.{key}")
    elif isinstance(instance, list) and "items" in schema:
        for i, item in enumerate(instance):
            found += unknown_keys(item, schema["items"], f"{path}[{i}]")
    return found


def _tpl(rendered: dict, name: str) -> dict:
    (t,) = [t for t in rendered["spec"]["templates"] if t["name"] == name]
    return t


# ---- golden YAML -----------------------------------------------------------------------------------


SHAPES = [("independent", None, 1, False), ("chain", T.CHAIN_EXAMPLE_FOLDS, 1, False),
          ("independent", None, 3, False), ("independent", None, 1, True), ("independent", None, 2, True),
          ("chain", T.CHAIN_EXAMPLE_FOLDS, 2, True)]
"""The DAG shapes (fold_mode, folds, seeds, control) every schema test runs on."""


@pytest.mark.parametrize(("path", "fold_mode", "folds", "seeds", "control"), [
    (T.RENDERED_PATH, "independent", None, 1, False),
    (T.RENDERED_CHAIN_PATH, "chain", T.CHAIN_EXAMPLE_FOLDS, 1, False),
    (T.RENDERED_SEEDS_CONTROL_PATH, "independent", None, T.SEEDS_EXAMPLE, True),
])
def test_committed_template_yaml_matches_the_hera_rendering(path, fold_mode, folds, seeds, control):
    committed = path.read_text()
    assert committed == T.render_yaml(T.DEFAULTS, fold_mode, folds, seeds, control), (
        f"{path.relative_to(ROOT)} differs from workflows/template.py; "
        "regenerate with `python -m workflows.template --write` and review the diff"
    )


def test_write_rendered_replaces_the_file_atomically(tmp_path):
    target = tmp_path / "argo" / "t.yaml"
    T.write_rendered(target)
    assert _load(target) == T.render()
    assert [p.name for p in target.parent.iterdir()] == ["t.yaml"]  # no temp file left behind


# ---- schemas and allowlist ---------------------------------------------------------------------------


@pytest.mark.parametrize(("fold_mode", "folds", "seeds", "control"), SHAPES)
def test_rendered_template_validates_against_the_workflowtemplate_crd(crd_schemas, fold_mode, folds, seeds, control):
    rendered = T.render(fold_mode=fold_mode, folds=folds, seeds=seeds, control=control)
    errors = [e.message for e in jsonschema.Draft7Validator(crd_schemas["WorkflowTemplate"]).iter_errors(rendered)]
    assert errors == []


@pytest.mark.parametrize(("fold_mode", "folds", "seeds", "control"), SHAPES)
def test_rendered_template_validates_against_argo_json_schema(argo_json_schema, fold_mode, folds, seeds, control):
    schema = {**argo_json_schema, "$ref": "#/definitions/io.argoproj.workflow.v1alpha1.WorkflowTemplate"}
    schema.pop("oneOf")
    rendered = T.render(fold_mode=fold_mode, folds=folds, seeds=seeds, control=control)
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(rendered)]
    assert errors == []


@pytest.mark.parametrize(("fold_mode", "folds", "seeds", "control"), SHAPES)
def test_rendered_template_uses_only_keys_the_crd_declares(crd_schemas, fold_mode, folds, seeds, control):
    rendered = T.render(fold_mode=fold_mode, folds=folds, seeds=seeds, control=control)
    assert unknown_keys(rendered, crd_schemas["WorkflowTemplate"]) == []


def test_allowlist_catches_a_typo_that_the_crd_schema_accepts(crd_schemas):
    bad = T.render()
    train = _tpl(bad, "train-fold")
    train["retryStratgy"] = train.pop("retryStrategy")
    train["container"]["volumeMount"] = train["container"].pop("volumeMounts")
    validator = jsonschema.Draft7Validator(crd_schemas["WorkflowTemplate"])
    assert list(validator.iter_errors(bad)) == []  # the schema alone lets both typos through
    assert unknown_keys(bad, crd_schemas["WorkflowTemplate"]) == [
        ".spec.templates[2].container.volumeMount",
        ".spec.templates[2].retryStratgy",
    ]


def test_crd_schema_rejects_a_wrong_type(crd_schemas):
    bad = T.render()
    _tpl(bad, "train-fold")["retryStrategy"]["limit"] = [5]
    assert list(jsonschema.Draft7Validator(crd_schemas["WorkflowTemplate"]).iter_errors(bad))


def test_submitted_workflow_validates_against_the_workflow_crd(crd_schemas):
    wf = build_workflow({"git-sha": "a" * 40, "folds": "3", "image": "r/alpha-rl-trainer:" + "a" * 40}, "alpha-rl")
    errors = [e.message for e in jsonschema.Draft7Validator(crd_schemas["Workflow"]).iter_errors(wf)]
    assert errors == []
    assert unknown_keys(wf, crd_schemas["Workflow"]) == []
    declared = {p["name"] for p in T.render()["spec"]["arguments"]["parameters"]}
    assert {p["name"] for p in wf["spec"]["arguments"]["parameters"]} <= declared


# ---- what the pods get -----------------------------------------------------------------------------


def test_dag_wires_features_then_one_train_task_per_fold_then_report():
    rendered = T.render()
    tasks = {t["name"]: t for t in _tpl(rendered, "main")["dag"]["tasks"]}
    assert set(tasks) == {"features", "train-fold", "report"}
    assert "depends" not in tasks["features"]
    assert tasks["train-fold"]["depends"] == "features"
    assert tasks["train-fold"]["withSequence"] == {"count": "{{workflow.parameters.folds}}"}
    assert tasks["train-fold"]["arguments"]["parameters"] == [{"name": "fold", "value": "{{item}}"}]
    assert tasks["report"]["depends"] == "train-fold"


def test_chain_shape_runs_the_folds_one_after_another_then_the_report():
    rendered = T.render(fold_mode="chain", folds=4)
    assert rendered["metadata"]["name"] == "alpha-rl-chain-4"
    tasks = _tpl(rendered, "main")["dag"]["tasks"]
    wiring = [(t["name"], t.get("depends"), t.get("arguments", {}).get("parameters")) for t in tasks]
    assert wiring == [
        ("features", None, None),
        ("train-fold-0", "features", [{"name": "fold", "value": "0"}]),
        ("train-fold-1", "train-fold-0", [{"name": "fold", "value": "1"}]),
        ("train-fold-2", "train-fold-1", [{"name": "fold", "value": "2"}]),
        ("train-fold-3", "train-fold-2", [{"name": "fold", "value": "3"}]),
        ("report", "train-fold-3", None),
    ]
    assert not any("withSequence" in t for t in tasks)
    assert {t["template"] for t in tasks if t["name"].startswith("train-fold")} == {"train-fold"}
    # the same pod template as the independent shape: only the wiring differs
    assert _tpl(rendered, "train-fold") == _tpl(T.render(), "train-fold")


def _wiring(rendered: dict) -> list[tuple]:
    return [(t["name"], t["template"], t.get("depends"),
             {p["name"]: p["value"] for p in t.get("arguments", {}).get("parameters", [])} or None,
             t.get("withSequence")) for t in _tpl(rendered, "main")["dag"]["tasks"]]


RUN = f"{T.DEFAULTS.mount_path}/{{{{workflow.parameters.git-sha}}}}"
SEQ = {"count": "{{workflow.parameters.folds}}"}


def _replica_args(fold: str, replica: int, market: str) -> dict:
    run_dir = RUN if market == "main" else f"{RUN}/control"
    data = "{{workflow.parameters.data}}" if market == "main" else "{{workflow.parameters.control-data}}"
    unit = "fold" if market == "main" else "control-fold"
    seed_dir, seed_unit = (f"/seed{replica}", f"-seed{replica}") if replica else ("", "")
    return {"fold": fold, "replica": str(replica), "run-dir": run_dir, "data": data,
            "fold-dir": f"{run_dir}/fold{fold}{seed_dir}", "unit": f"{unit}{fold}{seed_unit}"}


def test_seeds_and_control_fan_out_fold_x_seed_on_both_markets_all_before_the_report():
    rendered = T.render(seeds=3, control=True)
    assert rendered["metadata"]["name"] == "alpha-rl-seeds3-control"
    assert _wiring(rendered) == [
        ("features", "features", None, None, None),
        ("features-control", "features-control", None, None, None),
        ("train-fold", "train-fold", "features", {"fold": "{{item}}"}, SEQ),  # seed 0: today's task
        ("train-fold-seed1", "train-replica", "features", _replica_args("{{item}}", 1, "main"), SEQ),
        ("train-fold-seed2", "train-replica", "features", _replica_args("{{item}}", 2, "main"), SEQ),
        ("control-fold", "train-replica", "features-control", _replica_args("{{item}}", 0, "control"), SEQ),
        ("control-fold-seed1", "train-replica", "features-control", _replica_args("{{item}}", 1, "control"), SEQ),
        ("control-fold-seed2", "train-replica", "features-control", _replica_args("{{item}}", 2, "control"), SEQ),
        ("report", "report", "train-fold && train-fold-seed1 && train-fold-seed2 && control-fold && "
                             "control-fold-seed1 && control-fold-seed2", None, None),
    ]
    # seeds without control: no control market, no control-data parameter
    plain = T.render(seeds=2)
    assert [w[0] for w in _wiring(plain)] == ["features", "train-fold", "train-fold-seed1", "report"]
    assert "control-data" not in {p["name"] for p in plain["spec"]["arguments"]["parameters"]}


def test_chain_shape_with_seeds_and_control_chains_each_seed_of_each_market_separately():
    rendered = T.render(fold_mode="chain", folds=2, seeds=2, control=True)
    assert rendered["metadata"]["name"] == "alpha-rl-chain-2-seeds2-control"
    assert _wiring(rendered) == [
        ("features", "features", None, None, None),
        ("features-control", "features-control", None, None, None),
        ("train-fold-0", "train-fold", "features", {"fold": "0"}, None),
        ("train-fold-1", "train-fold", "train-fold-0", {"fold": "1"}, None),
        ("train-fold-0-seed1", "train-replica", "features", _replica_args("0", 1, "main"), None),
        ("train-fold-1-seed1", "train-replica", "train-fold-0-seed1", _replica_args("1", 1, "main"), None),
        ("control-fold-0", "train-replica", "features-control", _replica_args("0", 0, "control"), None),
        ("control-fold-1", "train-replica", "control-fold-0", _replica_args("1", 0, "control"), None),
        ("control-fold-0-seed1", "train-replica", "features-control", _replica_args("0", 1, "control"), None),
        ("control-fold-1-seed1", "train-replica", "control-fold-0-seed1", _replica_args("1", 1, "control"), None),
        ("report", "report", "train-fold-1 && train-fold-1-seed1 && control-fold-1 && control-fold-1-seed1",
         None, None),
    ]


def test_one_seed_without_control_renders_exactly_the_one_seed_shape():
    assert T.render(seeds=1, control=False) == T.render()
    assert T.render(fold_mode="chain", folds=3, seeds=1) == T.render(fold_mode="chain", folds=3)
    names = {t["name"] for t in T.render()["spec"]["templates"]}
    assert names == {"main", "features", "train-fold", "report"}


def test_train_replica_pod_is_the_train_pod_with_run_dir_data_and_seed_index_from_its_inputs():
    rendered = T.render(seeds=2, control=True)
    fold, rep = _tpl(rendered, "train-fold"), _tpl(rendered, "train-replica")
    for key in ("retryStrategy", "activeDeadlineSeconds", "nodeSelector", "tolerations", "podSpecPatch",
                "securityContext"):
        assert rep[key] == fold[key], key
    assert rep["container"]["resources"] == fold["container"]["resources"]
    assert [p["name"] for p in rep["inputs"]["parameters"]] == list(T.REPLICA_INPUTS)
    args = rep["container"]["args"]
    flags = dict(zip(args[1::2], args[2::2]))
    assert args[0] == "trainer.train"
    assert flags["--run-dir"] == "{{inputs.parameters.run-dir}}" and flags["--data"] == "{{inputs.parameters.data}}"
    assert flags["--replica"] == "{{inputs.parameters.replica}}" and flags["--fold"] == "{{inputs.parameters.fold}}"
    assert flags["--seed"] == "{{workflow.parameters.seed}}"  # the trainer adds the seed index
    assert flags["--fxcache"] == f"{T.DEFAULTS.mount_path}/fxcache"
    assert flags["--compile-cache"] == f"{T.DEFAULTS.mount_path}/inductor-cache"
    fold_args = fold["container"]["args"]
    same = {k: v for k, v in zip(fold_args[1::2], fold_args[2::2]) if k not in ("--run-dir", "--data", "--fold")}
    assert {k: flags[k] for k in same} == same  # every other flag as train-fold passes it
    env = {e["name"]: e["value"] for e in rep["container"]["env"]}
    assert env["ALPHA_RL_FOLD_DIR"] == "{{inputs.parameters.fold-dir}}"
    assert rep["synchronization"] == {"mutexes": [{"name": "alpha-rl-{{workflow.parameters.git-sha}}-"
                                                           "{{inputs.parameters.unit}}"}]}
    feats = _tpl(rendered, "features-control")["container"]["args"]
    assert feats == ["--data", "{{workflow.parameters.control-data}}",
                     "--cache-dir", f"{T.DEFAULTS.mount_path}/fxcache"]


def test_control_data_parameter_defaults_to_the_control_of_the_default_data_spec():
    from trainer.data.spec import control_spec

    params = {p["name"]: p.get("value") for p in T.render(control=True)["spec"]["arguments"]["parameters"]}
    assert params["control-data"] == control_spec(params["data"]) == "synthetic:signal=0"


@pytest.mark.parametrize(("seeds", "match"), [(0, "seeds"), (True, "seeds"), ("2", "seeds")])
def test_a_bad_seed_count_is_refused_naming_it(seeds, match):
    with pytest.raises(ValueError, match=match):
        T.render(seeds=seeds)


def test_each_shape_pins_the_fold_mode_and_chain_also_the_fold_count_by_enum():
    def pinned(rendered):
        return {p["name"]: p["enum"] for p in rendered["spec"]["arguments"]["parameters"] if "enum" in p}

    assert pinned(T.render()) == {"fold-mode": ["independent"]}
    assert pinned(T.render(fold_mode="chain", folds=2)) == {"folds": ["2"], "fold-mode": ["chain"]}
    chain = {p["name"]: p.get("value") for p in T.render(fold_mode="chain", folds=2)["spec"]["arguments"]["parameters"]}
    assert chain["fold-mode"] == "chain" and chain["folds"] == "2"


@pytest.mark.parametrize(("fold_mode", "folds", "match"), [("chained", 3, "fold_mode"), ("chain", None, "folds"),
                                                           ("chain", 0, "folds"), ("chain", True, "folds")])
def test_a_bad_shape_is_refused_naming_the_argument(fold_mode, folds, match):
    with pytest.raises(ValueError, match=match):
        T.render(fold_mode=fold_mode, folds=folds)


def test_submit_dry_run_in_chain_mode_prints_the_chain_shape_and_a_workflow_referencing_it():
    proc = subprocess.run([sys.executable, "-m", "workflows.submit", "--folds", "2", "--sha", "feedbee1234",
                           "--fold-mode", "chain", "--dry-run"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    template, workflow = yaml.safe_load_all(proc.stdout)
    assert template == T.render(fold_mode="chain", folds=2, control=True)  # synthetic data: control by default
    assert workflow["spec"]["workflowTemplateRef"] == {"name": "alpha-rl-chain-2-control"}
    params = {p["name"]: p["value"] for p in workflow["spec"]["arguments"]["parameters"]}
    assert params["fold-mode"] == "chain" and params["folds"] == "2"


def test_pod_defaults_are_set_once_and_cannot_be_overridden_per_template():
    rendered = T.render()
    shared = ("image", "imagePullPolicy", "volumeMounts", "securityContext")
    containers = [_tpl(rendered, n)["container"] for n in ("features", "train-fold", "report")]
    for key in shared:
        assert containers[0][key] == containers[1][key] == containers[2][key], key
    assert containers[1]["env"][: len(containers[0]["env"])] == containers[0]["env"] == containers[2]["env"]
    for key in ("securityContext", "serviceAccountName", "retryStrategy", "podSpecPatch"):
        assert _tpl(rendered, "features")[key] == _tpl(rendered, "train-fold")[key] == _tpl(rendered, "report")[key]
    with pytest.raises(ValueError, match=r"\['retry_strategy'\] are pod defaults set once"):
        T._pod(T.DEFAULTS, "x", ["true"], [], deadline_s=1, resources=None, retry_strategy=None)


def test_parameters_and_defaults_match_the_issue():
    params = {p["name"]: p.get("value") for p in T.render()["spec"]["arguments"]["parameters"]}
    assert params["git-sha"] is None  # required
    assert params["folds"] == "3" and params["gpu-pool"] == "ci-training-h100"
    # sizes and seed are the preset's ("" is dropped by workflows.launch), not copies of its values
    assert params["n-steps"] == params["n-backtests"] == params["per-capacity"] == params["seed"] == ""
    assert params["preset"] in PRESET_NAMES
    assert {"image", "pool-label-key", "data", "pvc", "fold-mode"} <= set(params)


def test_train_pod_lands_on_the_gpu_pool_with_guaranteed_memory_and_one_gpu():
    train = _tpl(T.render(), "train-fold")
    assert train["nodeSelector"] == {"{{workflow.parameters.pool-label-key}}": "{{workflow.parameters.gpu-pool}}"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in train["tolerations"]
    res = train["container"]["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "1"
    assert res["requests"]["memory"] == res["limits"]["memory"] == T.DEFAULTS.train_memory


def test_train_run_path_uses_only_sha_and_fold_so_retries_find_checkpoints():
    train = _tpl(T.render(), "train-fold")
    args = train["container"]["args"]
    mount = T.DEFAULTS.mount_path
    assert args[args.index("--run-dir") + 1] == f"{mount}/{{{{workflow.parameters.git-sha}}}}"
    env = {e["name"]: e["value"] for e in train["container"]["env"]}
    assert env["ALPHA_RL_FOLD_DIR"] == f"{mount}/{{{{workflow.parameters.git-sha}}}}/fold{{{{inputs.parameters.fold}}}}"
    text = json.dumps(train)
    assert "workflow.name" not in text and "pod.name" not in text and "node.name" not in text
    assert args[args.index("--attempt") + 1] == "{{retries}}"
    assert {"name": "runs", "mountPath": mount} in train["container"]["volumeMounts"]


def test_every_container_mounts_the_pvc_explicitly():
    rendered = T.render()
    (claim,) = [v for v in rendered["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"]["claimName"] == "{{workflow.parameters.pvc}}"
    for name in ("features", "train-fold", "report"):
        mounts = _tpl(rendered, name)["container"]["volumeMounts"]
        assert {"name": claim["name"], "mountPath": T.DEFAULTS.mount_path} in mounts


# (exit code, node status, message) after a failed attempt -> retried? Written from the process contract in
# DESIGN.md, not from RETRY_EXPRESSION: 2 and 3 never, 137 / 143 / other exits and lost pods always.
RETRY_VERDICTS = [
    (2, "Failed", "Error (exit code 2)", False),
    (3, "Failed", "Error (exit code 3)", False),
    (137, "Failed", "OOMKilled (exit code 137)", True),
    (143, "Failed", "Error (exit code 143)", True),
    (1, "Failed", "Error (exit code 1)", True),
    (None, "Error", "pod deleted", True),
]


def test_retry_strategy_is_always_with_limit_backoff_and_a_rendered_expression_that_keeps_the_contract():
    for name in ("features", "train-fold", "report"):
        rs = _tpl(T.render(), name)["retryStrategy"]
        assert rs["retryPolicy"] == "Always"
        assert rs["limit"] == 5
        assert rs["backoff"] == {"duration": "30s", "factor": 2, "cap": "10m", "maxDuration": "2h"}
        verdicts = [(code, status, message, evaluate(rs["expression"], retry_env(code, status, message, 12.0)))
                    for code, status, message, _ in RETRY_VERDICTS]
        assert verdicts == RETRY_VERDICTS, name


def test_per_fold_mutex_deadlines_pod_gc_and_grace_period():
    rendered = T.render()
    train = _tpl(rendered, "train-fold")
    assert train["synchronization"] == {
        "mutexes": [{"name": "alpha-rl-{{workflow.parameters.git-sha}}-fold{{inputs.parameters.fold}}"}]
    }
    assert train["activeDeadlineSeconds"] == T.DEFAULTS.train_deadline_s
    assert rendered["spec"]["activeDeadlineSeconds"] == T.DEFAULTS.workflow_deadline_s
    assert rendered["spec"]["podGC"] == {"strategy": "OnPodSuccess"}
    assert json.loads(train["podSpecPatch"]) == {"terminationGracePeriodSeconds": T.DEFAULTS.termination_grace_s}


def test_pods_are_hardened_and_have_no_sidecars():
    rendered = T.render()
    assert rendered["spec"]["serviceAccountName"] == T.DEFAULTS.service_account
    for name in ("features", "train-fold", "report"):
        t = _tpl(rendered, name)
        sc = t["container"]["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
        assert t["securityContext"]["runAsNonRoot"] is True
        mounts = {m["mountPath"]: m["name"] for m in t["container"]["volumeMounts"]}
        assert "/tmp" in mounts and "/dev/shm" in mounts
        assert t["serviceAccountName"] == T.DEFAULTS.service_account
        assert "sidecars" not in t and "initContainers" not in t
    vols = {v["name"]: v for v in rendered["spec"]["volumes"]}
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory" and "emptyDir" in vols["tmp"]


def test_template_config_refuses_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="retry_limit"):
        T.TemplateConfig(retry_limit=-1)
    with pytest.raises(ValueError, match="mount_path"):
        T.TemplateConfig(mount_path="/tmp")
    with pytest.raises(ValueError, match="train_deadline_s"):
        T.TemplateConfig(train_deadline_s=0)


def test_builders_take_the_command_so_tests_reuse_the_same_structure():
    cfg = T.TemplateConfig(backoff_duration="1s")
    custom = T.train_fold_template(cfg, command=["python", "-c", "pass"], args=["{{inputs.parameters.fold}}"])
    rendered = T.render(cfg, train_fold=custom)
    train = _tpl(rendered, "train-fold")
    assert train["container"]["command"] == ["python", "-c", "pass"]
    assert train["retryStrategy"]["backoff"]["duration"] == "1s"
    assert train["synchronization"] == _tpl(T.render(), "train-fold")["synchronization"]


# ---- infra/k8s manifests ---------------------------------------------------------------------------


def _k8s_docs() -> list[tuple[Path, dict]]:
    return [(p, d) for p in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def test_k8s_manifests_pass_kubernetes_validate_strict():
    import kubernetes_validate

    kinds = set()
    for path, doc in _k8s_docs():
        kubernetes_validate.validate(doc, "1.30", strict=True)
        kinds.add(doc["kind"])
    assert kinds == {"Namespace", "PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding"}


def test_kubernetes_validate_strict_rejects_an_unknown_field():
    import kubernetes_validate

    (pvc,) = [d for _, d in _k8s_docs() if d["kind"] == "PersistentVolumeClaim"]
    bad = copy.deepcopy(pvc)
    bad["spec"]["accesModes"] = bad["spec"].pop("accessModes")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30", strict=True)


def test_kubernetes_validate_works_without_network():
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace here (needs unshare and CAP_SYS_ADMIN)")
    cli = Path(sys.executable).with_name("kubernetes-validate")
    proc = subprocess.run(
        [unshare, "-n", str(cli), "--strict", *map(str, sorted(K8S.glob("*.yaml")))], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("passed") == 5


def test_pvc_is_read_write_many_and_rbac_is_least_privilege():
    docs = {d["kind"]: d for _, d in _k8s_docs()}
    assert docs["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert docs["PersistentVolumeClaim"]["metadata"]["name"] == T.PARAMETER_DEFAULTS["pvc"]
    assert docs["Role"]["rules"] == [
        {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]}
    ]
    assert docs["ServiceAccount"]["metadata"]["name"] == T.DEFAULTS.service_account
    assert docs["RoleBinding"]["subjects"][0]["name"] == T.DEFAULTS.service_account
